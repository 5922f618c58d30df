"""One target forward for the step requests of many rows (forward.py), each row keeping its own cache.

Every row keeps its own KV cache, so each row still trims (rolls back) on its own, by its own count: ragged
acceptance is nothing special. For one batched forward a layer's view stacks the rows: each row's new keys are
written into its own cache, the rows' keys and values are right-padded to the longest and stacked, and a mask per
row lets each query see exactly its own row's earlier keys and its own new ones before it. Padded keys and padded
queries are masked out, never zero keys standing in for rejected ones (a zero key would still add e^0 to the
softmax). RoPE reads each row's own position (`offset` is an array over rows, as mlx-lm's BatchKVCache gives).
After the forward each row drops the padding it was fed past its own inputs.

Keeping the rows' caches apart would cost a copy of every row's keys and values per layer per step (the stack).
Where the target's attention is routed through the verify kernel (kernels/attention.py), it asks the view for
each row's own keys (`row_views`) and attends row by row, as each row alone would, so the stacked arrays, built
lazily, are never computed. Elsewhere (the kernel off, a family with its own attention) the stack is what attends.
mlx-lm's BatchKVCache avoids the copy with one shared buffer but trims all rows by one count.

Only rows whose every layer cache is a plain KVCache are batched (`batchable`); the others (windows, quantized KV,
recurrent layers) run their forwards alone between the batched ones, exact either way.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from mlxspec.cache.rollback import rollback
from mlxspec.decoding.draft import Draft
from mlxspec.decoding.forward import DraftRequest, ForwardRequest, Reply, answer_alone, run_alone
from mlxspec.decoding.target_features import forward_with_hidden


def batchable(request: ForwardRequest) -> bool:
    return not request.alone and all(type(c) is KVCache for c in request.cache)


class BatchedLayerCache:
    """One layer's view over the rows' own caches for one batched forward of `width` tokens a row."""

    def __init__(self, rows: list[KVCache], width: int):
        self.rows, self.width = rows, width
        self.fetched: list[tuple[KVCache, mx.array, mx.array]] = []  # set by update_and_fetch, per row
        self.starts = [c.offset for c in rows]  # each row's position before this forward
        self.length = max(self.starts) + width  # keys per row in the stacked view

    @property
    def offset(self) -> mx.array:
        return mx.array(self.starts)

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None, **kwargs) -> mx.array:
        """[B, 1, N, length] bool: query i of row r sees keys 0 .. start_r + i (its own row's, never padding)."""
        keys = mx.arange(self.length)[None, None, :]
        last = mx.array(self.starts)[:, None, None] + mx.arange(N)[None, :, None]
        return (keys <= last)[:, None]

    def row_views(self) -> list[tuple[KVCache, mx.array, mx.array]]:
        """(row cache, its keys, its values) per row, as the last update_and_fetch left them."""
        return self.fetched

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        stacked_keys, stacked_values = [], []
        self.fetched = []
        for r, cache in enumerate(self.rows):
            k, v = cache.update_and_fetch(keys[r : r + 1], values[r : r + 1])
            self.fetched.append((cache, k, v))
            pad = [(0, 0), (0, 0), (0, self.length - k.shape[2]), (0, 0)]
            stacked_keys.append(mx.pad(k, pad))
            stacked_values.append(mx.pad(v, pad))
        return mx.concatenate(stacked_keys), mx.concatenate(stacked_values)


def run_batched(requests: list[ForwardRequest]) -> list[Reply]:
    """The requests' forwards as one (they share the model and what they read), each row's reply in order."""
    if len(requests) == 1:
        return [run_alone(requests[0])]
    first = requests[0]
    width = max(r.inputs.shape[0] for r in requests)
    inputs = mx.stack([mx.pad(r.inputs, (0, width - r.inputs.shape[0])) for r in requests])
    views = [BatchedLayerCache([r.cache[i] for r in requests], width) for i in range(len(first.cache))]
    if first.taps is not None:
        hidden, logits = forward_with_hidden(first.model, inputs, views, first.taps)
    else:
        hidden, logits = None, first.model(inputs, cache=views)
    replies = []
    for r, request in enumerate(requests):
        fed = request.inputs.shape[0]
        rollback(request.cache, width - fed)  # the padding this row was fed past its own inputs
        replies.append((logits[r, :fed], None if hidden is None else hidden[r, :fed]))
    return replies


def run_all(requests: list[ForwardRequest]) -> list[Reply]:
    """Every request answered: those that can share a forward (same model and taps) batched, the rest alone."""
    replies: list[Reply | None] = [None] * len(requests)
    groups: dict[tuple, list[int]] = {}
    for i, request in enumerate(requests):
        if batchable(request):
            groups.setdefault((id(request.model), request.taps), []).append(i)
        else:
            replies[i] = run_alone(request)
    for members in groups.values():
        for i, reply in zip(members, run_batched([requests[i] for i in members])):
            replies[i] = reply
    return replies


def propose_all(requests: list[DraftRequest]) -> list[Draft | None | Exception]:
    """Every row's draft, or the exception its drafter raised (for its row alone): drafts whose drafters share a
    batch key (Drafter.batch_key) computed together, the rest alone. A batched call that raises is retried row by
    row, so only a row whose own draft fails gets an exception."""
    drafts: list[Draft | None | Exception] = [None] * len(requests)
    groups: dict[tuple, list[int]] = {}
    for i, request in enumerate(requests):
        key = request.drafter.batch_key(request.num_tokens)
        if key is None:
            drafts[i] = _propose_alone(request)
        else:
            groups.setdefault((type(request.drafter), key), []).append(i)
    for (kind, _), members in groups.items():
        together = None
        if len(members) > 1:
            try:
                drafters = [requests[i].drafter for i in members]
                together = kind.propose_together(drafters, requests[members[0]].num_tokens)
            except Exception:  # noqa: BLE001 - some row's failure: each row drafts alone below, failing alone
                together = None
        for i, draft in zip(members, together or [_propose_alone(requests[i]) for i in members]):
            drafts[i] = draft
    return drafts


def _propose_alone(request: DraftRequest) -> Draft | None | Exception:
    try:
        return answer_alone(request)
    except Exception as error:  # noqa: BLE001 - handed to its row (batching.py), which fails alone
        return error
