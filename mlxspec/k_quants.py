"""Layers holding a GGUF's Q4_K/Q5_K matrices as the file holds them: per super-block of 256 values a scale d and a
minimum dmin, per sub-block of 32 the 6-bit integers sc and m, and w = d * sc * q - dmin * m.

MLX's affine format would need the products d * sc and dmin * m as float32 scales and biases per 32 values (6 bits
a value at 4 bits, against the file's 4.5). Kept factored, the verify kernel forms them in registers
(`verify_kquant_matmul`); anywhere else (Metal, CUDA, `--kernel off`, mlx-lm's own generate on the model) the layer
forms them with MLX ops on each call and multiplies by MLX's `quantized_matmul`. Both are exactly the affine layer
the products describe, so the bits are those of the converted model of before, at about three quarters the bytes.

A converted folder lists these layers under `k_quants` in its config.json (path -> bits); mlx-lm alone cannot
load such a folder, mlxspec's loader can (`attach`).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

CONFIG_KEY = "k_quants"
GROUP = 32  # values a sub-block (an affine group)
SUPER_GROUPS = 8  # sub-blocks a super-block
PARTS = ("weight", "sub_scales", "sub_mins", "super_scales", "super_mins")


class KQuantLinear(nn.Module):
    """x @ w.T for a K-quant matrix [N, K] held factored."""

    group_size = GROUP

    def __init__(self, parts: dict[str, mx.array], bits: int, bias: mx.array | None = None):
        super().__init__()
        for name in PARTS:
            setattr(self, name, parts[name])
        if bias is not None:
            self.bias = bias
        self.bits = bits
        self.freeze()

    def affine(self, ids: mx.array | None = None) -> tuple[mx.array, mx.array, mx.array]:
        """(codes, scales, biases) in MLX's affine layout, groups of 32, float32: of the rows `ids`, or all."""
        parts = [getattr(self, name) for name in PARTS]
        if ids is not None:
            parts = [part[ids] for part in parts]
        weight, sc, m, d, dmin = parts
        shape = (*sc.shape[:-1], sc.shape[-1] // SUPER_GROUPS, SUPER_GROUPS)
        scales = d.astype(mx.float32)[..., None] * sc.reshape(shape).astype(mx.float32)
        biases = -(dmin.astype(mx.float32)[..., None] * m.reshape(shape).astype(mx.float32))
        return weight, scales.reshape(sc.shape), biases.reshape(m.shape)

    def __call__(self, x: mx.array) -> mx.array:
        weight, scales, biases = self.affine()
        y = mx.quantized_matmul(x, weight, scales, biases, transpose=True, group_size=GROUP, bits=self.bits)
        return y + self.bias if "bias" in self else y


class KQuantEmbedding(KQuantLinear):
    """An embedding held factored: lookups dequantize their rows; `as_linear` is the tied output layer."""

    def __call__(self, ids: mx.array) -> mx.array:
        weight, scales, biases = self.affine(ids)
        return mx.dequantize(weight, scales, biases, group_size=GROUP, bits=self.bits)

    def as_linear(self, x: mx.array) -> mx.array:
        return KQuantLinear.__call__(self, x)


def attach(model: nn.Module, weights: dict[str, mx.array], layers: dict[str, int]) -> None:
    """Put a K-quant layer at each path of `layers` (path -> bits), built from the folder's `weights`: a Linear's
    place takes a KQuantLinear, an Embedding's a KQuantEmbedding."""
    for path, bits in layers.items():
        parent, name = _parent(model, path)
        old = parent[int(name)] if isinstance(parent, list) else parent[name]
        cls = KQuantEmbedding if isinstance(old, nn.Embedding) else KQuantLinear
        parts = {part: weights[f"{path}.{part}"] for part in PARTS}
        layer = cls(parts, int(bits), weights.get(f"{path}.bias"))
        if isinstance(parent, list):
            parent[int(name)] = layer
        else:
            setattr(parent, name, layer)


def _parent(model: nn.Module, path: str):
    *parents, name = path.split(".")
    node = model
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node, name


def is_k_quant(layer: object) -> bool:
    return isinstance(layer, KQuantLinear)
