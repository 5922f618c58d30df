"""Prompt rows by GEMM (kernels/many_rows.py `prompt_rows`): a prompt chunk's quantized products widen the weights to
float32 (the kernel's own weights, bit for bit) and multiply them by MLX's matmul; a step's rows never do, so
speculative decoding still equals plain decoding token for token."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from helpers import speculative_tokens
from test_gguf_blocks import random_blocks
from test_k_quants import layer_of
from tiny import make_tiny

from mlxspec.kernels import many_rows
from mlxspec.kernels import verify as verify_kernel

BACKEND, WHY = verify_kernel.cpu_backend()
pytestmark = pytest.mark.skipif(BACKEND is None or not BACKEND.widens(), reason=f"no widening kernel: {WHY}")


def codes_of(w: mx.array, bits: int, k: int) -> np.ndarray:
    """MLX's little-endian bit stream read back to integer codes [N, K]."""
    stream = np.unpackbits(np.array(w).view(np.uint8), axis=1, bitorder="little")
    return (stream.reshape(w.shape[0], k, bits) * (1 << np.arange(bits))).sum(axis=2)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("scale_dtype", [mx.float32, mx.bfloat16, mx.float16], ids=["f32", "bf16", "f16"])
def test_widened_weights_are_scale_times_code_plus_bias_rounded_once(bits, group_size, scale_dtype):
    """Each value is float32(scale * q + bias) with one rounding (the FMA the kernel's tiles form), against a
    float64 reference: exact, since scale * q + bias needs fewer than 53 bits here."""
    mx.random.seed(bits + group_size)
    n, k = 37, 384  # ragged N; K a multiple of every group size
    w, scales, biases = mx.quantize(mx.random.normal((n, k)), group_size=group_size, bits=bits)
    scales, biases = scales.astype(scale_dtype), biases.astype(scale_dtype)
    got = np.array(BACKEND.widen_affine(w, scales, biases, group_size, bits))
    s64 = np.repeat(np.array(scales.astype(mx.float32), dtype=np.float64), group_size, axis=1)
    b64 = np.repeat(np.array(biases.astype(mx.float32), dtype=np.float64), group_size, axis=1)
    expected = (s64 * codes_of(w, bits, k) + b64).astype(np.float32)
    assert got.dtype == np.float32 and np.array_equal(got, expected)


@pytest.mark.parametrize("bits", [4, 5, 8])
def test_widened_weights_are_the_kernels_own(bits):
    """One-hot rows through the kernel read its weights back exactly (every other product is 0): the widened
    matrix equals them bit for bit, columns 0..31 and the last ones."""
    n, k = 29, 640
    w, scales, biases = mx.quantize(mx.random.normal((n, k)), group_size=32, bits=bits)
    scales, biases = scales.astype(mx.float16), biases.astype(mx.float16)
    widened = np.array(BACKEND.widen_affine(w, scales, biases, 32, bits))
    for columns in (range(32), range(k - 32, k)):
        one_hot = mx.array(np.eye(k, dtype=np.float32)[list(columns)])
        read_back = np.array(BACKEND.qmatmul(one_hot, w, scales, biases, 32, bits))
        assert np.array_equal(read_back.T, widened[:, list(columns)])


@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_K"])
def test_widened_k_quants_are_the_kernels_own(type_name):
    rng = np.random.default_rng(3)
    n, k = 21, 512
    layer = layer_of(random_blocks(type_name, n, k, rng, scale=0.05), type_name, (n, k))
    parts = tuple(getattr(layer, name) for name in ("weight", "sub_scales", "sub_mins", "super_scales", "super_mins"))
    widened = np.array(BACKEND.widen_kquant(*parts, layer.bits))
    weight, scales, biases = layer.affine()
    assert np.array_equal(widened, np.array(mx.dequantize(weight, scales, biases, group_size=32, bits=layer.bits)))
    one_hot = mx.array(np.eye(k, dtype=np.float32)[:32])
    assert np.array_equal(np.array(BACKEND.kquant_matmul(one_hot, layer)).T, widened[:, :32])


def count_widening(monkeypatch) -> dict:
    calls = {"affine": 0, "kquant": 0}
    affine, kquant = type(BACKEND).widen_affine, type(BACKEND).widen_kquant

    def counted_affine(self, *args):
        calls["affine"] += 1
        return affine(self, *args)

    def counted_kquant(self, *args):
        calls["kquant"] += 1
        return kquant(self, *args)

    monkeypatch.setattr(type(BACKEND), "widen_affine", counted_affine)
    monkeypatch.setattr(type(BACKEND), "widen_kquant", counted_kquant)
    return calls


def test_only_prompt_rows_past_the_kernels_take_the_gemm(monkeypatch):
    """Inside prompt_rows, more than MAX_ROWS rows widen the weights (in blocks of WIDEN_BLOCK_BYTES) and give the
    kernel's product up to the order of sums; outside it, or with MLX's reference BLAS, or at MAX_ROWS rows, the
    kernel runs and every row is bitwise its row alone."""
    monkeypatch.setattr(verify_kernel, "_reference_blas", lambda: False)
    monkeypatch.setattr(many_rows, "WIDEN_BLOCK_BYTES", 64 * 4 * 16)  # 16 rows a block: ragged last block
    calls = count_widening(monkeypatch)
    layer = verify_kernel.route_layer(nn.QuantizedLinear(64, 37, group_size=32, bits=5), BACKEND)
    x = mx.random.normal((1, verify_kernel.MAX_ROWS + 9, 64))
    chunked = layer(x)
    assert calls["affine"] == 0
    with many_rows.prompt_rows():
        widened = layer(x)
        assert calls["affine"] == 3  # 37 weight rows, 16 a block
        assert mx.array_equal(layer(x[:, : verify_kernel.MAX_ROWS]), chunked[:, : verify_kernel.MAX_ROWS]).item()
    assert calls["affine"] == 3
    assert widened.shape == chunked.shape
    assert mx.allclose(widened, chunked, rtol=1e-5, atol=1e-5).item()
    monkeypatch.setattr(verify_kernel, "_reference_blas", lambda: True)
    with many_rows.prompt_rows():
        assert mx.array_equal(layer(x), chunked).item() and calls["affine"] == 3


def test_speculation_equals_plain_decoding_with_a_prompt_filled_by_gemm(monkeypatch):
    """A 45-token prompt on a quantized target fills its cache by GEMM (the widening is counted); both runs fill it
    alike, and every step's rows go through the kernel, so the drafted run keeps plain decoding's tokens."""
    monkeypatch.setattr(verify_kernel, "_reference_blas", lambda: False)
    calls = count_widening(monkeypatch)
    target = make_tiny("llama", seed=0, vocab_size=32, hidden_size=64, intermediate_size=128)
    draft = make_tiny("llama", seed=3, vocab_size=32, hidden_size=64, intermediate_size=128)
    nn.quantize(target, group_size=32, bits=4)
    prompt = [(7 * i) % 29 + 1 for i in range(45)]
    plain = speculative_tokens(target, None, prompt, 20, kernel="on")
    assert calls["affine"] > 0
    engines = []
    drafted = speculative_tokens(target, draft, prompt, 20, num_draft=4, kernel="on", engine_out=engines)
    assert drafted == plain
    assert engines[0].target_calls < 20  # drafts were kept
