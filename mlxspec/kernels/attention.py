"""Routing a target's attention through the kernel's row-equivalent attention (csrc/verify_attention.cpp).

Why: mlx-lm's attention runs its score and value products through BLAS, and OpenBLAS picks its kernel by the row
count. A token verified with K drafted tokens then gets attention outputs a few bits off from the same token decoded
alone, and greedy output equals plain decoding only up to near-ties. The kernel computes each query row on its own,
skipping masked keys, so a row's bits do not depend on the rows beside it or on masked keys among its keys.

How: mlx-lm's model files call `scaled_dot_product_attention` from `mlx_lm.models.base` by its global name; the
routed view rebinds that name to a `KernelAttention` in the attention modules' methods (rebinding.py).
"""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx
from mlx_lm.models import base as mlx_lm_base

from mlxspec.kernels.rebinding import StandIn

SDPA_NAME = "scaled_dot_product_attention"


class KernelAttention:
    """A drop-in for mlx-lm's `scaled_dot_product_attention` that sends up to `max_rows` float32 query rows to the
    kernel and everything else (prefill, quantized KV caches, attention sinks, other dtypes) to mlx-lm's own."""

    def __init__(self, backend: Any, max_rows: int):
        self.backend = backend
        self.max_rows = max_rows

    def __call__(self, queries, keys, values, cache, scale: float, mask, sinks=None) -> mx.array:
        row_views = getattr(cache, "row_views", None)  # rows decoding together (decoding/batch.py)
        if row_views is not None and sinks is None:
            return self.per_row(queries, row_views(), scale)
        args = self.kernel_arguments(queries, keys, values, cache, mask, sinks)
        if args is None:
            return mlx_lm_base.scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks)
        kernel_mask, causal = args
        return self.backend.attention(queries, keys, values, scale, kernel_mask, causal)

    def per_row(self, queries: mx.array, rows: list, scale: float) -> mx.array:
        """Each row's queries [1, H, L, D] against its own cache's keys, as that row's forward alone computes them
        (causal over its own keys): the padded, stacked keys of the batched view are then never computed."""
        mask = "causal" if queries.shape[2] > 1 else None
        outputs = [self(queries[r : r + 1], k, v, cache, scale, mask) for r, (cache, k, v) in enumerate(rows)]
        return mx.concatenate(outputs)

    def kernel_arguments(self, queries, keys, values, cache, mask, sinks) -> tuple[mx.array | None, bool] | None:
        """(mask for the kernel, causal) when the kernel takes this call, else None."""
        if hasattr(cache, "bits") or sinks is not None or not isinstance(keys, mx.array):
            return None
        if any(a.dtype != mx.float32 or a.ndim != 4 for a in (queries, keys, values)):
            return None
        batch, heads, rows, _ = queries.shape
        if rows > self.max_rows:
            return None
        if mask is None:
            return None, False
        if isinstance(mask, str):
            return (None, True) if mask == "causal" else None
        kernel_mask = self.mask_4d(mask, batch, heads, rows, keys.shape[2])
        return None if kernel_mask is None else (kernel_mask, False)

    @staticmethod
    def mask_4d(mask: mx.array, batch: int, heads: int, rows: int, keys: int) -> mx.array | None:
        """`mask` as the kernel's [B|1, H|1, L, S] bool or float32, or None where it does not broadcast so."""
        if mask.ndim > 4:
            return None
        mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
        if mask.shape[0] not in (1, batch) or mask.shape[1] not in (1, heads):
            return None
        if mask.shape[2] not in (1, rows) or mask.shape[3] not in (1, keys):
            return None
        if mask.dtype != mx.bool_:
            mask = mask.astype(mx.float32)
        return mx.broadcast_to(mask, (mask.shape[0], mask.shape[1], rows, keys))


@functools.lru_cache(maxsize=None)
def kernel_attention(backend: Any, max_rows: int) -> KernelAttention:
    """One KernelAttention per backend, so the classes below are built once per attention class and backend."""
    return KernelAttention(backend, max_rows)


def attention_stand_in(attention: KernelAttention) -> StandIn:
    return StandIn(SDPA_NAME, mlx_lm_base.scaled_dot_product_attention, attention)
