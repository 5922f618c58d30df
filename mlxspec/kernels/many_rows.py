"""More rows than the verify kernel takes (MAX_ROWS): a prefill's rows through the kernel MAX_ROWS at a time, or, for
a prompt (`prompt_rows`), by GEMM: while a prompt chunk's forward is built, a quantized layer widens its weights to
float32, WIDEN_BLOCK_BYTES at a time, and multiplies them by MLX's matmul (verify.py routes it there where a real
BLAS is in use).

Why: at 128 rows a BLAS GEMM does about 1.4x the verify kernel's FMAs a cycle, since the kernel's tiles widen the
codes again for every 8 rows of x (docs/benchmarks.md, "Prompt rows by GEMM"). The widened weights are exactly the
kernel's (scale * q + bias, one FMA), but the GEMM sums in another order, so only prompt rows take it: plain and
speculative decoding fill a prompt alike, and a step's rows always go through the kernel.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

import mlx.core as mx

MAX_ROWS = 32  # more rows than this (prefill, the biggest trees) go to MLX's own matmul
_PROMPT_ROWS = contextvars.ContextVar("mlxspec_prompt_rows", default=False)
WIDEN_BLOCK_BYTES = 4 << 20  # float32 weights a block: 4 MiB measured best or near it on the 1.5B's shapes


def rows_of(x: mx.array) -> int:
    return x.size // x.shape[-1] if x.ndim else 0


def in_row_chunks(x: mx.array, product: Callable[[mx.array], mx.array]) -> mx.array:
    """product(rows) for a prefill's many rows, MAX_ROWS at a time. The kernel's rows are independent, so a
    prefilled row has the bits it would have had alone."""
    rows = x.reshape(-1, x.shape[-1])
    parts = [product(rows[i : i + MAX_ROWS]) for i in range(0, rows.shape[0], MAX_ROWS)]
    return mx.concatenate(parts, axis=0).reshape(*x.shape[:-1], -1)


@contextlib.contextmanager
def prompt_rows(active: bool = True) -> Iterator[None]:
    """Layers called within it (active) take prompt rows by GEMM."""
    token = _PROMPT_ROWS.set(active)
    try:
        yield
    finally:
        _PROMPT_ROWS.reset(token)


def prompt_rows_active() -> bool:
    return _PROMPT_ROWS.get()


def widened_product(
    x: mx.array, widen: Callable[..., mx.array], sliced: tuple[mx.array, ...], fixed: tuple[int, ...]
) -> mx.array:
    """x [..., K] @ w.T for a weight held as `sliced` (arrays with one row per weight row: codes, scales, ...):
    each block of rows widened to float32 by widen(*rows of each of sliced, *fixed), WIDEN_BLOCK_BYTES of float32
    at a time (the whole matrix widened at once faulted in fresh pages and measured no faster than the kernel)."""
    k, n = x.shape[-1], sliced[0].shape[0]
    rows = x.reshape(-1, k)
    step = max(16, WIDEN_BLOCK_BYTES // (4 * k))
    parts = []
    for start in range(0, n, step):
        block = widen(*(a[start : start + step] for a in sliced), *fixed)
        parts.append(rows @ block.T)
    return mx.concatenate(parts, axis=1).reshape(*x.shape[:-1], n)
