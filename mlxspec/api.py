"""The Python API: `mlxspec.load(...)` once, then `Speculator.generate` or `Speculator.stream` (speculator.py)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mlxspec.errors import UserError
from mlxspec.loading import DEFAULT_DRAFT, DEFAULT_TARGET, LoadedModel, embedded_or, load_model
from mlxspec.options import DecodeOptions
from mlxspec.results import GenerationResult
from mlxspec.speculator import Speculator, describe_drafter

__all__ = [
    "Drafters",
    "SlowBLASWarning",
    "Speculator",
    "describe_drafter",
    "generate",
    "load",
    "load_drafters",
    "speculator_with",
    "warn_if_slow_blas",
]


class SlowBLASWarning(RuntimeWarning):
    """MLX runs on the stock Linux wheel's reference BLAS, where verifying k tokens costs k times one."""


_warned_blas = False


def warn_if_slow_blas() -> None:
    """Once per process: say how to get a fast BLAS where MLX runs on reference BLAS (about 30% slower and worse)."""
    global _warned_blas
    if _warned_blas:
        return
    _warned_blas = True
    from mlxspec.platform import fast_blas_hint

    hint = fast_blas_hint()
    if hint:
        warnings.warn(hint, SlowBLASWarning, stacklevel=3)


LOAD_KEYS = (
    "num_draft",
    "quantize_target",
    "kv_bits",
    "draft_window",
    "medusa",
    "draft_bits",
    "draft_vocab",
    "eagle",
    "mtp",
    "mtp_bits",
    "dflash",
    "prompt_cache",
    "distributed",
)


def load(
    model: str | Path | None = None,
    draft: str | Path | None = "auto",
    num_draft: int | str | None = None,
    quantize_target: int | None = None,
    kv_bits: int | None = None,
    draft_window: int | None = None,
    medusa: str | Path | None = None,
    options: DecodeOptions | None = None,
    draft_bits: int | None = None,
    eagle: str | Path | None = None,
    mtp: str | Path | bool | None = None,
    prompt_cache: int = 0,
    distributed: str | None = None,
    dflash: str | Path | None = None,
    mtp_bits: int | None = None,
    draft_vocab: int | None = None,
) -> Speculator:
    """Load a target and a drafter once.

    draft="auto": the embedded draft with the embedded target; with any other target the best drafter the local
    Hugging Face cache holds for it (a DFlash, EAGLE-3 or EAGLE head made for it, its own MTP head, a smaller model
    with its tokenizer; drafting/discovery.py, nothing downloaded), else prompt lookup (free, and skipped where it
    cannot pay); `Speculator.drafter_choice` says what was picked and why. draft=None: no drafter unless options
    ask.
    `options` are the default DecodeOptions of every call; num_draft, kv_bits and draft_window, where given, replace
    theirs (None keeps what `options` say; without `options`, num_draft is "auto"). eagle: a directory written
    by `train-heads --kind eagle`, or a published EAGLE-3 head (SafeAILab's or vLLM speculators' format; a directory
    or Hugging Face repo); mtp: True for the native MTP head in the model's own files, or a directory or
    repo of the original checkpoint that holds it; the head keeps the checkpoint's precision unless mtp_bits (4 or
    8) quantizes it, which costs acceptance (MTPLX measured MoE acceptance fall from ~80% to 5-11% at 4 bits).
    dflash: a DFlash block drafter's directory or Hugging Face repo (z-lab's, or one written by `train-heads --kind
    dflash`). prompt_cache=N: keep the caches of the last N runs, so a next prompt sharing a prefix with one of them
    (a conversation) prefills only the rest. distributed="tensor" or "pipeline": under `mlx.launch`, split the
    target across the ranks (the drafter is replicated; -k auto becomes 4,
    since each rank would measure its own cost curve).
    """
    if options is not None and not isinstance(options, DecodeOptions):
        raise UserError(f"options {options!r} is a {type(options).__name__}; pass a DecodeOptions")
    draft = embedded_or(draft, "draft")
    medusa, eagle, dflash = embedded_or(medusa, "medusa"), embedded_or(eagle, "eagle"), embedded_or(dflash, "dflash")
    given = {"num_draft": num_draft, "kv_bits": kv_bits, "draft_window": draft_window}
    options = (options or DecodeOptions()).updated(**{k: v for k, v in given.items() if v is not None}).validate()
    for name, bits in (("quantize_target", quantize_target), ("draft_bits", draft_bits), ("mtp_bits", mtp_bits)):
        if bits not in (None, 4, 8):
            raise UserError(f"{name} {bits!r} is not supported; use 4 or 8")
    heads_given = [
        n for n, x in (("medusa", medusa), ("eagle", eagle), ("mtp", mtp), ("dflash", dflash)) if x not in (None, False)
    ]
    if draft not in (None, "auto"):
        heads_given.insert(0, "draft")
    if len(heads_given) > 1:
        raise UserError(f"{heads_given[0]} and {heads_given[1]} are two drafters; pass one of them")
    if mtp_bits is not None and mtp in (None, False):
        raise UserError(f"mtp_bits {mtp_bits} quantizes an MTP head, and this run has none; pass mtp too")
    if dflash is not None and distributed == "pipeline":
        raise UserError("--dflash taps layers that a pipeline split spreads over ranks; use --distributed tensor")
    sharding = None
    if distributed is not None:
        from mlxspec.distributed import start

        sharding = start(distributed)
        if options.adaptive:
            options = options.updated(num_draft=4)
    shard = sharding.shard if sharding else None
    target = load_model(DEFAULT_TARGET if model is None else model, quantize_bits=quantize_target, shard=shard)
    choice = None
    if draft == "auto":
        # the embedded target, also when named by its path, drafts with the embedded draft
        embedded = model is None or Path(target.path).resolve() == Path(DEFAULT_TARGET).resolve()
        draft = DEFAULT_DRAFT if embedded and not heads_given else None
        if not embedded and not heads_given and sharding is None:
            choice = _auto_drafter(target, str(model), draft_bits, draft_vocab)
            if choice.chosen is not None:
                return _speculator(target, choice, options, prompt_cache, sharding)
        if draft is None and not heads_given and not options.lookup:
            options = options.updated(lookup=True)
    drafters = load_drafters(target, draft, draft_bits, medusa, eagle, mtp, mtp_bits, dflash, draft_vocab)
    return _speculator(target, choice, options, prompt_cache, sharding, drafters=drafters)


def load_drafters(
    target, draft=None, draft_bits=None, medusa=None, eagle=None, mtp=None, mtp_bits=None, dflash=None, draft_vocab=None
) -> Drafters:
    """The drafter named (at most one) for an already loaded target: `mlxspec tune` builds one Speculator per
    drafter around one target this way."""
    return Drafters(
        draft=load_draft(draft, draft_bits, draft_vocab) if draft is not None else None,
        medusa=_load_medusa(medusa, target) if medusa is not None else None,
        feature_head=_load_feature_head(eagle, mtp, mtp_bits, target),
        dflash=_load_dflash(dflash, target) if dflash is not None else None,
    )


@dataclass
class Drafters:
    """The drafter objects one Speculator is built with (at most one is set)."""

    draft: Any = None
    medusa: Any = None
    feature_head: Any = None
    dflash: Any = None


def _load_medusa(source, target):
    from mlxspec.drafting.heads.medusa import load_medusa

    return load_medusa(source, target.path)


def _load_feature_head(eagle, mtp, mtp_bits, target):
    if eagle is not None:
        from mlxspec.drafting.eagle3.files import load_eagle_head

        return load_eagle_head(eagle, target)
    if mtp not in (None, False):
        from mlxspec.drafting.heads.mtp_weights import load_mtp_head

        # In the checkpoint's own precision unless asked: a quantized head drafts faster but is accepted far less.
        return load_mtp_head(target, None if mtp is True else mtp, bits=mtp_bits)
    return None


def _load_dflash(source, target):
    from mlxspec.drafting.dflash.files import load_dflash

    return load_dflash(source, target)


def load_draft(name, bits: int | None = None, vocab: int | None = None) -> LoadedModel:
    """A draft model, at `bits` where given (a quantized one re-quantized where it holds more), its output layer cut
    to its `vocab` hot tokens where given (hot_vocabulary.py). Either changes the draft's guesses and cost, never
    the output; `variant` says which was done (its cost curve is kept apart)."""
    draft = load_model(name, quantize_bits=bits, requantize=True)
    if vocab is None or vocab >= draft.vocab_size:
        return draft
    from mlxspec.drafting.draft_model.hot_vocabulary import hot_vocabulary, with_hot_vocabulary

    ids = hot_vocabulary(draft.tokenizer, draft.vocab_size, vocab)
    model = with_hot_vocabulary(draft.model, ids, draft.vocab_size)
    return replace(draft, model=model, variant=", ".join(x for x in (draft.variant, f"vocab {vocab}") if x))


def _auto_drafter(target, name: str, draft_bits: int | None, draft_vocab: int | None = None):
    """--draft auto for a target of the user's own: the best drafter the local Hugging Face cache holds for it
    (discovery.py), loaded; a choice that fails to load is passed over, down to prompt lookup."""
    from mlxspec.drafting.discovery import ENTRY_ERRORS, AutoChoice, find_drafters

    candidates = find_drafters(target.path, name)
    skipped = []
    for candidate in (c for c in candidates if c.matches):
        try:
            drafters = Drafters()
            if candidate.kind == "dflash":
                drafters.dflash = _load_dflash(candidate.path, target)
            elif candidate.kind in ("eagle", "eagle3"):
                drafters.feature_head = _load_feature_head(candidate.path, None, None, target)
            elif candidate.kind == "mtp":
                source = True if candidate.path == target.path else candidate.path
                drafters.feature_head = _load_feature_head(None, source, None, target)
            else:
                drafters.draft = load_draft(candidate.path, draft_bits, draft_vocab)
            return AutoChoice(candidate, candidates, skipped, drafters)
        except ENTRY_ERRORS as error:  # a partial download, a format we refuse: say so and try the next
            reason = str(error).split(";")[0] if isinstance(error, UserError) else type(error).__name__
            skipped.append(f"{candidate.source}: {reason}")
    return AutoChoice(None, candidates, skipped, None)


def speculator_with(target, drafters: Drafters, options: DecodeOptions | None = None) -> Speculator:
    """A Speculator around an already loaded target and drafters (sharing the target's weights and views)."""
    return _speculator(target, None, (options or DecodeOptions()).validate(), 0, None, drafters=drafters)


def _speculator(target, choice, options, prompt_cache, sharding, drafters=None) -> Speculator:
    drafters = drafters or choice.drafters
    warn_if_slow_blas()
    return Speculator(
        target,
        drafters.draft,
        medusa=drafters.medusa,
        options=options,
        feature_head=drafters.feature_head,
        prompt_cache=prompt_cache,
        sharding=sharding,
        dflash=drafters.dflash,
        drafter_choice=choice.to_dict() if choice is not None else None,
    )


def generate(
    prompt: str | list[int], model: str | Path | None = None, draft: str | Path | None = "auto", **kwargs: Any
) -> GenerationResult:
    """One-shot convenience: load (with any of load's keywords), then generate (with any DecodeOptions field)."""
    load_kwargs = {k: kwargs.pop(k) for k in LOAD_KEYS if k in kwargs}
    return load(model, draft, **load_kwargs).generate(prompt, **kwargs)
