"""The verify kernel's backends: the interface a device's kernel implements (`VerifyBackend`) and the C++ extension
that implements it on the CPU (`CPUExtension`, built here by setup.py; `CPUInt8Activations` its lossy opt-in
variant). Which one runs is chosen in verify.py (`resolve`), by device and by name, never by guess.
"""

from __future__ import annotations

from typing import Protocol

import mlx.core as mx

from mlxspec.k_quants import KQuantLinear


class VerifyBackend(Protocol):
    name: str

    def matmul(self, x: mx.array, w: mx.array) -> mx.array:
        """x [..., K] @ w[N, K].T with x and w of one float dtype, or float32 x against 16-bit w."""

    def qmatmul(
        self, x: mx.array, w: mx.array, scales: mx.array, biases: mx.array, group_size: int, bits: int
    ) -> mx.array:
        """x @ dequantize(w).T for mlx-lm's affine quantization (transpose=True layout)."""

    def kquant_matmul(self, x: mx.array, layer: KQuantLinear) -> mx.array:
        """x @ w.T for a K-quant layer held factored (k_quants.py), float32 x."""

    def widens(self) -> bool:
        """Whether widen_affine and widen_kquant are there (prompt rows by GEMM, many_rows.py); a backend without
        them prefills through its matmuls in MAX_ROWS chunks."""

    def attention(
        self, q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array | None, causal: bool
    ) -> mx.array:
        """Row-equivalent attention: q [B, Hq, L, D], k/v [B, Hkv, S, D] float32; mask bool/float [B|1, Hq|1, L, S]."""


class CPUExtension:
    """The C++ extension (mlxspec._verify_kernel): runs on the CPU stream."""

    name = "cpu"

    def __init__(self, module):
        self.module = module
        self.threads = module.threads()
        self.has_swiglu = hasattr(module, "mlx_swiglu")  # a kernel built before them had neither
        self.has_rms_norm = hasattr(module, "mlx_rms_norm")

    def matmul(self, x: mx.array, w: mx.array) -> mx.array:
        return self.module.verify_matmul(x, w, stream=mx.cpu)

    def qmatmul(self, x, w, scales, biases, group_size: int, bits: int) -> mx.array:
        return self.module.verify_qmatmul(x, w, scales, biases, group_size, bits, stream=mx.cpu)

    def kquant_matmul(self, x: mx.array, layer: KQuantLinear) -> mx.array:
        parts = (layer.weight, layer.sub_scales, layer.sub_mins, layer.super_scales, layer.super_mins)
        return self.module.verify_kquant_matmul(x, *parts, layer.bits, stream=mx.cpu)

    def widens(self) -> bool:
        """The build has the widening ops (a kernel built before them has not)."""
        return hasattr(self.module, "dequantize_affine")

    def widen_affine(self, w, scales, biases, group_size: int, bits: int) -> mx.array:
        """dequantize(w) [N, K] float32: each value the weight the kernel multiplies by."""
        return self.module.dequantize_affine(w, scales, biases, group_size, bits, stream=mx.cpu)

    def widen_kquant(self, w, sub_scales, sub_mins, super_scales, super_mins, bits: int) -> mx.array:
        """A K-quant matrix held factored (k_quants.PARTS) as float32 [N, K], the kernel's weights."""
        return self.module.dequantize_kquant(w, sub_scales, sub_mins, super_scales, super_mins, bits, stream=mx.cpu)

    def attention(self, q, k, v, scale: float, mask, causal: bool) -> mx.array:
        return self.module.verify_attention(q, k, v, scale, mask, causal, stream=mx.cpu)

    def swiglu(self, gate: mx.array, x: mx.array) -> mx.array:
        """mlx-lm's swiglu(gate, x) for float32 arrays of one shape, bit for bit (activations.py)."""
        return self.module.mlx_swiglu(gate, x, stream=mx.cpu)

    def rms_norm(self, x: mx.array, weight: mx.array, eps: float) -> mx.array:
        """mx.fast.rms_norm(x, weight, eps) for float32 x [..., D] and weight [D], bit for bit (norms.py)."""
        return self.module.mlx_rms_norm(x, weight, eps, stream=mx.cpu)

    def logsumexp(self, x: mx.array) -> mx.array:
        """[N, V] float32 -> [N, 1]."""
        return self.module.row_logsumexp(x, stream=mx.cpu)[:, None]

    def exact_logsumexp(self, x: mx.array) -> mx.array | None:
        """mx.logsumexp(x, axis=-1, keepdims=True) bit for bit, as MLX's x86 CPU build computes it: [N, V] float32
        -> [N, 1]; None from a kernel built before it had the op."""
        op = getattr(self.module, "mlx_logsumexp", None)
        return None if op is None else op(x, stream=mx.cpu)[:, None]

    def top_candidates(self, x: mx.array, count: int) -> tuple[mx.array, mx.array]:
        """[N, V] float32 -> (values [N, C] best first, indices [N, C] int32), ties by lower index."""
        values, indices = self.module.top_candidates(x, count, stream=mx.cpu)
        return values, indices.astype(mx.int32)


class CPUInt8Activations(CPUExtension):
    """The same kernel with activations rounded to int8 per block of 32 against 4-, 5- and 8-bit weights, integer
    dot products as llama.cpp's CPU path computes (`--kernel int8`): lossy, so only ever chosen by name. Other
    weights (float, 2/3/6-bit) keep float32 activations. Rows stay independent of M: speculative output still
    equals plain decoding in this mode bit for bit."""

    name = "cpu-int8"
    INT8_BITS = (4, 5, 8)

    def qmatmul(self, x, w, scales, biases, group_size: int, bits: int) -> mx.array:
        int8 = bits in self.INT8_BITS
        return self.module.verify_qmatmul(x, w, scales, biases, group_size, bits, int8_activations=int8, stream=mx.cpu)

    def kquant_matmul(self, x: mx.array, layer: KQuantLinear) -> mx.array:
        """The int8 path takes affine groups: the layer's products d * sc and -dmin * m formed by MLX ops first."""
        return self.qmatmul(x, *layer.affine(), layer.group_size, layer.bits)
