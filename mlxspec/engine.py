"""The speculative step: draft, verify in one target forward, accept, roll back. One host sync per step."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from .acceptance import accept_chain
from .caches import cache_offset, make_speculative_cache, rollback
from .drafters import Drafter
from .sampling import SamplingConfig, sample, to_probs


def to_host(values: mx.array) -> list[int]:
    """The engine's only host sync per step; tests count calls to it."""
    return values.tolist()


def pad_vocab(probs: mx.array, vocab_size: int) -> mx.array:
    """Zero-pad distributions to vocab_size, so a target and draft with differently padded embeddings compare."""
    missing = vocab_size - probs.shape[-1]
    if missing <= 0:
        return probs
    return mx.concatenate([probs, mx.zeros((*probs.shape[:-1], missing), probs.dtype)], axis=-1)


@dataclass
class StepResult:
    tokens: list[int]  # accepted drafts, then the target's own token
    drafted: int
    accepted: int


class SpeculativeEngine:
    """Target-side state of speculative decoding: the target cache, the token not yet fed, and the random key."""

    def __init__(
        self,
        target: nn.Module,
        drafter: Drafter | None,
        sampling: SamplingConfig,
        num_draft: int = 4,
        seed: int = 0,
        kv_bits: int | None = None,
        context_length: int | None = None,
        prefill_chunk: int = 512,
    ):
        self.target = target
        self.drafter = drafter
        self.sampling = sampling
        self.num_draft = num_draft if drafter is not None else 0
        self.context_length = context_length
        self.prefill_chunk = prefill_chunk
        self.cache = make_speculative_cache(target, max_rollback=self.num_draft + 1, kv_bits=kv_bits)
        self.key = mx.random.key(seed)
        self.pending: list[int] = []
        self.target_calls = 0

    def prefill(self, prompt: list[int]) -> None:
        """Feed all but the last prompt token; the last one is verified together with the first draft."""
        todo = list(prompt[:-1])
        for start in range(0, len(todo), self.prefill_chunk):
            self.target(mx.array(todo[start : start + self.prefill_chunk])[None], cache=self.cache)
            mx.eval([c.state for c in self.cache])
        self.pending = [prompt[-1]]
        if self.drafter is not None:
            self.drafter.prefill(prompt)

    def room(self) -> int | None:
        """How many more positions the target may process before its context is full."""
        if self.context_length is None:
            return None
        return self.context_length - cache_offset(self.cache)

    def step(self, max_new_tokens: int) -> StepResult:
        """One draft-verify-accept round emitting between 1 and num_draft + 1 tokens (at most max_new_tokens)."""
        self.key, draft_key, accept_key = mx.random.split(self.key, 3)
        num_draft = min(self.num_draft, max_new_tokens - 1)
        if self.room() is not None:
            num_draft = min(num_draft, self.room() - len(self.pending))
        num_draft = max(num_draft, 0)

        inputs = mx.array(self.pending, dtype=mx.int32)
        draft = self.drafter.propose(num_draft, draft_key) if num_draft else None
        if draft is not None:
            inputs = mx.concatenate([inputs, draft.tokens])
        logits = self.target(inputs[None], cache=self.cache)[0, -(num_draft + 1) :]
        target_probs = to_probs(logits, self.sampling)
        self.target_calls += 1

        if draft is None:
            packed = mx.concatenate([mx.array([0], mx.int32), sample(target_probs[0], accept_key, self.sampling.greedy)[None]])
        else:
            vocab = max(target_probs.shape[-1], draft.probs.shape[-1])
            num_accepted, next_token = accept_chain(
                draft.tokens, pad_vocab(draft.probs, vocab), pad_vocab(target_probs, vocab), accept_key, self.sampling.greedy
            )
            packed = mx.concatenate([num_accepted[None], next_token[None], draft.tokens])
        values = to_host(packed)

        num_accepted, next_token, drafted = values[0], values[1], values[2:]
        emitted = drafted[:num_accepted] + [next_token]
        rollback(self.cache, num_draft - num_accepted)
        if self.drafter is not None:
            self.drafter.accept(emitted, num_accepted)
        self.pending = [next_token]
        return StepResult(emitted, num_draft, num_accepted)
