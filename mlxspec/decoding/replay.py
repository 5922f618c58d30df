"""Deferred replay: how a step rolls back recurrent layers (SSM, linear attention), which cannot be trimmed.

A step that rejects drafts rewinds those layers to a snapshot taken before its forward; the tokens the step should
have kept are fed again at the front of the next forward, which widens that pass instead of costing one more
(recurrent.py holds the snapshots). Each rejection rewinds to before the whole forward, replay included, so replay
grows over a run of rejections: past `max_merged` tokens it is fed as a forward of its own ahead of the verify
forward (queued in the same step: still one sync), after which the snapshot is taken, so widths stay bounded.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from mlxspec.cache.recurrent import Snapshot, recurrent_leaves, rewind, snapshot


class DeferredReplay:
    """The replay state of one target cache. `tokens` are accepted tokens the rewound cache has yet to see again."""

    def __init__(self, cache: list, max_merged: int):
        self.cache = cache
        self.recurrent = recurrent_leaves(cache)  # empty: attention only, nothing is ever replayed
        self.max_merged = max_merged
        self.tokens: list[int] = []
        self.fed: list[int] = []  # the host tokens fed ahead of the drafts in the last forward (replay + pending)
        self.before: Snapshot = []  # the recurrent state before the last forward
        self.replayed = 0  # tokens fed again, in all
        self.catch_up_forwards = 0  # forwards of replay alone (past max_merged)

    def needs_own_forward(self) -> bool:
        return len(self.tokens) > self.max_merged

    def feed_alone(self, target: nn.Module) -> int:
        """Queue a forward of the replay tokens only (its logits are never evaluated, so never computed); returns
        how many positions it fed."""
        width = len(self.tokens)
        target(mx.array(self.tokens, dtype=mx.int32)[None], cache=self.cache)
        self.replayed += width
        self.catch_up_forwards += 1
        self.tokens = []
        return width

    def ahead_of(self, pending: list[int]) -> tuple[list[int], int]:
        """Before a forward: the host tokens it feeds ahead of the drafts (the replay, then `pending`) and how many
        of them are replayed; snapshots the recurrent state it may have to rewind to."""
        self.fed, skip = self.tokens + pending, len(self.tokens)
        if self.recurrent:
            self.before = snapshot(self.recurrent)
        self.replayed += skip
        self.tokens = []
        return self.fed, skip

    def rewind(self, num_drafted: int, kept: list[int]) -> int:
        """After a forward whose drafts were partly rejected: back to before it, with the tokens fed ahead of the
        drafts and the `kept` drafts queued for the next forward; returns the positions undone."""
        undone = len(self.fed) + num_drafted
        rewind(self.cache, self.before, undone)
        self.tokens = self.fed + kept
        return undone
