"""RMS norms through the kernel: `mx.fast.rms_norm`, bit for bit as MLX's CPU computes it, in one op.

Why: on the CPU MLX runs `mx.fast.rms_norm` as its fallback, seven ops (square, sum, scale, add, rsqrt, two
multiplies), about 90 us a call at the 1.5B's 1,536 columns: 57 norms, about 5 ms a step; Gemma 3 has six a layer.
The kernel's `mlx_rms_norm` computes the same roundings in the same order (csrc/mlx_math.h; tested bitwise) in one.

How: `nn.RMSNorm` and the model files' own RMSNorm classes (Gemma's `1 + weight`) call `mx.fast.rms_norm` through
their global `mx`. The routed view rebinds `mx`, in the methods that call `mx.fast.rms_norm` only, to a stand-in
that is mlx.core in every other name (rebinding.py).
"""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx

from mlxspec.kernels.rebinding import StandIn


class _FastWithKernelNorm:
    """mx.fast with rms_norm through the kernel for float32 x and weight; everything else mx.fast's own."""

    def __init__(self, backend: Any):
        self.backend = backend

    def rms_norm(self, x: mx.array, weight: mx.array | None, eps: float, **kwargs: Any) -> mx.array:
        takes = (
            not kwargs
            and weight is not None
            and x.dtype == mx.float32
            and weight.dtype == mx.float32
            and weight.ndim == 1
            and x.ndim >= 1
            and weight.shape[0] == x.shape[-1]
        )
        if takes:
            return self.backend.rms_norm(x, weight, eps)
        return mx.fast.rms_norm(x, weight, eps, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(mx.fast, name)


class MxWithKernelNorm:
    """mlx.core, except that `fast.rms_norm` is the kernel's."""

    def __init__(self, backend: Any):
        self.fast = _FastWithKernelNorm(backend)

    def __getattr__(self, name: str) -> Any:
        return getattr(mx, name)


@functools.lru_cache(maxsize=None)  # one per backend, so the routed classes are built once
def rms_norm_stand_in(backend: Any) -> StandIn | None:
    """The stand-in for `mx` in methods calling mx.fast.rms_norm, or None where the kernel has no rms_norm."""
    if not getattr(backend, "has_rms_norm", False):
        return None
    return StandIn("mx", mx, MxWithKernelNorm(backend), also_names=("fast", "rms_norm"))
