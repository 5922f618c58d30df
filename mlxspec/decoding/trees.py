"""Candidate trees: their shapes (chains, caterpillars, continuation and sparse trees), attention masks, and exact
verification. Pure functions and small dataclasses.

Nodes are in BFS order; node 0 is the root, the last accepted token that the target has not seen yet. Every other
node is a drafted token whose parent precedes it. Sibling tokens are distinct.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from mlxspec.decoding.sampling import sample


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


def caterpillar_chain_nodes(depth: int, topk: int) -> list[int]:
    """The node indices of a caterpillar's chain: node 1 + d*topk is the chain's token at depth d (0-based)."""
    return [1 + d * topk for d in range(depth)]


def caterpillar_parents(depth: int, topk: int) -> tuple[int, ...]:
    """A draft model's tree: its greedy chain with the top-k alternatives at every depth as sibling leaves.

    The other topk - 1 nodes of each depth are leaves hanging off the chain node above (caterpillar_chain_nodes).
    Parents include the root's -1.
    """
    chain_node = [0, *caterpillar_chain_nodes(depth, topk)]
    return (-1, *(chain_node[d] for d in range(depth) for _ in range(topk)))


def continuation_tree(continuations: list[list[int]]) -> tuple[list[int], list[int]]:
    """The prefix tree of token sequences in BFS order: (node tokens without the root, parents with the root's -1).

    Shared prefixes become one path, so siblings are distinct, as exact tree verification requires.
    """
    node_of: dict[tuple[int, ...], int] = {(): 0}
    tokens, parents = [], [-1]
    for depth in range(max(len(c) for c in continuations)):
        for continuation in continuations:
            prefix = tuple(continuation[: depth + 1])
            if len(prefix) == depth + 1 and prefix not in node_of:
                node_of[prefix] = len(parents)
                parents.append(node_of[prefix[:-1]])
                tokens.append(prefix[-1])
    return tokens, parents


def sparse_tree(topk_accuracy: list[list[float]], max_nodes: int, max_topk: int) -> list[tuple[int, ...]]:
    """Medusa's static sparse tree: the max_nodes rank-paths (r1, .., rd) with the highest estimated probability
    prod_d acc[d][r_d], each added only after its parent. Returned in BFS order (by depth, then probability)."""
    chosen: list[tuple[tuple[int, ...], float]] = []
    frontier = [((r,), topk_accuracy[0][r]) for r in range(min(max_topk, len(topk_accuracy[0])))]
    while frontier and len(chosen) < max_nodes:
        frontier.sort(key=lambda item: -item[1])
        path, prob = frontier.pop(0)
        chosen.append((path, prob))
        depth = len(path)
        if depth < len(topk_accuracy):
            frontier += [
                (path + (r,), prob * topk_accuracy[depth][r]) for r in range(min(max_topk, len(topk_accuracy[depth])))
            ]
    return [p for p, _ in sorted(chosen, key=lambda item: (len(item[0]), -item[1]))]


def heads_tree_paths(
    num_heads: int, topk_accuracy: list[list[float]], tree_nodes: int | None, tree_topk: int
) -> list[tuple[int, ...]]:
    """The static tree Medusa and Hydra heads draft, as rank paths in BFS order: the sparse tree their recorded
    top-k accuracies choose (halving guesses where none were recorded), or the top-1 chain."""
    if tree_topk == 1:
        return [(0,) * d for d in range(1, num_heads + 1)]
    accuracy = topk_accuracy or [[0.5 ** (r + 1) for r in range(tree_topk)]] * num_heads
    return sparse_tree(accuracy, tree_nodes or 4 * tree_topk, tree_topk)


def rank_paths_parents(paths: list[tuple[int, ...]]) -> tuple[int, ...]:
    """Parents (root's -1 first) of a BFS-ordered list of rank paths, each path's parent being its prefix."""
    index = {path: i + 1 for i, path in enumerate(paths)}
    return (-1, *(index.get(p[:-1], 0) for p in paths))


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
