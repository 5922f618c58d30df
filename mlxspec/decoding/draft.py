"""The engine's one contract with drafters: a Draft (a chain or a tree, with or without the distributions it was
drawn from), the Drafter protocol, and common_prefix.

A draft is either a sampled chain with the distributions it was drawn from (verified by Leviathan/Chen rejection
sampling), or a deterministic tree or chain (verified by sampling the target at every node; see trees.accept_tree).
Drafters live in mlxspec/drafting/; none of them affects exactness.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx

from mlxspec.decoding.trees import TreeShape


@dataclass
class Draft:
    tokens: mx.array  # [M] int32 drafted tokens, lazy; tree nodes 1..M in BFS order
    probs: mx.array | None = None  # [M, V] the distributions sampled from; None for deterministic drafts
    shape: TreeShape | None = None  # the tree including its root; None for a chain

    @property
    def tree(self) -> TreeShape:
        return self.shape or TreeShape.chain(self.tokens.shape[0])


class Drafter(Protocol):
    """What the engine asks of a drafter. Subclass it to inherit the defaults of the optional parts."""

    calls: int
    uses_target_hidden: bool = False  # True: the engine hands over the target's features after every step
    target_taps: tuple[int, ...] = ()  # with uses_target_hidden: the target layers whose outputs are the features
    max_nodes: int = 0  # the most nodes one proposal may hold (0: no more than the engine's num_draft)
    max_depth: int = 0  # the deepest it can draft whatever it is asked (Medusa: its heads); 0: as deep as asked
    # True: its state follows the committed tokens alone, so an adaptive run may prefill it at its first draft, and
    # a run the controller keeps plain never pays for it (a draft model's prompt)
    prefill_may_wait: bool = False

    def prefill(self, history: Sequence[int]) -> None:
        """Start on `history`, the engine's committed tokens (the prompt so far; its last token is where drafting
        continues from). The engine owns it and extends it after every step, before `accept`: a drafter reads it
        and never keeps a copy."""

    def catch_up(self) -> None:
        """Before a draft that follows plain steps: feed what it has not seen of the committed tokens but the last,
        so the engine times that apart from the step (default: nothing to feed)."""

    def reusable(self, prompt: list[int]) -> int:
        """After a finished run: how many leading tokens of a new prompt this drafter's state already covers and can
        keep (prompt_cache.py). 0 (the default): none, so a fresh drafter is prefilled instead."""
        return 0

    def resume(self, history: Sequence[int], reused: int) -> None:
        """Keep the state of history[:reused] (0 < reused <= reusable(history)), then start on `history` as prefill
        does."""
        raise NotImplementedError

    def propose(self, num_tokens: int, key: mx.array | None) -> Draft | None:
        """Draft about num_tokens tokens (a chain of that length, or a tree that deep) lazily, or None."""

    def batch_key(self, num_tokens: int) -> Hashable | None:
        """Rows whose drafters give equal keys (and are of one type) may draft in one call, `propose_together`
        (batching.py); None, the default: this draft runs alone."""
        return None

    @classmethod
    def propose_together(cls, drafters: list[Drafter], num_tokens: int) -> list[Draft]:
        """Each drafter's propose(num_tokens, None), computed together; only for drafters with equal batch keys."""
        raise NotImplementedError

    def accept(self, emitted: list[int], drafted: list[int]) -> None:
        """The step's outcome, already committed to the history: the emitted tokens and, as host ints, the tokens
        this drafter proposed."""

    def set_hidden(self, hidden: mx.array | None) -> None:
        """The target's features at the positions its cache just kept, in order (lazy): its final hidden states
        [n, D], or with target_taps the tapped layers' outputs concatenated [n, len(taps) * D]. After the prefill
        every prompt row but the last, after a step the fed token's row and the kept drafts'. Only called when
        uses_target_hidden."""


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
