"""Drafters propose tokens for the target to verify. Each keeps its own state; none of them affects exactness.

A draft is either a sampled chain with the distributions it was drawn from (verified by Leviathan/Chen rejection
sampling), or a deterministic tree or chain (verified by sampling the target at every node; see trees.accept_tree).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx
import mlx.nn as nn

from .caches import cache_offset, make_speculative_cache, rollback
from .sampling import SamplingConfig, sample, to_probs
from .trees import TreeShape


@dataclass
class Draft:
    tokens: mx.array  # [M] int32 drafted tokens, lazy; tree nodes 1..M in BFS order
    probs: mx.array | None = None  # [M, V] the distributions sampled from; None for deterministic drafts
    shape: TreeShape | None = None  # the tree including its root; None for a chain

    @property
    def tree(self) -> TreeShape:
        return self.shape or TreeShape.chain(self.tokens.shape[0])


class Drafter(Protocol):
    calls: int

    def prefill(self, prompt: list[int]) -> None:
        """See the whole prompt; the last prompt token is where drafting continues from."""

    def propose(self, num_tokens: int, key: mx.array) -> Draft | None:
        """Draft about num_tokens tokens (a chain of that length, or a tree that deep) lazily, or None."""

    def accept(self, emitted: list[int], drafted: list[int]) -> None:
        """The step's outcome: the emitted tokens and, as host ints, the tokens this drafter proposed."""


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class DraftModelDrafter:
    """A small autoregressive model sharing the target's tokenizer.

    tree_topk == 1: a chain sampled from the draft's processed distributions (Leviathan et al., Chen et al.).
    tree_topk > 1: a deterministic tree: the draft's greedy chain, with its top-k alternatives at every depth as
    sibling leaves (SpecInfer-style branching at the cost of a chain's draft calls).
    """

    def __init__(
        self,
        model: nn.Module,
        sampling: SamplingConfig,
        max_draft: int,
        kv_bits: int | None = None,
        kv_window: int | None = None,
        tree_topk: int = 1,
    ):
        self.model = model
        self.sampling = sampling
        self.tree_topk = tree_topk
        # A windowed draft cache bounds the draft's memory; it only changes proposals, never the output law.
        self.cache = make_speculative_cache(model, max_rollback=max_draft + 1, kv_bits=kv_bits, window=kv_window)
        self.history: list[int] = []  # every committed token, prompt included
        self._chain_nodes: list[int] = []  # node indices (1-based) of the tokens fed back into the draft
        self.calls = 0

    def _pending(self) -> list[int]:
        return self.history[cache_offset(self.cache) :]

    def prefill(self, prompt: list[int], chunk: int = 512) -> None:
        self.history = list(prompt)
        while len(self._pending()) > 1:
            todo = self._pending()[: min(chunk, len(self._pending()) - 1)]
            self.model(mx.array(todo)[None], cache=self.cache)
            mx.eval([c.state for c in self.cache])

    def propose(self, num_tokens: int, key: mx.array | None) -> Draft:
        inputs = mx.array(self._pending(), dtype=mx.int32)
        k, greedy = self.tree_topk, self.sampling.greedy
        keys = None if greedy or k > 1 else mx.random.split(key, num_tokens)
        tokens, probs = [], []
        for i in range(num_tokens):
            logits = self.model(inputs[None], cache=self.cache)[0, -1]
            if k > 1:  # top-k by the draft's logits (ties broken as argsort does); the first continues the chain
                top = mx.argsort(-logits.astype(mx.float32))[:k].astype(mx.int32)
                token = top[0]
                tokens.append(top)
            elif greedy:  # a greedy chain is deterministic: its tokens are all the verifier needs
                token = mx.argmax(logits).astype(mx.int32)
                tokens.append(token[None])
            else:
                q = to_probs(logits, self.sampling)
                token = sample(q, keys[i], False)
                probs.append(q)
                tokens.append(token[None])
            mx.async_eval(token)  # start the draft computing while Python builds the next call; not a sync
            inputs = token[None]
        self.calls += num_tokens
        self._chain_nodes = [1 + i * k for i in range(num_tokens)]
        if k == 1:
            return Draft(mx.concatenate(tokens), mx.stack(probs) if probs else None)
        parents = [-1] + [0 if i == 0 else 1 + (i - 1) * k for i in range(num_tokens) for _ in range(k)]
        return Draft(mx.concatenate(tokens), None, TreeShape(tuple(parents)))

    def accept(self, emitted: list[int], drafted: list[int]) -> None:
        if self._chain_nodes:
            # The cache holds history + the chain's first K-1 tokens; keep what the emitted tokens confirm. A draft
            # the engine dropped unverified (no room left in the context) comes back empty: keep none of it.
            chain = [drafted[i - 1] for i in self._chain_nodes if i - 1 < len(drafted)]
            keep = min(common_prefix(emitted, chain), len(self._chain_nodes) - 1)
            rollback(self.cache, cache_offset(self.cache) - (len(self.history) + keep))
        self.history.extend(emitted)
        self._chain_nodes = []


class PromptLookupDrafter:
    """Drafts by finding the latest earlier occurrence of the last n tokens and copying what followed it.

    No model and no memory; strong on code edits and repetitive text. Deterministic, so verified by sampling.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.history: list[int] = []
        self.calls = 0

    def prefill(self, prompt: list[int]) -> None:
        self.history = list(prompt)

    def lookup(self, num_tokens: int) -> list[int]:
        h = self.history
        for n in range(min(self.max_ngram, len(h) - 1), self.min_ngram - 1, -1):
            tail = h[-n:]
            for start in range(len(h) - n - 1, -1, -1):  # latest match first, excluding the tail itself
                if h[start : start + n] == tail:
                    return h[start + n : start + n + num_tokens]
        return []

    def propose(self, num_tokens: int, key: mx.array) -> Draft | None:
        found = self.lookup(num_tokens)
        return Draft(mx.array(found, dtype=mx.int32)) if found else None

    def accept(self, emitted: list[int], drafted: list[int]) -> None:
        self.history.extend(emitted)


class LookupThenModelDrafter:
    """Prompt lookup when the context repeats itself, the draft model otherwise."""

    def __init__(self, lookup: PromptLookupDrafter, model: DraftModelDrafter, min_match: int = 2):
        self.lookup, self.model, self.min_match = lookup, model, min_match
        self._used: Drafter | None = None

    @property
    def calls(self) -> int:
        return self.model.calls

    def prefill(self, prompt: list[int]) -> None:
        self.lookup.prefill(prompt)
        self.model.prefill(prompt)

    def propose(self, num_tokens: int, key: mx.array) -> Draft | None:
        draft = self.lookup.propose(num_tokens, key)
        if draft is not None and draft.tokens.shape[0] >= self.min_match:
            self._used = self.lookup
            return draft
        self._used = self.model
        return self.model.propose(num_tokens, key)

    def accept(self, emitted: list[int], drafted: list[int]) -> None:
        self.lookup.accept(emitted, drafted if self._used is self.lookup else [])
        self.model.accept(emitted, drafted if self._used is self.model else [])
