"""The MLP's swiglu through the kernel: mlx-lm's `swiglu(gate, x)`, bit for bit, with its exps vectorized.

Why: MLX's x86 CPU build computes exp one lane at a time, about 30 ns a value, so the 1.5B's swiglu (8,960 values)
costs about 0.3 ms a layer, 8 ms a step. The kernel's `mlx_swiglu` runs MLX's own Cephes exp and sigmoid, in MLX's
order of roundings, lane by lane in vector registers (csrc/mlx_math.h): the same bits (tested on a million values,
the edges included), about 8x faster. Anything it does not take (another dtype, broadcast shapes) goes to mlx-lm's.
"""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx
from mlx_lm.models import activations as mlx_lm_activations

from mlxspec.kernels.rebinding import StandIn

SWIGLU_NAME = "swiglu"


class KernelSwiglu:
    """A drop-in for mlx-lm's `swiglu` that sends float32 pairs of one shape to the kernel."""

    def __init__(self, backend: Any):
        self.backend = backend

    def __call__(self, gate: mx.array, x: mx.array) -> mx.array:
        if gate.dtype == mx.float32 and x.dtype == mx.float32 and gate.shape == x.shape:
            return self.backend.swiglu(gate, x)
        return mlx_lm_activations.swiglu(gate, x)


@functools.lru_cache(maxsize=None)  # one per backend, so the routed classes are built once
def swiglu_stand_in(backend: Any) -> StandIn | None:
    """The stand-in for mlx-lm's swiglu, or None where the backend (a kernel built before it) has no swiglu."""
    if not getattr(backend, "has_swiglu", False):
        return None
    return StandIn(SWIGLU_NAME, mlx_lm_activations.swiglu, KernelSwiglu(backend))
