"""The kernel's row-equivalent attention (csrc/verify_attention.cpp, kernels/attention.py): close to MLX's attention,
each query row's bits independent of the rows beside it and of masked keys among its keys, routed through the
target's attention modules, and, under OpenBLAS, verified rows bitwise equal to the same rows decoded alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.models.cache import QuantizedKVCache

from mlxspec.kernels import verify as verify_kernel
from mlxspec.kernels.attention import KernelAttention
from mlxspec.platform import openblas_path

BACKEND, WHY = verify_kernel.cpu_backend()
pytestmark = pytest.mark.skipif(BACKEND is None, reason=f"the verify kernel is unavailable: {WHY}")
ROOT = Path(__file__).resolve().parent.parent
SCALE = 0.125


def qkv(rows: int, keys: int, heads: int = 6, kv_heads: int = 2, dim: int = 64, seed: int = 0):
    mx.random.seed(seed)
    q = mx.random.normal((1, heads, rows, dim))
    k = mx.random.normal((1, kv_heads, keys, dim))
    v = mx.random.normal((1, kv_heads, keys, dim))
    return q, k, v


def attend(q, k, v, mask=None, causal=False):
    return BACKEND.attention(q, k, v, SCALE, mask, causal)


@pytest.mark.parametrize("rows,keys,dim", [(1, 1, 64), (1, 37, 64), (5, 40, 50), (8, 300, 128), (33, 70, 64)])
def test_equal_to_mlx_attention_within_float32_rounding(rows, keys, dim):
    q, k, v = qkv(rows, keys, dim=dim)
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=SCALE, mask="causal" if rows > 1 else None)
    got = attend(q, k, v, causal=rows > 1)
    assert got.shape == expected.shape
    assert mx.abs(got - expected).max().item() < 2e-5


def test_bool_and_additive_masks_mean_what_mlx_means():
    q, k, v = qkv(4, 30)
    allowed = mx.random.uniform(shape=(1, 6, 4, 30)) < 0.6
    allowed[..., 0] = True  # every row attends something
    additive = mx.where(allowed, mx.random.normal(allowed.shape), -mx.inf)
    for mask in (allowed, additive):
        expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=SCALE, mask=mask)
        assert mx.abs(attend(q, k, v, mask) - expected).max().item() < 2e-5


@pytest.mark.parametrize("rows", [2, 3, 4, 8, 16, 32, 33])
def test_each_row_is_bitwise_the_row_computed_alone(rows):
    """A verify pass's causal tail against each row decoded alone over its own keys: the same bits."""
    q, k, v = qkv(rows, 300, seed=rows)
    together = attend(q, k, v, causal=True)
    for i in range(rows):
        seen = 300 - rows + i + 1
        alone = attend(q[:, :, i : i + 1], k[:, :, :seen], v[:, :, :seen])
        assert mx.array_equal(alone, together[:, :, i : i + 1]).item(), f"row {i} of {rows}"


def test_masked_keys_between_attended_ones_change_no_bit():
    """A tree node attends the prefix and its ancestors, with other branches' keys masked between them: the same
    bits as attending those keys alone, in order (plain decoding of the node's path)."""
    q, k, v = qkv(1, 24)
    kept = [0, 1, 2, 3, 9, 14, 20]
    mask = mx.zeros((1, 1, 1, 24), dtype=mx.bool_)
    mask[..., mx.array(kept)] = True
    index = mx.array(kept)
    assert mx.array_equal(attend(q, k, v, mask), attend(q, k[:, :, index], v[:, :, index])).item()


def test_a_cache_slice_reads_the_same_as_a_copy():
    """KV caches hand attention a slice of a longer buffer; the kernel reads its strides."""
    q, _, _ = qkv(4, 300)
    buffer_k, buffer_v = mx.random.normal((1, 2, 512, 64)), mx.random.normal((1, 2, 512, 64))
    sliced = attend(q, buffer_k[:, :, :300], buffer_v[:, :, :300], causal=True)
    copied = attend(q, mx.array(buffer_k[:, :, :300]) + 0, mx.array(buffer_v[:, :, :300]) + 0, causal=True)
    assert mx.array_equal(sliced, copied).item()


def test_keys_and_values_with_strided_dims_read_as_a_copy():
    """Keys and values whose head dims are not contiguous (a transposed view): the same bits as a contiguous copy,
    so a row's bits never depend on how its cache happens to lie in memory."""
    q, _, _ = qkv(3, 45, dim=80)
    k_t, v_t = mx.random.normal((1, 2, 80, 45)), mx.random.normal((1, 2, 80, 45))
    k, v = k_t.transpose(0, 1, 3, 2), v_t.transpose(0, 1, 3, 2)
    strided = attend(q, k, v, causal=True)
    copied = attend(q, mx.array(k) + 0, mx.array(v) + 0, causal=True)
    assert mx.array_equal(strided, copied).item()


@pytest.mark.parametrize("keys,dim", [(3, 256), (9, 80), (129, 128), (200, 50), (64, 256)])
def test_against_a_float64_reference(keys, dim):
    """Softmax attention computed in float64 by numpy: within float32 rounding (a wrong key, dim or tail is off by
    far more)."""
    import numpy as np

    q, k, v = qkv(3, keys, heads=4, kv_heads=2, dim=dim, seed=keys)
    got = np.array(attend(q, k, v, causal=True))
    q64, k64, v64 = (np.array(a).astype(np.float64) for a in (q, k, v))
    k64, v64 = np.repeat(k64, 2, axis=1), np.repeat(v64, 2, axis=1)
    scores = q64 @ k64.transpose(0, 1, 3, 2) * SCALE
    rows = np.arange(3)[:, None]
    scores = np.where(np.arange(keys)[None, :] <= keys - 3 + rows, scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    expected = (weights / weights.sum(-1, keepdims=True)) @ v64
    assert np.abs(got - expected).max() < 1e-5 * max(1.0, np.abs(expected).max())


def test_what_the_kernel_does_not_take_goes_to_mlx_lm():
    routed = KernelAttention(BACKEND, verify_kernel.MAX_ROWS)
    q, k, v = qkv(4, 30)
    assert routed.kernel_arguments(q, k, v, None, "causal", None) == (None, True)
    assert routed.kernel_arguments(q, k, v, None, None, mx.zeros((6,))) is None  # attention sinks
    assert routed.kernel_arguments(q, k, v, QuantizedKVCache(), "causal", None) is None  # quantized KV
    assert routed.kernel_arguments(q.astype(mx.bfloat16), k, v, None, None, None) is None
    wide, _, _ = qkv(verify_kernel.MAX_ROWS + 1, 40)
    assert routed.kernel_arguments(wide, k, v, None, "causal", None) is None  # prefill
    assert routed.kernel_arguments(q, k, v, None, mx.zeros((3, 4, 30)), None) is None  # 3 heads: not 1 or 6


def test_bad_operands_are_refused_by_the_kernel():
    q, k, v = qkv(2, 10)
    with pytest.raises(ValueError, match="float32"):
        attend(q.astype(mx.float16), k, v)
    with pytest.raises(ValueError, match="disagree"):
        attend(q, k[:, :, :, :32], v)
    with pytest.raises(ValueError, match="mask"):
        attend(q, k, v, mx.zeros((1, 1, 2, 9), dtype=mx.bool_))


@pytest.mark.skipif(not openblas_path().exists(), reason="Debian's OpenBLAS is not installed (libopenblas0-pthread)")
def test_under_openblas_a_verified_row_is_bitwise_the_row_decoded_alone():
    """The embedded target under OpenBLAS, whose matmul kernel depends on the row count: with the kernel's attention,
    every row of a 2-16 row verify pass has the logits it has when decoded alone. Power check: with the attention
    left to MLX (the state before this kernel), the same probe finds differing logits."""
    env = {**os.environ, "LD_PRELOAD": str(openblas_path()), "OPENBLAS_THREAD_TIMEOUT": "4"}
    runs = {}
    for mode in ("kernel", "mlx-attention"):
        args = [sys.executable, str(ROOT / "tests" / "rows_probe.py")] + ([mode] if mode != "kernel" else [])
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        runs[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        assert runs[mode]["blas"] == "openblas"
    assert runs["kernel"]["differing"] == {"2": 0, "4": 0, "8": 0, "16": 0}
    assert sum(runs["mlx-attention"]["differing"].values()) > 0
