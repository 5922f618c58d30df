"""Drafting with a feature head (feature_head.py): EAGLE heads and native MTP heads.

The head keeps its own small KV cache over the true context: row t holds its input (x_{t+1}, f_t), with f_t the
target's hidden state that the engine hands over after every step. A proposal first feeds the rows the last step
kept (fused with the first draft step, so still lazy), then drafts from its own predicted features:
- a chain, greedy or sampled from the head's processed distribution q (verified by Leviathan/Chen with q);
- an EAGLE-2 dynamic tree: at each depth the `beam` nodes of highest cumulative draft probability are expanded
  (each row reading only its ancestors, through a tree mask and per-row RoPE positions), then every candidate is
  ranked by that probability and the best `max_nodes` form the tree, verified node by node by sampling the target
  (exact at every temperature). Its shape depends on the data, so building it costs one host sync of its own.
After the step the draft rows are trimmed off the head cache; rollback is moving its offset.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import KVCache

from mlxspec.decoding.draft import Draft, Drafter, common_prefix
from mlxspec.decoding.sampling import SamplingConfig, coupled_candidates, pick_draft_token
from mlxspec.decoding.tree_attention import tree_context
from mlxspec.decoding.trees import TreeShape
from mlxspec.drafting.heads.feature_head import HeadOnTarget


class FeatureDrafter(Drafter):
    uses_target_hidden = True

    def __init__(self, wired: HeadOnTarget, sampling: SamplingConfig, beam: int = 1, max_nodes: int = 0):
        self.wired = wired  # HeadOnTarget (EAGLE, MTP) or eagle3_model.Eagle3OnTarget: the same step()
        self.target_taps = wired.target_taps
        self.sampling = sampling
        self.beam = beam  # > 1: an EAGLE-2 dynamic tree expanding this many nodes per depth
        self.max_nodes = max_nodes if beam > 1 else 0
        self.cache = KVCache()
        self.history: Sequence[int] = []  # the engine's committed tokens, the pending one last (read, never copied)
        self.features: list[mx.array] = []  # [n_i, D] target hidden rows not yet fed to the head
        self.fed = 0  # rows of true context in the head cache
        self.calls = 0
        self.host_syncs = 0  # the dynamic tree's own syncs (chains have none)

    def prefill(self, history: Sequence[int]) -> None:
        self.history = history
        self.cache = KVCache()
        self.features, self.fed = [], 0

    def reusable(self, prompt: list[int]) -> int:
        # Head row t reads token t+1 and the target's feature t, so keeping r rows needs prompt[:r+1] unchanged; the
        # target then recomputes features from position r on (uses_target_hidden bounds its reuse by this).
        return max(0, min(self.fed, common_prefix(self.history, prompt) - 1))

    def resume(self, history: Sequence[int], reused: int) -> None:
        self.cache.trim(self.cache.offset - reused)
        self.history, self.features, self.fed = history, [], reused

    def set_hidden(self, hidden: mx.array | None) -> None:
        if hidden is not None:
            self.features.append(hidden)

    def accept(self, emitted: list[int], drafted: list[int]) -> None:
        self.cache.trim(self.cache.offset - self.fed)  # drop the draft rows: only the true context stays

    def _catch_up(self) -> tuple[mx.array, mx.array] | None:
        """Feed the rows the target kept since the last proposal: (logits [V], feature [D]) of the last row, which
        predict the token after the pending one."""
        if not self.features:
            return None
        features = mx.concatenate(self.features)[None]
        rows = features.shape[1]
        tokens = mx.array(self.history[self.fed + 1 : self.fed + 1 + rows], dtype=mx.int32)[None]
        # An explicit causal mask: some families' attention (Gemma 2) takes no "causal" shorthand.
        offset = self.cache.offset
        mask = mx.arange(offset + rows)[None] <= mx.arange(offset, offset + rows)[:, None] if rows > 1 else None
        logits, produced = self.wired.step(tokens, features, mask, self.cache, at_start=offset == 0)
        self.features, self.fed = [], self.fed + rows
        return logits[0, -1], produced[0, -1]

    def propose(self, num_tokens: int, keys: mx.array | None) -> Draft | None:
        start = self._catch_up()
        if start is None:
            return None
        self.calls += 1
        if self.beam > 1:
            return self._tree(*start, num_tokens, None if self.sampling.greedy else keys)
        return self._chain(*start, num_tokens, keys)

    def _chain(self, logits: mx.array, feature: mx.array, num_tokens: int, keys: mx.array | None) -> Draft:
        tokens, probs = [], []
        for i in range(num_tokens):
            token, proposed, q = pick_draft_token(logits, self.sampling, 1, None if keys is None else keys[i])
            tokens.append(proposed)
            if q is not None:
                probs.append(q)
            if i + 1 < num_tokens:
                out, produced = self.wired.step(token.reshape(1, 1), feature.reshape(1, 1, -1), None, self.cache)
                logits, feature = out[0, -1], produced[0, -1]
        return Draft(mx.concatenate(tokens), mx.stack(probs) if probs else None)

    def _tree(self, logits: mx.array, feature: mx.array, depth: int, keys: mx.array | None) -> Draft:
        """EAGLE-2: expand the `beam` best nodes per depth, then keep the max_nodes best candidates overall.
        Sampled (keys [depth, 2]): the spine, each depth's coupled draw under the spine node before it, is expanded
        and kept first; its children lead with the coupled draw (sampling.coupled_candidates)."""
        beam, position = self.beam, self.cache.offset
        # Candidates, depth by depth: tokens [beam*beam] (beam at depth 1), cumulative log-probs, parent candidate.
        logp = nn.log_softmax(logits.astype(mx.float32))
        first = self._children(logits[None], keys, 0)[0]
        spine = [0]  # candidate ids of the spine (sampled); frontier row 0 is always its last node
        cand_tokens, cand_scores, cand_parents = [first], [logp[first]], [mx.full((beam,), -1, dtype=mx.int32)]
        frontier = mx.arange(beam)  # candidate ids of the nodes expanded next
        frontier_features = mx.broadcast_to(feature, (beam, feature.shape[-1]))
        ancestors = mx.zeros((beam, 0), dtype=mx.bool_)  # which fed draft rows each frontier row may read
        offset = 0  # candidate id of the first candidate of the current depth
        context = tree_context(self.wired.head)  # the head's RoPE wrappers, installed once
        try:
            for d in range(1, depth):
                ids = frontier - offset
                tokens = cand_tokens[-1][ids]
                ancestors = mx.concatenate([ancestors, mx.eye(beam, dtype=mx.bool_)], axis=1)
                mask = mx.concatenate([mx.ones((beam, position), dtype=mx.bool_), ancestors], axis=1)
                context.positions = mx.full((beam,), position + d - 1, dtype=mx.int32)
                out, produced = self.wired.step(tokens[None], frontier_features[None], mask, self.cache)
                child_logp = nn.log_softmax(out[0].astype(mx.float32), axis=-1)  # [beam, V]
                top = self._children(out[0], keys, d)  # [beam, beam]
                scores = cand_scores[-1][ids][:, None] + mx.take_along_axis(child_logp, top, axis=-1)
                offset += cand_tokens[-1].shape[0]
                cand_tokens.append(top.reshape(-1))
                cand_scores.append(scores.reshape(-1))
                cand_parents.append(mx.repeat(frontier, beam).astype(mx.int32))
                ranking = scores.reshape(-1)
                if keys is not None:  # the spine's new node (row 0's first child) stays in the frontier, in row 0
                    ranking = mx.concatenate([mx.array([mx.inf]), ranking[1:]])
                    spine.append(offset)
                best = mx.argsort(-ranking)[:beam]
                slot = best // beam  # which frontier row each new frontier node came from
                frontier = offset + best
                frontier_features = produced[0][slot]
                ancestors = ancestors[slot]
        finally:
            context.positions = None  # the wrappers pass through again
        tokens = mx.concatenate(cand_tokens)
        values = mx.concatenate([tokens, mx.concatenate(cand_parents)]).tolist()
        scores = np.array(mx.concatenate(cand_scores).astype(mx.float32))
        if keys is not None:
            scores[spine] = np.inf  # kept first, depth by depth
        self.host_syncs += 1
        count = tokens.shape[0]
        return self._ranked_tree(values[:count], values[count:], scores)

    def _children(self, logits: mx.array, keys: mx.array | None, depth_index: int) -> mx.array:
        """[rows, beam] children of rows of logits [rows, V]: the top `beam`; sampled, row 0's (the spine's) lead
        with its coupled draw under keys[depth_index]."""
        if keys is None:
            return mx.argsort(-logits.astype(mx.float32), axis=-1)[:, : self.beam].astype(mx.int32)
        spine = coupled_candidates(logits[:1], self.sampling, keys[depth_index : depth_index + 1], self.beam)
        others = mx.argsort(-logits[1:].astype(mx.float32), axis=-1)[:, : self.beam].astype(mx.int32)
        return mx.concatenate([spine, others])  # (row 0 sorted once, inside coupled_candidates)

    def _ranked_tree(self, tokens: list[int], parents: list[int], scores: np.ndarray) -> Draft:
        """The max_nodes candidates of highest cumulative log-prob (their ancestors included), in BFS order."""
        chosen: set[int] = set()
        for c in np.argsort(-scores, kind="stable"):
            path = []
            while c >= 0 and c not in chosen:
                path.append(int(c))
                c = parents[c]
            if len(chosen) + len(path) > self.max_nodes:
                continue
            chosen.update(path)
            if len(chosen) == self.max_nodes:
                break
        depth = {}
        for c in sorted(chosen):  # parents have lower ids than children
            depth[c] = 1 if parents[c] < 0 else depth[parents[c]] + 1
        order = sorted(chosen, key=lambda c: (depth[c], c))
        node = {c: i + 1 for i, c in enumerate(order)}  # tree node ids; 0 is the root (the pending token)
        shape = TreeShape((-1, *[node.get(parents[c], 0) for c in order]))
        return Draft(mx.array([tokens[c] for c in order], dtype=mx.int32), None, shape)
