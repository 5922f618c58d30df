"""Prompt lookup: drafts by copying what followed earlier occurrences of the context's last n tokens."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from mlxspec.decoding.draft import Draft, Drafter
from mlxspec.decoding.trees import TreeShape, continuation_tree
from mlxspec.drafting.lookup.suffix_index import SuffixIndex

MAX_MATCHES_SCANNED = 256  # most recent occurrences of an n-gram read per proposal (bounds a step's cost)


class PromptLookupDrafter(Drafter):
    """Drafts by finding earlier occurrences of the last n tokens and copying what followed them.

    No model and no memory; strong on code edits and repetitive text. Deterministic, so verified by sampling.
    With max_candidates > 1, the distinct continuations of several matches (longest n-gram first, then latest)
    form a tree, so a wrong guess from the latest match can be rescued by an older one in the same target call.

    The history is the engine's committed tokens, read, never copied. An index from every n-gram to where it starts
    grows with the tokens committed since the last proposal, so a step costs O(new tokens), not O(history).
    `reference`: tokens searched as if they came before the history (a text the output is likely to quote).
    `shared`: the suffix cache of earlier requests (suffix_index.py), searched where the context has no match.
    """

    def __init__(
        self,
        max_ngram: int = 3,
        min_ngram: int = 1,
        max_candidates: int = 1,
        successors: np.ndarray | None = None,
        fallback_tokens: int = 1,
        reference: Sequence[int] = (),
        shared: SuffixIndex | None = None,
    ):
        self.max_ngram, self.min_ngram, self.max_candidates = max_ngram, min_ngram, max_candidates
        # Where nothing matches, follow a corpus bigram table (ngram_table.py) for fallback_tokens tokens.
        self.successors, self.fallback_tokens = successors, fallback_tokens
        self.reference = list(reference)
        self.shared = shared  # the suffix cache of earlier requests, searched where this context has no match
        self.history: Sequence[int] = []
        self.calls = 0
        self._starts: dict[tuple[int, ...], list[int]] = {}  # n-gram -> its start positions, ascending
        self._indexed = 0  # tokens of reference + history indexed so far

    def prefill(self, history: Sequence[int]) -> None:
        self.history = history
        self._starts, self._indexed = {}, 0

    def reusable(self, prompt: list[int]) -> int:
        return len(prompt)  # no state but the index, which prefill rebuilds

    def resume(self, history: Sequence[int], reused: int) -> None:
        self.prefill(history)

    def _tokens(self, start: int, stop: int) -> list[int]:
        """reference + history, [start, stop): without joining the two lists."""
        r = len(self.reference)
        if start >= r:
            return list(self.history[start - r : stop - r])
        return self.reference[start:stop] + list(self.history[: max(0, stop - r)])

    def _index(self) -> None:
        """Add the n-grams that end in the tokens committed since the last call (tuples built by zip, in C)."""
        total = len(self.reference) + len(self.history)
        for n in range(self.min_ngram, self.max_ngram + 1):
            first = max(0, self._indexed - n + 1)  # the first start of an n-gram not indexed yet
            window = self._tokens(first, total)
            starts = self._starts
            for offset, gram in enumerate(zip(*(window[i:] for i in range(n)))):
                if gram in starts:
                    starts[gram].append(first + offset)
                else:
                    starts[gram] = [first + offset]
        self._indexed = total

    def candidates(self, num_tokens: int) -> list[list[int]]:
        """Up to max_candidates distinct continuations of at most num_tokens tokens, best first."""
        self._index()
        total, found = len(self.reference) + len(self.history), []
        for n in range(min(self.max_ngram, total - 1), self.min_ngram - 1, -1):
            starts = self._starts.get(tuple(self._tokens(total - n, total)), [])
            # Latest match first, excluding the tail itself (it starts at total - n, the last entry).
            for start in reversed(starts[-MAX_MATCHES_SCANNED - 1 : -1]):
                continuation = self._tokens(start + n, min(start + n + num_tokens, total))
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

    def shared_continuation(self, num_tokens: int) -> list[int]:
        if self.shared is None or not self.history:
            return []
        return self.shared.continuation(self.history[-self.shared.max_ngram :], num_tokens)

    def propose(self, num_tokens: int, key: mx.array | None) -> Draft | None:
        found = self.candidates(num_tokens) or [
            self.shared_continuation(num_tokens) or self.successor_chain(num_tokens)
        ]
        if not found[0]:
            return None
        if len(found) == 1:
            return Draft(mx.array(found[0], dtype=mx.int32))
        tokens, parents = continuation_tree(found)
        return Draft(mx.array(tokens, dtype=mx.int32), None, TreeShape(tuple(parents)))

    def accept(self, emitted: list[int], drafted: list[int]) -> None:
        pass  # the engine has committed `emitted` to the history; the next proposal indexes them


class LookupThenModelDrafter(Drafter):
    """Prompt lookup when the context repeats itself, the draft model otherwise."""

    def __init__(self, lookup: PromptLookupDrafter, model: Drafter, min_match: int = 2):
        self.lookup, self.model, self.min_match = lookup, model, min_match
        self.uses_target_hidden = model.uses_target_hidden
        self.target_taps = model.target_taps  # a tapping drafter behind lookup still needs its taps
        self.max_nodes = model.max_nodes
        self._used: Drafter | None = None

    def set_hidden(self, hidden: mx.array | None) -> None:
        self.model.set_hidden(hidden)

    @property
    def calls(self) -> int:
        return self.model.calls

    def prefill(self, history: Sequence[int]) -> None:
        self.lookup.prefill(history)
        self.model.prefill(history)

    def reusable(self, prompt: list[int]) -> int:
        return self.model.reusable(prompt)

    def resume(self, history: Sequence[int], reused: int) -> None:
        self.lookup.prefill(history)
        self.model.resume(history, reused)

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
