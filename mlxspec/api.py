"""The Python API: `mlxspec.load(...)` once, then `Speculator.generate` or `Speculator.stream`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import mlx.core as mx

from .drafters import Drafter, DraftModelDrafter, LookupThenModelDrafter, PromptLookupDrafter
from .engine import SpeculativeEngine
from .errors import UserError
from .loading import DEFAULT_DRAFT, DEFAULT_TARGET, LoadedModel, check_compatible, load_model
from .sampling import SamplingConfig
from .text import TextStream

MAX_NUM_DRAFT = 64
ADAPTIVE_MAX_DRAFT = 8  # the longest chain the adaptive controller may choose


@dataclass
class Stats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    drafted: int = 0  # tokens (chains) or nodes (trees) proposed
    accepted: int = 0
    tree_nodes: int = 0  # nodes verified per step by tree drafts (0 for chains)
    note: str = ""  # why mlxspec decoded plainly instead of speculating, if it did
    prompt_seconds: float = 0.0
    generation_seconds: float = 0.0
    peak_memory_bytes: int = 0

    @property
    def acceptance_rate(self) -> float:
        """alpha: the fraction of drafted tokens the target accepted."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_target_call(self) -> float:
        """tau: generated tokens per target forward pass (1.0 for plain decoding)."""
        return self.generated_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.generation_seconds if self.generation_seconds else 0.0

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        for name in ("acceptance_rate", "tokens_per_target_call", "tokens_per_second", "prompt_tokens_per_second"):
            out[name] = getattr(self, name)
        return out


@dataclass
class Chunk:
    """One streamed piece: the text and tokens accepted in a step."""

    text: str
    tokens: list[int]
    finish_reason: str | None = None  # "stop" (EOS or a stop string), "length", or None while running


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    stats: Stats = field(default_factory=Stats)
    finish_reason: str | None = None


def _check_num_draft(num_draft: int | str) -> None:
    if num_draft == "auto":
        return
    if not isinstance(num_draft, int) or not 1 <= num_draft <= MAX_NUM_DRAFT:
        raise UserError(
            f"num_draft {num_draft} is outside 1..{MAX_NUM_DRAFT}; 4 is a good start, or 'auto' to adapt it"
        )


class Speculator:
    """A loaded target (and optional draft) ready for repeated generation."""

    def __init__(
        self,
        target: LoadedModel,
        draft: LoadedModel | None = None,
        num_draft: int | str = "auto",
        kv_bits: int | None = None,
        draft_window: int | None = None,
        medusa=None,
    ):
        _check_num_draft(num_draft)
        if draft is not None:
            check_compatible(target, draft)
        self.target = target
        self.draft = draft
        self.num_draft = num_draft
        self.kv_bits = kv_bits
        if draft_window is not None and draft_window < 1:
            raise UserError(f"draft_window {draft_window} must be at least 1 token")
        self.draft_window = draft_window
        self.medusa = medusa  # MedusaHeads or None
        self._successors = None  # prompt lookup's corpus table, loaded on first use
        self.last_stats = Stats()

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def encode(self, prompt: str | list[int], chat: bool = False) -> list[int]:
        if isinstance(prompt, list):
            tokens = list(prompt)
        else:
            if not prompt:
                raise UserError("the prompt is empty; pass some text to continue")
            if chat:
                if not getattr(self.tokenizer, "chat_template", None):
                    raise UserError(f"'{self.target.path}' has no chat template; drop --chat")
                tokens = self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": prompt}], add_generation_prompt=True
                )
            else:
                tokens = self.tokenizer.encode(prompt)
        if not tokens:
            raise UserError("the prompt encodes to no tokens; pass some text to continue")
        context = self.target.context_length
        if context is not None and len(tokens) > context:
            raise UserError(f"the prompt has {len(tokens)} tokens but the model's context is {context}; shorten it")
        return tokens

    def stream(
        self,
        prompt: str | list[int],
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        num_draft: int | str | None = None,
        seed: int = 0,
        stop: list[str] | None = None,
        chat: bool = False,
        use_draft: bool = True,
        stop_at_eos: bool = True,
        tree_topk: int = 1,
        tree_nodes: int | None = None,
        lookup: bool = False,
        lookup_candidates: int = 1,
        corpus_fallback: bool = True,
        heal: bool = False,
    ) -> Iterator[Chunk]:
        """Yield text as the target accepts it. Stats of the run land in `self.last_stats` as it goes.

        tree_topk > 1 drafts a tree with the draft model (top-k alternatives at each depth); tree_nodes caps its
        nodes. lookup=True drafts by prompt lookup, falling back to the draft model when the text does not repeat;
        lookup_candidates > 1 verifies that many distinct continuations as one tree; corpus_fallback lets lookup guess
        one token from a stdlib bigram table where nothing matches.
        heal=True backs the prompt up one token and makes the first token extend it (token healing).
        """
        sampling = SamplingConfig(temperature, top_p, top_k, min_p)
        sampling.validate()
        num_draft = self.num_draft if num_draft is None else num_draft
        _check_num_draft(num_draft)
        adaptive = num_draft == "auto"
        num_draft = ADAPTIVE_MAX_DRAFT if adaptive else num_draft
        if max_tokens < 1:
            raise UserError(f"max_tokens {max_tokens} must be at least 1")
        if tree_topk < 1 or (tree_nodes is not None and tree_nodes < tree_topk):
            raise UserError(f"tree_topk {tree_topk} must be >= 1 and tree_nodes {tree_nodes} >= tree_topk")
        if tree_nodes:
            num_draft = max(1, tree_nodes // tree_topk)  # the tree's depth
        tokens = self.encode(prompt, chat)
        healed_text, first_token_mask = "", None
        if heal:
            from .healing import heal as heal_prompt

            tokens, healed_text, first_token_mask = heal_prompt(self.tokenizer, tokens)
        stops = list(stop or [])

        if lookup_candidates < 1:
            raise UserError(f"lookup_candidates {lookup_candidates} must be at least 1; 1 drafts a single chain")
        drafter = self._make_drafter(
            sampling, num_draft, use_draft, tree_topk, lookup, lookup_candidates, corpus_fallback
        )
        controller = None
        if adaptive and isinstance(drafter, DraftModelDrafter) and tree_topk == 1:
            controller = self.draft_length_controller(num_draft)
        engine = SpeculativeEngine(
            self.target.model,
            drafter,
            sampling,
            num_draft=num_draft,
            seed=seed,
            kv_bits=self.kv_bits,
            context_length=self.target.context_length,
            max_nodes=num_draft * max(tree_topk, lookup_candidates if lookup else 1),
            controller=controller,
        )
        engine.first_token_mask = first_token_mask
        stats = self.last_stats = Stats(prompt_tokens=len(tokens))
        if controller is not None and not controller.can_win:
            stats.note = "verification costs too much on this device for drafting to pay; decoding plainly"
        mx.reset_peak_memory()
        start = time.perf_counter()
        engine.prefill(tokens)
        stats.prompt_seconds = time.perf_counter() - start

        text = TextStream(self.tokenizer, stops, stop_at_eos, skip=len(healed_text))
        start = time.perf_counter()
        finish = None
        while finish is None:
            step = engine.step(max_tokens - stats.generated_tokens)
            stats.target_calls = engine.target_calls
            stats.drafted += step.drafted
            stats.accepted += step.accepted
            stats.tree_nodes = max(stats.tree_nodes, step.drafted + 1 if tree_topk > 1 else 0)
            new_tokens, saw_eos = text.cut_at_eos(step.tokens)
            stats.generated_tokens += len(new_tokens)
            room = engine.room()  # positions left in the target's context after the pending token
            if saw_eos:
                finish = "stop"
            elif stats.generated_tokens >= max_tokens or (room is not None and room < 0):
                finish = "length"
            piece, stopped = text.add(new_tokens, final=finish is not None)
            finish = "stop" if stopped else finish
            stats.generation_seconds = time.perf_counter() - start
            stats.draft_calls = drafter.calls if drafter is not None else 0
            stats.peak_memory_bytes = mx.get_peak_memory()
            yield Chunk(piece, new_tokens, finish)

    def draft_length_controller(self, max_draft: int):
        """Adaptive draft length from this device's measured cost curve (measured once, then cached)."""
        from .costs import DraftLengthController, cached_curve

        curve = cached_curve(
            self.target.model, self.draft.model, self.target.path, self.draft.path, sizes=tuple(range(1, max_draft + 2))
        )
        return DraftLengthController(curve, max_draft)

    def corpus_successors(self):
        """Prompt lookup's fallback table for this tokenizer (built once per machine, then read once per load)."""
        if self._successors is None:
            from .ngram_table import corpus_successors

            vocab = getattr(getattr(self.target.model, "args", None), "vocab_size", None)
            self._successors = corpus_successors(self.tokenizer, vocab or len(self.tokenizer.get_vocab()))
        return self._successors

    def _make_drafter(
        self,
        sampling: SamplingConfig,
        num_draft: int,
        use_draft: bool,
        tree_topk: int,
        lookup: bool,
        lookup_candidates: int = 1,
        corpus_fallback: bool = True,
    ) -> Drafter | None:
        model_drafter = None
        if use_draft and self.medusa is not None:
            from .medusa import MedusaDrafter

            model_drafter = MedusaDrafter(
                self.medusa, self.target.model, tree_nodes=num_draft * tree_topk, tree_topk=tree_topk
            )
        elif use_draft and self.draft is not None:
            model_drafter = DraftModelDrafter(
                self.draft.model,
                sampling,
                num_draft,
                kv_bits=self.kv_bits,
                kv_window=self.draft_window,
                tree_topk=tree_topk,
            )
        elif tree_topk > 1:
            raise UserError("a tree needs a drafter that branches: pass a draft model (or Medusa heads)")
        if lookup:
            successors = self.corpus_successors() if corpus_fallback else None
            lookup_drafter = PromptLookupDrafter(max_candidates=lookup_candidates, successors=successors)
            return LookupThenModelDrafter(lookup_drafter, model_drafter) if model_drafter else lookup_drafter
        return model_drafter

    def generate(self, prompt: str | list[int], **kwargs) -> GenerationResult:
        pieces, tokens, finish = [], [], None
        for chunk in self.stream(prompt, **kwargs):
            pieces.append(chunk.text)
            tokens.extend(chunk.tokens)
            finish = chunk.finish_reason
        return GenerationResult("".join(pieces), tokens, self.last_stats, finish)


def load(
    model: str | Path | None = None,
    draft: str | Path | None = "auto",
    num_draft: int | str = "auto",
    quantize_target: int | None = None,
    kv_bits: int | None = None,
    draft_window: int | None = None,
    medusa: str | Path | None = None,
) -> Speculator:
    """Load a target and a draft once. draft="auto" uses the embedded draft with the embedded target; None disables."""
    target = load_model(model or DEFAULT_TARGET, quantize_bits=quantize_target)
    if draft == "auto":
        draft = DEFAULT_DRAFT if model is None and medusa is None else None
    if draft is not None and medusa is not None:
        raise UserError("a draft model and Medusa heads are two drafters; pass one of them")
    draft_model = load_model(draft) if draft is not None else None
    if kv_bits not in (None, 4, 8):
        raise UserError(f"kv_bits {kv_bits} is not supported; use 4 or 8")
    heads = None
    if medusa is not None:
        from .medusa import load_medusa

        heads = load_medusa(medusa, target.path)
    return Speculator(
        target, draft_model, num_draft=num_draft, kv_bits=kv_bits, draft_window=draft_window, medusa=heads
    )


def generate(
    prompt: str, model: str | Path | None = None, draft: str | Path | None = "auto", **kwargs
) -> GenerationResult:
    """One-shot convenience: load, then generate."""
    load_keys = {"num_draft", "quantize_target", "kv_bits"}
    speculator = load(model, draft, **{k: kwargs.pop(k) for k in list(kwargs) if k in load_keys})
    return speculator.generate(prompt, **kwargs)
