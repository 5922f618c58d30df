"""Hydra heads: Medusa heads that also read the token before the one they guess (Ankner et al., 2024).

A Medusa head guesses token t+d+1 from the hidden state at t alone, blind to the tokens between. A Hydra head
threads a state through the draft instead: the state starts as the target's hidden state at t and each head folds
in the embedding of one more token, s_d = s_{d-1} + W2 silu(W1 [s_{d-1} ; norm(embed(x_{t+d}))]), so head d's guess
for x_{t+d+1} (the target's LM head on s_d) knows the drafted path that leads to it. Head 1 reads the pending
token x_{t+1}, which the target already chose. In a tree every node carries its own state, so the heads run once
per depth over that depth's nodes (no host sync: the tree's shape is fixed).
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn

from mlxspec.decoding.draft import Draft, Drafter
from mlxspec.decoding.target_features import output_head, text_model
from mlxspec.decoding.trees import TreeShape, heads_tree_paths, rank_paths_parents


class HydraBlock(nn.Module):
    """One head's update of the draft state. W2 starts at zero: an untrained head passes its state on unchanged."""

    def __init__(self, dims: int):
        super().__init__()
        self.token_norm = nn.RMSNorm(dims)
        self.mix = nn.Linear(2 * dims, dims)
        self.out = nn.Linear(dims, dims)
        self.out.weight = mx.zeros_like(self.out.weight)
        self.out.bias = mx.zeros_like(self.out.bias)

    def __call__(self, state: mx.array, embedded: mx.array) -> mx.array:
        joined = mx.concatenate([state, self.token_norm(embedded)], axis=-1)
        return state + self.out(nn.silu(self.mix(joined)))


class HydraHeads(nn.Module):
    """config: a MedusaConfig with style "hydra" (Hydra heads always share the target's LM head)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.blocks = [HydraBlock(config.hidden_size) for _ in range(config.num_heads)]

    def teacher_forced(self, hidden: mx.array, embedded: mx.array, base_head) -> list[mx.array]:
        """Training's view: hidden [B, T, D] and the embeddings [B, T, D] of the tokens that follow each position
        (embedded[:, t] embeds x_{t+1}). -> one [B, T - H, V] logits array per head; head d's row t guesses
        x_{t+d+1}."""
        length = hidden.shape[1] - self.config.num_heads
        state, outs = hidden[:, :length], []
        for d, block in enumerate(self.blocks):
            state = block(state, embedded[:, d : d + length])
            outs.append(base_head(state))
        return outs


def level_plan(paths: list[tuple[int, ...]]) -> list[tuple[mx.array, mx.array]]:
    """For each depth d >= 1 of a BFS-ordered list of rank paths: (the position of each depth-d node's parent among
    the depth-(d-1) nodes, the node's rank among its parent's guesses)."""
    by_depth: dict[int, list[tuple[int, ...]]] = {}
    for path in paths:
        by_depth.setdefault(len(path), []).append(path)
    plan, previous = [], {(): 0}
    for depth in range(1, max(by_depth) + 1):
        level = by_depth[depth]
        plan.append((mx.array([previous[p[:-1]] for p in level]), mx.array([p[-1] for p in level])))
        previous = {p: i for i, p in enumerate(level)}
    return plan


class HydraDrafter(Drafter):
    """Drafts a static sparse tree (or the top-1 chain) from Hydra heads on the target's last hidden state."""

    uses_target_hidden = True

    def __init__(self, heads: HydraHeads, target: nn.Module, tree_nodes: int | None = None, tree_topk: int = 1):
        self.heads, self.base_head = heads, output_head(target)
        self.embed = text_model(target).model.embed_tokens
        self.max_depth = heads.config.num_heads
        self.paths = heads_tree_paths(heads.config.num_heads, heads.config.topk_accuracy, tree_nodes, tree_topk)
        self.max_rank = 1 + max(max(p) for p in self.paths)
        self.max_nodes = len(self.paths)
        self.shape_parents = rank_paths_parents(self.paths)
        self.levels = level_plan(self.paths)
        self.history: Sequence[int] = []
        self.hidden: mx.array | None = None
        self.calls = 0

    def prefill(self, history: Sequence[int]) -> None:
        self.history, self.hidden = history, None

    def reusable(self, prompt: list[int]) -> int:
        return len(prompt) - 2  # stateless, but the last prompt row's hidden state must be recomputed

    def resume(self, history: Sequence[int], reused: int) -> None:
        self.prefill(history)

    def set_hidden(self, hidden: mx.array | None) -> None:
        """The target's final hidden states [n, D] of the rows it kept; the last is the token before the pending
        one, which is the history's last token (lazy; no sync)."""
        self.hidden = None if hidden is None else hidden[-1]

    def propose(self, num_tokens: int, key: mx.array | None) -> Draft | None:
        if self.hidden is None or not self.history:
            return None
        count = sum(len(p) <= num_tokens for p in self.paths)  # paths are BFS-ordered: a prefix of them
        if count == 0:
            return None
        states, tokens = self.hidden[None], mx.array([self.history[-1]], dtype=mx.int32)
        drafted = []
        for block, (parent, rank) in zip(self.heads.blocks, self.levels[: len(self.paths[count - 1])]):
            states = block(states, self.embed(tokens))  # one state per node of the previous depth
            guesses = mx.argsort(-self.base_head(states), axis=-1)[:, : self.max_rank].astype(mx.int32)
            tokens, states = guesses[parent, rank], states[parent]
            drafted.append(tokens)
        self.calls += 1
        return Draft(mx.concatenate(drafted)[:count], None, TreeShape(self.shape_parents[: count + 1]))

    def accept(self, emitted: list[int], drafted: list[int]) -> None:
        pass  # the engine hands the new hidden state over through set_hidden; the history is the engine's
