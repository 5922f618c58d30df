"""Q4_K and Q5_K held as the file holds them (mlxspec/k_quants.py, blocks.k_quantized): the factored super-blocks
dequantize bit for bit to what the `gguf` package gives; the kernel's product equals, bit for bit, the affine
kernel's given the products d * sc and -dmin * m as float32 scales and biases, at 1..32 rows, so speculation over
such a model still equals its plain decoding; MLX's own ops (the path off the kernel) give the same values; and the
layer holds the file's size, not the 6 bits a value of the affine form."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from test_gguf_blocks import random_blocks

from mlxspec.gguf.blocks import exact_affine, k_quantized
from mlxspec.k_quants import PARTS, KQuantEmbedding, KQuantLinear
from mlxspec.kernels.verify import cpu_backend, route_layer

K_TYPES = ["Q4_K", "Q5_K"]


def layer_of(raw: np.ndarray, type_name: str, shape, cls=KQuantLinear) -> KQuantLinear:
    held = k_quantized(raw, type_name, shape)
    parts = {part: mx.array(getattr(held, part)) for part in PARTS}
    parts["super_scales"] = parts["super_scales"].astype(mx.float32)  # as loading widens them on the CPU
    parts["super_mins"] = parts["super_mins"].astype(mx.float32)
    return cls(parts, held.bits)


@pytest.mark.parametrize("type_name", K_TYPES)
def test_factored_super_blocks_dequantize_bit_for_bit_as_ggml_does(type_name):
    rng = np.random.default_rng(11)
    rows, k = 5, 768
    raw = random_blocks(type_name, rows, k, rng)
    expected = dequantize(raw, GGMLQuantizationType[type_name]).reshape(rows, k)
    layer = layer_of(raw, type_name, (rows, k))
    got = np.array(mx.dequantize(*layer.affine(), group_size=32, bits=layer.bits))
    assert np.array_equal(got, expected), np.abs(got - expected).max()
    ids = mx.array([3, 0, 3])
    rows_got = np.array(layer_of(raw, type_name, (rows, k), KQuantEmbedding)(ids))
    assert np.array_equal(rows_got, expected[[3, 0, 3]])


def test_a_broken_scale_layout_is_seen():
    """The guard above guards: sc and m read from each other's bits no longer dequantize as ggml."""
    rng = np.random.default_rng(12)
    raw = random_blocks("Q4_K", 3, 256, rng)
    expected = dequantize(raw, GGMLQuantizationType.Q4_K).reshape(3, 256)
    layer = layer_of(raw, "Q4_K", (3, 256))
    layer.sub_scales, layer.sub_mins = layer.sub_mins, layer.sub_scales
    got = np.array(mx.dequantize(*layer.affine(), group_size=32, bits=4))
    assert not np.array_equal(got, expected)


def test_the_layer_holds_the_files_size():
    rng = np.random.default_rng(13)
    n, k = 64, 1024
    raw = random_blocks("Q4_K", n, k, rng)
    held = k_quantized(raw, "Q4_K", (n, k))
    assert held.nbytes <= 1.06 * raw.nbytes  # 148 bytes a super-block against the file's 144
    affine = exact_affine(raw, "Q4_K", (n, k))
    assert held.nbytes < 0.8 * (affine.weight.nbytes + affine.scales.nbytes + affine.biases.nbytes)  # 6 bits a value


@pytest.mark.parametrize("type_name", K_TYPES)
def test_the_kernel_equals_the_affine_kernel_bit_for_bit_at_every_row_count(type_name):
    backend, why = cpu_backend()
    assert backend is not None, why
    rng = np.random.default_rng(14)
    n, k = 37, 1280  # ragged N (not a multiple of the tile), five super-blocks a row
    raw = random_blocks(type_name, n, k, rng, scale=0.05)
    layer = layer_of(raw, type_name, (n, k))
    routed = route_layer(layer, backend)
    assert routed is not layer
    affine = exact_affine(raw, type_name, (n, k))
    w, scales, biases = mx.array(affine.weight), mx.array(affine.scales), mx.array(affine.biases)
    x = mx.array(rng.standard_normal((32, k)).astype(np.float32))
    full = np.array(routed(x))
    assert np.array_equal(full, np.array(backend.qmatmul(x, w, scales, biases, 32, affine.bits)))
    values = dequantize(raw, GGMLQuantizationType[type_name]).reshape(n, k).astype(np.float64)
    reference = np.array(x, dtype=np.float64) @ values.T
    bound = np.abs(np.array(x, dtype=np.float64)) @ np.abs(values).T
    assert np.all(np.abs(full - reference) <= 4e-6 * bound + 1e-30)
    for m in (1, 2, 3, 5, 7, 17):
        assert np.array_equal(np.array(routed(x[:m])), full[:m]), m
    prefill = mx.array(rng.standard_normal((70, k)).astype(np.float32))  # past 32 rows: the kernel in chunks
    assert np.array_equal(np.array(routed(prefill))[:1], np.array(routed(prefill[:1])))


@pytest.mark.parametrize("type_name", K_TYPES)
def test_off_the_kernel_mlxs_own_ops_give_the_affine_layers_values(type_name):
    """Where the kernel does not run (Metal, CUDA, --kernel off), the layer is MLX's quantized_matmul on the
    products: bit for bit what a QuantizedLinear holding them gives."""
    rng = np.random.default_rng(15)
    n, k = 24, 512
    raw = random_blocks(type_name, n, k, rng, scale=0.05)
    layer = layer_of(raw, type_name, (n, k))
    affine = exact_affine(raw, type_name, (n, k))
    reference = nn.QuantizedLinear(k, n, bias=False, group_size=32, bits=affine.bits)
    reference.weight, reference.scales, reference.biases = (mx.array(a) for a in (affine.weight, affine.scales,
                                                                                  affine.biases))  # fmt: skip
    x = mx.array(rng.standard_normal((3, k)).astype(np.float32))
    assert np.array_equal(np.array(layer(x)), np.array(reference(x)))
