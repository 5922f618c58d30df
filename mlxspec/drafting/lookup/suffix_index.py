"""A suffix cache shared across requests: what earlier prompts and outputs said after the context's last tokens.

Agent loops resend nearly the same text again and again (tool calls, JSON results, a file being edited), often in
another conversation than the one that first said it, where prompt lookup (this request's own tokens) cannot see
it. SuffixDecoding (Oliaro et al., 2024) drafts from a suffix tree over every earlier request; this is the same
idea over an n-gram pool: every n-gram (n = min_ngram..max_ngram) of the documents kept maps to where it occurs,
and a draft follows the most frequent next token among those occurrences, token by token, from the longest n-gram
that matches. It stops where the continuations disagree too much (the top token's share under `min_share`) or past
`depth_per_match` tokens per matched token, so a long, well-attested match drafts deep and a short one shallow.

As in SuffixDecoding, the documents are earlier *outputs* (with the few prompt tokens before each, so a match may
straddle the boundary): the request's own prompt is prompt lookup's, and agent loops resend their prompts whole, so
indexing prompts would mostly store the same text again and again.

Bounded: documents are kept whole, oldest evicted first, while the tokens kept exceed `budget_tokens`; their
index entries are skipped from then on and dropped at the next compaction. A token costs about
(max_ngram - min_ngram + 1) index entries; `memory_bytes` estimates the whole.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence

DEFAULT_SUFFIX_BUDGET = 1 << 17  # tokens kept: ~80 MB of index at the default n-gram range (memory_bytes)
ENTRY_BYTES = 120  # a position in a Python list under a tuple key, measured roughly (CPython 3.11)


class SuffixIndex:
    def __init__(
        self,
        budget_tokens: int = DEFAULT_SUFFIX_BUDGET,
        max_ngram: int = 6,
        min_ngram: int = 2,
        min_share: float = 0.3,
        depth_per_match: float = 2.0,
        max_scanned: int = 64,
    ):
        self.budget_tokens, self.max_ngram, self.min_ngram = budget_tokens, max_ngram, min_ngram
        self.min_share, self.depth_per_match, self.max_scanned = min_share, depth_per_match, max_scanned
        self.documents: deque[tuple[int, list[int]]] = deque()  # (serial, tokens), oldest first
        self.texts: dict[int, list[int]] = {}
        self.starts: dict[tuple[int, ...], list[tuple[int, int]]] = {}  # n-gram -> (serial, start), oldest first
        self.tokens_kept = 0
        self.entries = 0
        self._next_serial = 0

    @property
    def oldest_serial(self) -> int:
        return self.documents[0][0] if self.documents else self._next_serial

    def memory_bytes(self) -> int:
        return self.entries * ENTRY_BYTES + self.tokens_kept * 8

    def add(self, tokens: Sequence[int]) -> None:
        """Keep a finished request's prompt and output (one document), evicting the oldest past the budget."""
        tokens = list(tokens)[-self.budget_tokens :]
        if len(tokens) <= self.min_ngram:
            return
        serial, self._next_serial = self._next_serial, self._next_serial + 1
        self.documents.append((serial, tokens))
        self.texts[serial] = tokens
        self.tokens_kept += len(tokens)
        for n in range(self.min_ngram, self.max_ngram + 1):
            for start, gram in enumerate(zip(*(tokens[i:] for i in range(n)))):
                self.starts.setdefault(gram, []).append((serial, start))
                self.entries += 1
        while self.tokens_kept > self.budget_tokens:
            old, old_tokens = self.documents.popleft()
            del self.texts[old]
            self.tokens_kept -= len(old_tokens)
        if self.entries > 2 * self.live_entries_bound():
            self.compact()

    def live_entries_bound(self) -> int:
        return max(1, self.tokens_kept * (self.max_ngram - self.min_ngram + 1))

    def compact(self) -> None:
        """Drop the index entries of evicted documents."""
        oldest = self.oldest_serial
        kept = {}
        for gram, places in self.starts.items():
            alive = [p for p in places if p[0] >= oldest]
            if alive:
                kept[gram] = alive
        self.starts = kept
        self.entries = sum(len(places) for places in kept.values())

    def continuation(self, context: Sequence[int], num_tokens: int) -> list[int]:
        """The draft for what follows `context`: from the longest matching n-gram, the most frequent next token of
        its occurrences, repeated while one token holds min_share of the occurrences still agreeing."""
        oldest = self.oldest_serial
        for n in range(min(self.max_ngram, len(context)), self.min_ngram - 1, -1):
            places = self.starts.get(tuple(context[len(context) - n :]), [])
            places = [(s, start + n) for s, start in places[-self.max_scanned :] if s >= oldest]
            if places:
                return self._follow(places, min(num_tokens, int(self.depth_per_match * n)))
        return []

    def _follow(self, places: list[tuple[int, int]], depth: int) -> list[int]:
        draft = []
        while len(draft) < depth:
            counts = Counter(self.texts[s][at] for s, at in places if at < len(self.texts[s]))
            if not counts:
                break
            token, count = counts.most_common(1)[0]
            if count < self.min_share * len(places):
                break
            draft.append(token)
            places = [(s, at + 1) for s, at in places if at < len(self.texts[s]) and self.texts[s][at] == token]
        return draft
