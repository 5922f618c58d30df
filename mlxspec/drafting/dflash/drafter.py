"""Drafting with a DFlash block drafter (dflash_model.py): one drafter forward per step, for a chain or a DDTree.

The drafter keeps a KV cache of context rows, one per committed position but the pending one, built from the taps
the engine hands over. A proposal feeds the rows kept since the last one, then reads the block
[pending token, MASK x n] at the positions after them, and takes one distribution per block row:
- a chain at T=0: each row's argmax;
- a chain at T>0: each row's token drawn from its processed q_i (the target's own temperature and filters), and
  verified by Leviathan/Chen with those q_i. The q_i do not condition on the tokens drafted before row i, and
  need not: rejection sampling is exact for any proposal whose law the verifier knows, and row i's token is drawn
  from q_i whatever came before it (docs/how-it-works.md#block-drafters);
- a DDTree (Ringel et al.): the `max_nodes` paths of highest joint draft probability prod_i q_i(t_i), found
  best-first over each row's `topk` candidates, ancestors kept, and verified node by node by sampling the target:
  exact at every temperature. Building it costs one host sync and no further drafter forward.
Rollback costs nothing: the block's own rows never enter the cache.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn

from mlxspec.decoding.draft import Draft, Drafter, common_prefix
from mlxspec.decoding.sampling import SamplingConfig, coupled_candidates, draft_draw
from mlxspec.decoding.target_features import output_head, text_model
from mlxspec.decoding.trees import TreeShape
from mlxspec.drafting.dflash.model import DFlashDraftModel


class DFlashDrafter(Drafter):
    uses_target_hidden = True

    def __init__(
        self,
        model: DFlashDraftModel,
        target: nn.Module,
        sampling: SamplingConfig,
        tree_topk: int = 1,
        max_nodes: int = 0,
    ):
        self.model = model
        self.sampling = sampling
        self.embed = text_model(target).model.embed_tokens  # the target's, as the run calls it (routed or not)
        self.head = output_head(target)
        self.target_taps = tuple(model.config.target_layer_ids)
        self.mask_token = model.config.mask_token_id
        self.max_depth = model.config.block_size - 1  # rows a block was trained to fill
        self.tree_topk = tree_topk
        self.max_nodes = max_nodes if tree_topk > 1 else 0
        self.cache = model.make_cache()
        self.history: Sequence[int] = []  # the engine's committed tokens, the pending one last (read, never copied)
        self.features: list[mx.array] = []  # [n_i, taps * D] target rows not yet fed to the drafter
        self.calls = 0
        self.host_syncs = 0  # the DDTree's own syncs (chains have none)

    @property
    def fed(self) -> int:
        """Context rows in the drafter cache: positions 0..fed-1."""
        return self.cache[0].offset

    def prefill(self, history: Sequence[int]) -> None:
        self.history, self.features = history, []
        self.cache = self.model.make_cache()

    def reusable(self, prompt: list[int]) -> int:
        # Row t reads the target's taps at position t, which depend on prompt[:t+1] alone.
        return max(0, min(self.fed, common_prefix(self.history, prompt)))

    def resume(self, history: Sequence[int], reused: int) -> None:
        for layer_cache in self.cache:
            layer_cache.trim(layer_cache.offset - reused)
        self.history, self.features = history, []

    def set_hidden(self, hidden: mx.array | None) -> None:
        if hidden is not None:
            self.features.append(hidden)

    def accept(self, emitted: list[int], drafted: list[int]) -> None:
        pass  # the engine hands the kept rows' taps to set_hidden; the block rows were never cached

    def block_logits(self, num_tokens: int) -> mx.array:
        """[num_tokens, V] the drafter's logits for the positions after the pending token (one forward, lazy)."""
        taps = mx.concatenate(self.features)[None] if self.features else None
        self.features = []
        block = mx.array([self.history[-1]] + [self.mask_token] * num_tokens, dtype=mx.int32)[None]
        hidden = self.model(self.embed(block), taps, self.cache)
        return self.head(hidden[0, 1:])

    def propose(self, num_tokens: int, key: mx.array | None) -> Draft | None:
        num_tokens = min(num_tokens, self.max_depth)
        if num_tokens < 1:
            return None
        self.calls += 1
        logits = self.block_logits(num_tokens)
        if self.tree_topk > 1:
            return self._tree(logits, None if self.sampling.greedy else key[:num_tokens])
        if self.sampling.greedy:
            return Draft(mx.argmax(logits, axis=-1).astype(mx.int32))
        rows = [draft_draw(logits[i], self.sampling, key[i]) for i in range(num_tokens)]  # coupled (keys.py)
        return Draft(mx.stack([token for token, _ in rows]), mx.stack([q for _, q in rows]))

    def _tree(self, logits: mx.array, keys: mx.array | None) -> Draft:
        """DDTree over the block's rows; sampled (keys [n, 2]), each row's coupled draw leads its candidates and the
        path of coupled draws enters the tree first (best_first_tree's spine)."""
        logp = nn.log_softmax(logits.astype(mx.float32), axis=-1)
        if keys is None:
            top = mx.argsort(-logp, axis=-1)[:, : self.tree_topk].astype(mx.int32)  # [n, k]
        else:
            top = coupled_candidates(logits, self.sampling, keys, self.tree_topk)
        scores = mx.take_along_axis(logp, top, axis=-1)
        values = mx.concatenate([top.astype(mx.float32), scores]).tolist()  # (ids are exact in float32)
        self.host_syncs += 1
        rows = len(values) // 2
        tokens, logps = [[int(t) for t in row] for row in values[:rows]], values[rows:]
        shape, chosen = best_first_tree(logps, self.max_nodes, spine=keys is not None)
        return Draft(mx.array([tokens[len(path) - 1][path[-1]] for path in chosen], dtype=mx.int32), None, shape)


def block_seconds(
    model: DFlashDraftModel,
    target: nn.Module,
    sampling: SamplingConfig = SamplingConfig(),
    context: int = 256,
    repeats: int = 7,
) -> float:
    """Median seconds of one full proposal (block_size rows, drawn as `sampling` draws them: at T>0 that adds each
    row's q) at `context` committed positions: the drafter's cost per drafting step, which the draft-length
    controller adds to verification (it barely depends on k)."""
    import statistics
    import time

    drafter = DFlashDrafter(model, target, sampling)
    drafter.prefill([0] * (context + 1))
    width = len(drafter.target_taps) * model.config.hidden_size
    drafter.set_hidden(mx.zeros((context, width), dtype=model.fc.weight.dtype))
    mx.eval(drafter.block_logits(drafter.max_depth))  # fills the context rows; later blocks only read them
    times = []
    keys = mx.random.split(mx.random.key(0), drafter.max_depth)  # one key per depth, as the engine hands them
    for _ in range(repeats + 1):
        start = time.perf_counter()
        draft = drafter.propose(drafter.max_depth, keys)
        mx.eval(draft.tokens, draft.probs if draft.probs is not None else draft.tokens)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def best_first_tree(
    logps: list[list[float]], max_nodes: int, spine: bool = False
) -> tuple[TreeShape, list[tuple[int, ...]]]:
    """DDTree's tree: of all paths (r_1..r_d) over each row's candidates (ranks r_i, log-probs logps[i][r_i], best
    first after rank 0), the max_nodes of highest joint log-prob; a path enters only after its parent, so ancestors
    are kept. `spine`: the path of rank 0s (sampled: the coupled draws) enters first, whole, whatever its score.
    -> (the TreeShape, root included, and each node's path of ranks, in BFS order)."""
    depth_limit, width = len(logps), len(logps[0])
    heap = [(not spine, -logps[0][0], (0,))]
    chosen: list[tuple[int, ...]] = []
    while heap and len(chosen) < max_nodes:
        later, neg, path = heapq.heappop(heap)
        chosen.append(path)
        if len(path) < depth_limit:  # its first child (on the spine when its parent is)
            heapq.heappush(heap, (later, neg - logps[len(path)][0], (*path, 0)))
        if path[-1] + 1 < width:  # its next sibling
            sibling = (*path[:-1], path[-1] + 1)
            score = neg + logps[len(path) - 1][path[-1]] - logps[len(path) - 1][path[-1] + 1]
            heapq.heappush(heap, (True, score, sibling))
    popped = {path: i for i, path in enumerate(chosen)}
    chosen.sort(key=lambda path: (len(path), popped[path]))  # BFS: by depth, then best first
    node = {path: i + 1 for i, path in enumerate(chosen)}  # 0 is the root, the pending token
    return TreeShape((-1, *[node.get(path[:-1], 0) for path in chosen])), chosen
