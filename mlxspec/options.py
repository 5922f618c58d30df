"""DecodeOptions: every per-generation choice in one dataclass, built by the CLI, read by api, bench and tests.

Validation lives here, so the CLI and the Python API refuse the same inputs with the same one-line messages.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from mlxspec.errors import UserError

# Logits are divided by the temperature in float32: far below this they overflow to inf and the law becomes NaN.
MIN_TEMPERATURE = 1e-6
# Far above this, 1/T underflows float32 to 0, and a filtered -inf logit times 0 is NaN (every token the last id).
MAX_TEMPERATURE = 1e30
KERNEL_CHOICES = ("auto", "on", "off", "int8")  # the verify kernel (kernels/verify.py): on where built, always, never,
# or on with int8 activations against quantized weights (lossy: an explicit opt-in, never chosen for the user)
# How sampled drafts are verified (DecodeOptions.acceptance): "auto" is coupled where a seed was given (its text
# repeats whatever drafts) and residual (Leviathan/Chen, which keeps more drafted tokens) where none was.
ACCEPTANCE_CHOICES = ("auto", "coupled", "residual")
MAX_TOP_LOGPROBS = 20  # alternatives reported per token, as OpenAI's top_logprobs allows
MAX_CONTEXT_SIZE = 1 << 20  # a penalty's context: more tokens than any context window holds
MAX_NUM_DRAFT = 64  # the longest chain, or the deepest tree, one step may draft
ADAPTIVE_MAX_DRAFT = 8  # the longest chain the adaptive controller may choose
MAX_SEED = 2**64 - 1
MAX_TOKEN_ID = 2**31 - 1  # no vocabulary is larger; an id past it is refused even before the model is known
# Logits are processed in float32 (largest finite 3.4e38). Within these bounds no processor can overflow a logit to
# inf, whose log-softmax is NaN (bias 1e30, divided by a repetition penalty of 1e-6, less a frequency penalty of 1e30
# times a 2^20-token count: at most 2e36); each bound already forces or bans a token outright.
MAX_LOGIT_BIAS = 1e30
MAX_PENALTY = 1e30  # presence and frequency penalties, either sign
REPETITION_PENALTY_RANGE = (1e-6, 1e6)


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    xtc_probability: float = 0.0  # XTC (mlx-lm's apply_xtc): how often the likeliest tokens are excluded
    xtc_threshold: float = 0.1
    xtc_special_tokens: tuple[int, ...] = ()  # never excluded

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def xtc(self) -> bool:
        """XTC draws a coin per token (a key of its own, before the token's), as mlx-lm's sampler does."""
        return self.xtc_probability > 0 and not self.greedy

    def validate(self) -> None:
        if self.temperature < 0:
            raise UserError(f"temperature {self.temperature} is negative; use 0 for greedy or a value > 0")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise UserError(
                f"temperature {self.temperature} is too small to divide logits by (the smallest is {MIN_TEMPERATURE}); "
                "use 0 for greedy decoding, the law it approaches"
            )
        if self.temperature > MAX_TEMPERATURE:
            raise UserError(
                f"temperature {self.temperature:g} is above {MAX_TEMPERATURE:g}, where 1/T underflows float32; "
                "any temperature above about 100 already samples nearly uniformly"
            )
        if not 0 < self.top_p <= 1:
            raise UserError(f"top_p {self.top_p} is outside (0, 1]; use 1.0 to disable it")
        if self.top_k < 0:
            raise UserError(f"top_k {self.top_k} is negative; use 0 to disable it")
        if not 0 <= self.min_p <= 1:
            raise UserError(f"min_p {self.min_p} is outside [0, 1]; use 0 to disable it")
        if not 0 <= self.xtc_probability <= 1:
            raise UserError(f"xtc_probability {self.xtc_probability} is outside [0, 1]; use 0 to disable it")
        if not 0 <= self.xtc_threshold <= 0.5:
            raise UserError(f"xtc_threshold {self.xtc_threshold} is outside [0, 0.5]")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def parse_num_draft(value: Any) -> int | str:
    """An int 1..64 or 'auto' (CLI text '4' and 'auto' included); anything else is refused by name."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]+", value.strip()):  # ASCII digits: '²'.isdigit() is True
        value = int(value)
    if not _is_int(value):
        raise UserError(f"num_draft {value!r} is not a whole number; pass 1..{MAX_NUM_DRAFT} or 'auto'")
    if not 1 <= value <= MAX_NUM_DRAFT:
        raise UserError(f"num_draft {value} is outside 1..{MAX_NUM_DRAFT}; 4 is a good start, or 'auto' to adapt it")
    return int(value)


FLAGS = ("stop_at_eos", "chat", "heal", "truncate", "use_draft", "lookup", "corpus_fallback", "suffix")


@dataclass
class DecodeOptions:
    """What one generation does: how long, how it samples, and how it drafts. Output law never depends on the
    drafting fields: they change speed only."""

    # length and stopping
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    stop_at_eos: bool = True
    # sampling (the target's law)
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = 0  # None: a random seed, reported in the result so the run can be repeated
    # "coupled": a seed gives one text whatever drafts (decoding/keys.py); "residual": Leviathan/Chen rejection for
    # sampled drafts, exact in law only, with a higher acceptance; "auto": coupled when a seed is given, residual
    # when it is not (acceptance_rule)
    acceptance: str = "auto"
    # history-dependent logits processors, as mlx-lm's make_logits_processors (None or {}: off)
    repetition_penalty: float | None = None
    repetition_context_size: int = 20
    presence_penalty: float | None = None
    presence_context_size: int = 20
    frequency_penalty: float | None = None
    frequency_context_size: int = 20
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit
    # None: no log-probabilities; N: each token's own and its N most likely alternatives' (mlx-lm's logprobs: after
    # the processors, before temperature and the filters)
    logprobs: int | None = None
    xtc_probability: float = 0.0  # XTC, as mlx-lm's sampler applies it (0: off)
    xtc_threshold: float = 0.1
    xtc_special_tokens: list[int] | None = None  # None: the tokenizer's "\n" and end tokens, as mlx-lm's generate
    # the prompt
    chat: bool = False
    heal: bool = False  # token healing: the first token may re-complete the prompt's last one
    truncate: bool = False  # keep the prompt's last tokens that fit the context instead of refusing
    # drafting (speed only)
    num_draft: int | str = "auto"  # chain length or tree depth; "auto" adapts it to acceptance and cost
    use_draft: bool = True  # False: no draft model or heads (prompt lookup may still draft)
    tree_topk: int = 1  # > 1: a tree of the drafter's top-k alternatives at every depth
    tree_nodes: int | None = None  # the tree's node budget (sets its depth)
    lookup: bool = False  # prompt lookup first; the draft model covers what does not repeat
    lookup_candidates: int = 1  # > 1: that many distinct continuations verified as one tree
    corpus_fallback: bool = True  # lookup guesses one token from a stdlib bigram table where nothing matches
    suffix: bool = False  # lookup also searches the suffix cache of earlier requests (Speculator(suffix_cache=N))
    kv_bits: int | None = None  # quantize both KV caches (4 or 8)
    draft_window: int | None = None  # cap the draft model's KV cache at this many tokens
    kernel: str = "auto"  # the verify kernel (kernels/verify.py): auto (on where built for the device), on, off, int8

    @classmethod
    def sampling_as(cls, sampling: SamplingConfig, **changes: Any) -> DecodeOptions:
        """Options that sample as `sampling` does, with `changes` (tests and scripts that hold a SamplingConfig)."""
        return cls(**asdict(sampling), **changes)

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(
            float(self.temperature),
            float(self.top_p),
            int(self.top_k),
            float(self.min_p),
            float(self.xtc_probability),
            float(self.xtc_threshold),
            tuple(self.xtc_special_tokens or ()),
        )

    @property
    def drafting_key(self) -> tuple:
        """The fields a drafter is built from: a drafter kept from a run with the same key can continue its state."""
        return (
            self.sampling,
            self.depth,
            self.tree_topk,
            self.tree_nodes,
            self.use_draft,
            self.lookup,
            self.lookup_candidates,
            self.corpus_fallback,
            self.suffix,
            self.kv_bits,
            self.draft_window,
        )

    @property
    def adaptive(self) -> bool:
        return self.num_draft == "auto"

    @property
    def depth(self) -> int:
        """The chain length or tree depth drafted per step (the adaptive controller's ceiling when adaptive)."""
        if self.tree_nodes:
            return max(1, self.tree_nodes // self.tree_topk)
        return ADAPTIVE_MAX_DRAFT if self.adaptive else int(self.num_draft)

    @property
    def max_nodes(self) -> int:
        """The most drafted nodes one step may verify."""
        return self.depth * max(self.tree_topk, self.lookup_candidates if self.lookup else 1)

    def plain(self, **changes: Any) -> DecodeOptions:
        """The same run decoded plainly: no drafter and none of the drafting settings that need one (a tree, lookup's
        candidates, the suffix cache), whatever these options draft with."""
        drafting = dict(use_draft=False, lookup=False, suffix=False, tree_topk=1, tree_nodes=None, lookup_candidates=1)
        return self.updated(**drafting, **changes)

    def acceptance_rule(self) -> str:
        """The rule a run verifies sampled drafts by: "coupled" or "residual" as named; "auto" picks coupled when
        the caller gave a seed, so that seed's text repeats whatever drafts, and residual when none was given, where
        nobody asked for the text to repeat and Leviathan/Chen keeps 12-35% more tokens a step on the real pair at
        T=0.7 (docs/benchmarks.md, 2026-12-07). XTC takes coupled: residual cannot sample it."""
        if self.acceptance != "auto":
            return self.acceptance
        return "residual" if self.seed is None and not self.sampling.xtc else "coupled"

    def updated(self, **changes: Any) -> DecodeOptions:
        """A copy with `changes` applied; an unknown name is refused with the list of known ones."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise UserError(f"unknown option {unknown[0]!r}; options are: {', '.join(sorted(known))}")
        return replace(self, **changes)

    def validate(self, vocab_size: int | None = None) -> DecodeOptions:
        """Refuse bad values by name (one line each); returns a normalized copy (stop as a list, num_draft parsed)."""
        for name in FLAGS:  # "False" and "no" are true in Python: a flag must be a real bool
            if not isinstance(getattr(self, name), bool):
                raise UserError(f"{name} {getattr(self, name)!r} must be True or False")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise UserError(f"max_tokens {self.max_tokens!r} must be a whole number >= 1")
        for name in ("temperature", "top_p", "min_p", "xtc_probability", "xtc_threshold"):
            value = getattr(self, name)
            if not _is_real(value) or not math.isfinite(value):
                raise UserError(f"{name} {value!r} is not a finite number")
        if not _is_int(self.top_k):
            raise UserError(f"top_k {self.top_k!r} is not a whole number; use 0 to disable it")
        self._check_xtc_special_tokens(vocab_size)
        self.sampling.validate()
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= MAX_SEED):
            raise UserError(f"seed {self.seed!r} must be a whole number in 0..2**64-1, or None for a random one")
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
            raise UserError(f"stop {self.stop!r} must be a string or a list of strings")
        if any(s == "" for s in stop):
            raise UserError("an empty stop string would stop before the first token; drop it")
        num_draft = parse_num_draft(self.num_draft)
        for name in ("tree_topk", "lookup_candidates"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise UserError(f"{name} {value!r} must be a whole number >= 1 (1 drafts a single chain)")
        if vocab_size is not None and self.tree_topk > vocab_size:
            raise UserError(f"tree_topk {self.tree_topk} exceeds the vocabulary ({vocab_size} tokens)")
        if self.tree_nodes is not None:
            if not _is_int(self.tree_nodes) or self.tree_nodes < self.tree_topk:
                raise UserError(f"tree_nodes {self.tree_nodes!r} must be a whole number >= tree_topk {self.tree_topk}")
            if self.tree_nodes // self.tree_topk > MAX_NUM_DRAFT:
                depth = self.tree_nodes // self.tree_topk
                raise UserError(
                    f"tree_nodes {self.tree_nodes} with tree_topk {self.tree_topk} is {depth} deep; the deepest "
                    f"tree is {MAX_NUM_DRAFT}: lower tree_nodes or raise tree_topk"
                )
        if self.suffix and not self.lookup:
            raise UserError("suffix drafting is a kind of prompt lookup; turn lookup on with it (--lookup --suffix)")
        if self.lookup_candidates > 1 and not self.lookup:
            raise UserError(f"lookup_candidates {self.lookup_candidates} needs lookup (--lookup)")
        if self.kv_bits not in (None, 4, 8):
            raise UserError(f"kv_bits {self.kv_bits!r} is not supported; use 4 or 8")
        if self.draft_window is not None and (not _is_int(self.draft_window) or self.draft_window < 1):
            raise UserError(f"draft_window {self.draft_window!r} must be a whole number of tokens >= 1")
        logit_bias = self._checked_processors(vocab_size)
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            raise UserError(f"logprobs {self.logprobs!r} must be None or a whole number in 0..{MAX_TOP_LOGPROBS}")
        if self.acceptance not in ACCEPTANCE_CHOICES:
            raise UserError(f"acceptance {self.acceptance!r} is not one of {', '.join(ACCEPTANCE_CHOICES)}")
        if self.acceptance == "residual" and self.sampling.xtc:
            raise UserError("acceptance 'residual' does not take XTC (its coin changes the law per token); use coupled")
        if self.kernel not in KERNEL_CHOICES:
            raise UserError(f"kernel {self.kernel!r} is not one of {', '.join(KERNEL_CHOICES)}")
        return replace(self, stop=list(stop), num_draft=num_draft, logit_bias=logit_bias)

    def _check_xtc_special_tokens(self, vocab_size: int | None) -> None:
        """Ids the XTC mask writes to: each must be a row of the logits (an id past the end wrote out of bounds)."""
        special = self.xtc_special_tokens
        if special is None:
            return
        if not isinstance(special, (list, tuple)) or not all(_is_int(t) for t in special):
            raise UserError(f"xtc_special_tokens {special!r} must be a list of token ids")
        top = vocab_size if vocab_size is not None else MAX_TOKEN_ID + 1
        for token in special:
            if not 0 <= token < top:
                where = f"this vocabulary's ids are 0..{vocab_size - 1}" if vocab_size else "ids are never negative"
                raise UserError(
                    f"xtc_special_tokens names token {token}, which is not an id of this vocabulary ({where}); "
                    "find an id with the tokenizer's encode()"
                )

    def _checked_processors(self, vocab_size: int | None) -> dict[int, float] | None:
        """Refuse bad penalty settings by name; the logit bias as {int id: float}. Bounds hold after the float32
        cast the logits are processed in (MAX_LOGIT_BIAS): a value finite in Python but inf in float32 made NaN."""
        for name in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if value is not None and (not _is_real(value) or not math.isfinite(value)):
                raise UserError(f"{name} {value!r} is not a finite number; leave it unset to turn it off")
        low, high = REPETITION_PENALTY_RANGE
        if self.repetition_penalty is not None and self.repetition_penalty <= 0:
            raise UserError(f"repetition_penalty {self.repetition_penalty} must be > 0 (1 changes nothing)")
        if self.repetition_penalty is not None and not low <= self.repetition_penalty <= high:
            raise UserError(
                f"repetition_penalty {self.repetition_penalty} is outside {low:g}..{high:g} (1 changes nothing; "
                "1.1 to 1.3 is usual)"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if value is not None and not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise UserError(
                    f"{name} {value:g} is outside -{MAX_PENALTY:g}..{MAX_PENALTY:g}, where float32 logits overflow; "
                    "OpenAI's range is -2..2"
                )
        for name in ("repetition_context_size", "presence_context_size", "frequency_context_size"):
            value = getattr(self, name)
            if not _is_int(value) or not 1 <= value <= MAX_CONTEXT_SIZE:
                raise UserError(f"{name} {value!r} must be a whole number of tokens in 1..{MAX_CONTEXT_SIZE}")
        if not self.logit_bias:
            return None
        if not isinstance(self.logit_bias, dict):
            raise UserError(f"logit_bias {self.logit_bias!r} must map token ids to numbers")
        bias = {}
        for token, value in self.logit_bias.items():
            # Python's int() refuses more than 4,300 digits with a ValueError; no id has more than ten
            digits = isinstance(token, str) and token.isascii() and token.isdigit() and len(token) <= 12
            ident = int(token) if digits else token
            if not _is_int(ident) or ident < 0 or (vocab_size is not None and ident >= vocab_size):
                ids = f" (its ids are 0..{vocab_size - 1})" if vocab_size else ""
                shown = token if not isinstance(token, str) or len(token) <= 40 else token[:40] + "..."
                raise UserError(
                    f"logit_bias names token {shown!r}, which is not an id of this vocabulary{ids}; "
                    "find an id with the tokenizer's encode()"
                )
            if not _is_real(value) or not math.isfinite(value):
                raise UserError(f"logit_bias of token {token!r} is {value!r}, not a finite number")
            if not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
                raise UserError(
                    f"logit_bias of token {token!r} is {value:g}, outside -{MAX_LOGIT_BIAS:g}..{MAX_LOGIT_BIAS:g} "
                    "where float32 logits overflow; 100 already forces a token and -100 bans it"
                )
            bias[int(ident)] = float(value)
        return bias
