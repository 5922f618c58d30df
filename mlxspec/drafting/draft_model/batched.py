"""The greedy draft chains of many batched rows as one compiled graph: one draft forward per depth for all of them.

In a batch (batching.py) each row's draft model used to run its chain alone, row after row: with 8 rows on the
widened bed that was about 4 ms a row, an eighth of a round (scripts/profile_batch.py). Here the rows' fixed-
capacity KV buffers (compiled_draft.py) are stacked [B, heads, capacity, dim] with one offset per row, the rows'
pending tokens are fed right-padded to the longest, and every later depth feeds each row's own draft token: the
draft model runs K forwards for the whole batch instead of K per row. Afterwards each row takes its own slice of
the buffers back. A padded input writes stale keys past its row's offset, which the mask hides and later writes
overwrite, as rolled-back keys are in a single chain.

Only greedy chains are batched: a greedy draft needs no distribution, so the batched matmuls' rounding (a row's
result may differ in the last bits from its forward alone) can only change which tokens are proposed, never the
output. A sampled draft's distribution enters the rejection step, and a seeded sampled run is to repeat token for
token whether it decodes alone or in a batch, so sampled rows keep drafting alone.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxspec.drafting.draft_model.compiled import CompiledDraftChain, compiled_for


class RowsKVCache:
    """mlx-lm's cache interface over stacked fixed-capacity buffers [B, kv_heads, capacity, head_dim], each row at
    its own position `offset` [B] (RoPE reads it per row)."""

    def __init__(self, keys: mx.array, values: mx.array, offset: mx.array):
        self.keys, self.values, self.offset = keys, values, offset

    def _write(self, buffer: mx.array, new: mx.array) -> mx.array:
        positions = self.offset[:, None] + mx.arange(new.shape[2])[None]  # [B, N]
        index = mx.broadcast_to(positions[:, None, :, None], new.shape)
        return mx.put_along_axis(buffer, index, new.astype(buffer.dtype), axis=2)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        self.keys, self.values = self._write(self.keys, keys), self._write(self.values, values)
        return self.keys, self.values

    def make_mask(self, N: int, window_size: int | None = None, return_array: bool = False, **kwargs: Any):
        """[B, 1, N, capacity] bool: row b's query i (at offset_b + i) sees its keys at positions <= its own."""
        queries = self.offset[:, None, None] + mx.arange(N)[None, :, None]
        keys = mx.arange(self.keys.shape[2])[None, None, :]
        mask = keys <= queries
        if window_size:
            mask = mask & (keys > queries - window_size)
        return mask[:, None]


def rows_chain_graph(model, inputs, lengths, offset, keys, values, num_tokens):
    """inputs [B, W] (row b's first lengths[b] tokens real) fed at each row's offset, then greedy draft steps.
    Returns (tokens [B, num_tokens], new keys, new values)."""
    caches = [RowsKVCache(k, v, offset) for k, v in zip(keys, values)]
    logits = model(inputs, cache=caches)
    last = logits[mx.arange(inputs.shape[0]), lengths - 1]  # each row's logits after its own last pending token
    position = offset + lengths
    tokens = []
    for depth in range(num_tokens):
        token = mx.argmax(last, axis=-1).astype(mx.int32)
        tokens.append(token)
        if depth + 1 < num_tokens:  # as a single chain, the last draft token is not fed
            for c in caches:
                c.offset = position
            last = model(token[:, None], cache=caches)[:, -1]
            position = position + 1
    return mx.stack(tokens, axis=1), [c.keys for c in caches], [c.values for c in caches]


def stacked(buffers: list[mx.array], capacity: int) -> mx.array:
    """[1, heads, c_b, dim] buffers zero-padded to `capacity` positions and stacked along the batch."""
    return mx.concatenate([mx.pad(b, [(0, 0), (0, 0), (0, capacity - b.shape[2]), (0, 0)]) for b in buffers])


def propose_rows(model: nn.Module, chains: list[CompiledDraftChain], pending: list[list[int]], num_tokens: int):
    """Greedy chains of num_tokens for every row at once: row b feeds pending[b] to chains[b] (the rows' compiled
    chains over `model`). Each chain keeps pending + its first K-1 drafts, as CompiledDraftChain.propose does.
    Returns the drafted tokens [B, num_tokens], lazy."""
    width = max(len(p) for p in pending)
    for chain in chains:  # room for the padded inputs too
        chain.reserve(chain.offset + width + num_tokens)
    capacities = [chain.capacity for chain in chains]
    layers = range(len(chains[0].keys))
    keys = [stacked([chain.keys[i] for chain in chains], max(capacities)) for i in layers]
    values = [stacked([chain.values[i] for chain in chains], max(capacities)) for i in layers]
    inputs = mx.array([p + [0] * (width - len(p)) for p in pending], dtype=mx.int32)
    lengths = mx.array([len(p) for p in pending], dtype=mx.int32)
    offset = mx.array([chain.offset for chain in chains], dtype=mx.int32)
    rows_chain = compiled_for(model, "_mlxspec_compiled_row_chains", (), rows_chain_graph)
    tokens, keys, values = rows_chain(inputs, lengths, offset, keys, values, num_tokens)
    for b, chain in enumerate(chains):
        chain.keys = [k[b : b + 1, :, : capacities[b]] for k in keys]
        chain.values = [v[b : b + 1, :, : capacities[b]] for v in values]
        chain.offset += len(pending[b]) + num_tokens - 1
    mx.async_eval(tokens)
    return tokens
