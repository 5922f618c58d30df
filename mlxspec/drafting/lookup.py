"""Prompt lookup: drafts by copying what followed earlier occurrences of the context's last n tokens."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from mlxspec.decoding.draft import Draft, Drafter
from mlxspec.decoding.trees import TreeShape, continuation_tree


class PromptLookupDrafter(Drafter):
    """Drafts by finding earlier occurrences of the last n tokens and copying what followed them.

    No model and no memory; strong on code edits and repetitive text. Deterministic, so verified by sampling.
    With max_candidates > 1, the distinct continuations of several matches (longest n-gram first, then latest)
    form a tree, so a wrong guess from the latest match can be rescued by an older one in the same target call.
    """

    def __init__(
        self,
        max_ngram: int = 3,
        min_ngram: int = 1,
        max_candidates: int = 1,
        successors: np.ndarray | None = None,
        fallback_tokens: int = 1,
    ):
        self.max_ngram, self.min_ngram, self.max_candidates = max_ngram, min_ngram, max_candidates
        # Where nothing matches, follow a corpus bigram table (ngram_table.py) for fallback_tokens tokens.
        self.successors, self.fallback_tokens = successors, fallback_tokens
        self.history: list[int] = []
        self.calls = 0

    def prefill(self, prompt: list[int]) -> None:
        self.history = list(prompt)

    def reusable(self, prompt: list[int]) -> int:
        return len(prompt)  # no state but the history, which prefill replaces

    def resume(self, prompt: list[int], reused: int) -> None:
        self.prefill(prompt)

    def candidates(self, num_tokens: int) -> list[list[int]]:
        """Up to max_candidates distinct continuations of at most num_tokens tokens, best first."""
        h, found = self.history, []
        for n in range(min(self.max_ngram, len(h) - 1), self.min_ngram - 1, -1):
            tail = h[-n:]
            for start in range(len(h) - n - 1, -1, -1):  # latest match first, excluding the tail itself
                if h[start : start + n] == tail:
                    continuation = h[start + n : start + n + num_tokens]
                    if continuation not in found:
                        found.append(continuation)
                        if len(found) == self.max_candidates:
                            return found
        return found

    def lookup(self, num_tokens: int) -> list[int]:
        found = self.candidates(num_tokens)
        return found[0] if found else []

    def successor_chain(self, num_tokens: int) -> list[int]:
        if self.successors is None or not self.history:
            return []
        chain, token = [], self.history[-1]
        while len(chain) < min(num_tokens, self.fallback_tokens):
            token = int(self.successors[token]) if token < len(self.successors) else -1
            if token < 0:
                break
            chain.append(token)
        return chain

    def propose(self, num_tokens: int, key: mx.array | None) -> Draft | None:
        found = self.candidates(num_tokens) or [self.successor_chain(num_tokens)]
        if not found[0]:
            return None
        if len(found) == 1:
            return Draft(mx.array(found[0], dtype=mx.int32))
        tokens, parents = continuation_tree(found)
        return Draft(mx.array(tokens, dtype=mx.int32), None, TreeShape(tuple(parents)))

    def accept(self, emitted: list[int], drafted: list[int]) -> None:
        self.history.extend(emitted)


class LookupThenModelDrafter(Drafter):
    """Prompt lookup when the context repeats itself, the draft model otherwise."""

    def __init__(self, lookup: PromptLookupDrafter, model: Drafter, min_match: int = 2):
        self.lookup, self.model, self.min_match = lookup, model, min_match
        self.uses_target_hidden = model.uses_target_hidden
        self.max_nodes = model.max_nodes
        self._used: Drafter | None = None

    def set_hidden(self, hidden: mx.array | None) -> None:
        self.model.set_hidden(hidden)

    @property
    def calls(self) -> int:
        return self.model.calls

    def prefill(self, prompt: list[int]) -> None:
        self.lookup.prefill(prompt)
        self.model.prefill(prompt)

    def reusable(self, prompt: list[int]) -> int:
        return self.model.reusable(prompt)

    def resume(self, prompt: list[int], reused: int) -> None:
        self.lookup.prefill(prompt)
        self.model.resume(prompt, reused)

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
