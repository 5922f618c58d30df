"""Drafters propose tokens for the target to verify. Each keeps its own state; none of them affects exactness."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx
import mlx.nn as nn

from .caches import cache_offset, make_speculative_cache, rollback
from .sampling import SamplingConfig, sample, to_probs


@dataclass
class Draft:
    tokens: mx.array  # [K] int32, lazy
    probs: mx.array  # [K, V] the distributions the tokens were drawn from (one-hot for deterministic drafters)


class Drafter(Protocol):
    def prefill(self, prompt: list[int]) -> None:
        """See the whole prompt; the last prompt token is the first one drafting continues from."""

    def propose(self, num_tokens: int, key: mx.array) -> Draft:
        """Draft num_tokens tokens after everything accepted so far, lazily (no host sync)."""

    def accept(self, emitted: list[int], num_accepted: int) -> None:
        """The step's outcome: emitted = the first num_accepted drafted tokens + one target token."""


def one_hot(tokens: mx.array, vocab_size: int) -> mx.array:
    return (tokens[:, None] == mx.arange(vocab_size)[None]).astype(mx.float32)


class DraftModelDrafter:
    """A small autoregressive model sharing the target's tokenizer (Leviathan et al. / Chen et al.)."""

    def __init__(self, model: nn.Module, sampling: SamplingConfig, max_draft: int, kv_bits: int | None = None,
                 kv_window: int | None = None):
        self.model = model
        self.sampling = sampling
        # A windowed draft cache bounds the draft's memory; it only changes proposals, never the output law.
        self.cache = make_speculative_cache(model, max_rollback=max_draft + 1, kv_bits=kv_bits, window=kv_window)
        self.history: list[int] = []  # every committed token, prompt included
        self._drafted = 0
        self.calls = 0

    def _pending(self) -> list[int]:
        return self.history[cache_offset(self.cache):]

    def prefill(self, prompt: list[int], chunk: int = 512) -> None:
        self.history = list(prompt)
        while len(self._pending()) > 1:
            todo = self._pending()[: min(chunk, len(self._pending()) - 1)]
            self.model(mx.array(todo)[None], cache=self.cache)
            mx.eval([c.state for c in self.cache])

    def propose(self, num_tokens: int, key: mx.array) -> Draft:
        inputs = mx.array(self._pending(), dtype=mx.int32)
        keys = mx.random.split(key, num_tokens)
        tokens, probs = [], []
        for i in range(num_tokens):
            logits = self.model(inputs[None], cache=self.cache)[0, -1]
            q = to_probs(logits, self.sampling)
            token = sample(q, keys[i], self.sampling.greedy)
            mx.async_eval(token)  # start the draft computing while Python builds the next call; not a sync
            tokens.append(token)
            probs.append(q)
            inputs = token[None]
        self.calls += num_tokens
        # The last drafted token was never fed to the draft model.
        self._drafted = num_tokens
        return Draft(mx.stack(tokens), mx.stack(probs))

    def accept(self, emitted: list[int], num_accepted: int) -> None:
        if self._drafted:
            # The cache holds history + the first K-1 drafts; keep only what was accepted.
            valid = len(self.history) + min(num_accepted, self._drafted - 1)
            rollback(self.cache, cache_offset(self.cache) - valid)
        self.history.extend(emitted)
        self._drafted = 0
