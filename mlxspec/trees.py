"""Candidate trees: structure, attention masks, and exact verification. Pure functions and small dataclasses.

Nodes are in BFS order; node 0 is the root, the last accepted token that the target has not seen yet. Every other
node is a drafted token whose parent precedes it. Sibling tokens are distinct.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from .sampling import sample


@dataclass(frozen=True)
class TreeShape:
    parents: tuple[int, ...]  # parents[0] == -1

    def __post_init__(self):
        assert self.parents[0] == -1 and all(0 <= p < i for i, p in enumerate(self.parents) if i)

    @property
    def size(self) -> int:
        return len(self.parents)

    @property
    def depths(self) -> tuple[int, ...]:
        depths = [0] * self.size
        for i in range(1, self.size):
            depths[i] = depths[self.parents[i]] + 1
        return tuple(depths)

    @property
    def is_chain(self) -> bool:
        return self.parents == tuple(range(-1, self.size - 1))

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    def path_to(self, node: int) -> list[int]:
        """Nodes from the root's first child down to `node` (empty for the root)."""
        path = []
        while node > 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    @classmethod
    def chain(cls, length: int) -> TreeShape:
        return cls(tuple(range(-1, length)))


def ancestor_mask(shape: TreeShape) -> mx.array:
    """[N, N] bool: mask[i, j] is True when node j is node i or one of its ancestors (what node i may attend to)."""
    n = shape.size
    rows = []
    for i in range(n):
        row = [False] * n
        node = i
        while node >= 0:
            row[node] = True
            node = shape.parents[node]
        rows.append(row)
    return mx.array(rows)


def accept_tree(
    tokens: mx.array, parents: mx.array, target_probs: mx.array, key: mx.array, max_depth: int, greedy: bool = False
) -> tuple[mx.array, mx.array]:
    """Exact verification of deterministic drafts (top-k trees, prompt lookup): one target sample per node.

    tokens: [N] int32 node tokens (node 0 is the root). parents: [N] int32 (parents[0] = 0 here).
    target_probs: [N, V] processed target distribution after each node's path.
    Returns (deepest accepted node [] int32, next token [] int32).

    At each node, draw y ~ p(.|path); if a child carries y, descend into it, else emit y. For distinct deterministic
    candidates this is recursive rejection sampling with one-hot q (accept x_j w.p. p_res(x_j), else remove it), so
    the output is exactly the target's law; with greedy probs (one-hot argmax) it is the longest argmax-matching path.
    """
    return accept_tree_samples(tokens, parents, sample(target_probs, key, greedy), max_depth)


def accept_tree_samples(
    tokens: mx.array, parents: mx.array, samples: mx.array, max_depth: int
) -> tuple[mx.array, mx.array]:
    """accept_tree given the target's draw at every node: samples [N] int32 (argmax when greedy)."""
    matches = tokens == samples[parents]
    is_root = mx.arange(tokens.shape[0]) == 0
    reached = is_root
    for _ in range(max_depth):
        reached = is_root | (matches & reached[parents])
    depth_rank = mx.where(reached, mx.arange(tokens.shape[0]) + 1, 0)
    # Siblings are distinct, so reached nodes form one path; its deepest node is the largest BFS index reached.
    deepest = mx.argmax(depth_rank).astype(mx.int32)
    return deepest, samples[deepest]
