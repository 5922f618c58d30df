"""The Python API: `mlxspec.load(...)` once, then `Speculator.generate` or `Speculator.stream` (speculator.py)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from mlxspec.errors import UserError
from mlxspec.loading import DEFAULT_DRAFT, DEFAULT_TARGET, load_model
from mlxspec.options import DecodeOptions
from mlxspec.results import GenerationResult
from mlxspec.speculator import Speculator, describe_drafter

__all__ = ["SlowBLASWarning", "Speculator", "describe_drafter", "generate", "load", "warn_if_slow_blas"]


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
) -> Speculator:
    """Load a target and a drafter once.

    draft="auto": the embedded draft with the embedded target; with any other target no draft model, and prompt
    lookup drafts instead (free, and skipped where it cannot pay). draft=None: no drafter unless options ask.
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
    if draft == "auto":
        draft = DEFAULT_DRAFT if model is None and not heads_given else None
        if draft is None and not heads_given and not options.lookup:
            options = options.updated(lookup=True)
    draft_model = load_model(draft, quantize_bits=draft_bits) if draft is not None else None
    heads = None
    if medusa is not None:
        from mlxspec.drafting.medusa import load_medusa

        heads = load_medusa(medusa, target.path)
    feature_head = None
    if eagle is not None:
        from mlxspec.drafting.eagle3_files import load_eagle_head

        feature_head = load_eagle_head(eagle, target)
    elif mtp not in (None, False):
        from mlxspec.drafting.mtp_weights import load_mtp_head

        # In the checkpoint's own precision unless asked: a quantized head drafts faster but is accepted far less.
        feature_head = load_mtp_head(target, None if mtp is True else mtp, bits=mtp_bits)
    block_drafter = None
    if dflash is not None:
        from mlxspec.drafting.dflash_files import load_dflash

        block_drafter = load_dflash(dflash, target)
    warn_if_slow_blas()
    return Speculator(
        target,
        draft_model,
        medusa=heads,
        options=options,
        feature_head=feature_head,
        prompt_cache=prompt_cache,
        sharding=sharding,
        dflash=block_drafter,
    )


def generate(
    prompt: str | list[int], model: str | Path | None = None, draft: str | Path | None = "auto", **kwargs: Any
) -> GenerationResult:
    """One-shot convenience: load (with any of load's keywords), then generate (with any DecodeOptions field)."""
    load_kwargs = {k: kwargs.pop(k) for k in LOAD_KEYS if k in kwargs}
    return load(model, draft, **load_kwargs).generate(prompt, **kwargs)
