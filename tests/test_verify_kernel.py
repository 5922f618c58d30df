"""The verify kernel (csrc/, mlxspec/verify_kernel.py): equal to MLX's matmuls, rows independent of the row count,
and routed through a model's layers for one generation only."""

from __future__ import annotations

import os
import shutil

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from helpers import assert_greedy_equal, mlx_lm_greedy, speculative_tokens
from mlx.utils import tree_flatten
from tiny import make_tiny

from mlxspec.errors import UserError
from mlxspec.kernels import verify as verify_kernel

BACKEND, WHY = verify_kernel.cpu_backend()
NO_COMPILER = shutil.which("c++") is None and shutil.which("g++") is None and shutil.which("clang++") is None
if BACKEND is None and (NO_COMPILER or os.environ.get("MLXSPEC_NO_KERNEL")):
    pytest.skip(f"the verify kernel was not built on this machine: {WHY}", allow_module_level=True)


def test_the_kernel_is_built_where_a_compiler_is():
    assert BACKEND is not None, f"a C++ compiler is installed but the verify kernel is unavailable: {WHY}"


TOLERANCE = {mx.float32: 2e-5, mx.bfloat16: 2e-2, mx.float16: 2e-3}
# (N, K): odd column counts (not a multiple of the 4-column tile) and K not a multiple of the 16-lane vector
SHAPES = [(48, 64), (37, 50), (130, 300), (5, 7)]
ROWS = [1, 2, 3, 4, 5, 8, 15, 16]


def assert_close(got: mx.array, expected: mx.array, dtype) -> None:
    got, expected = got.astype(mx.float32), expected.astype(mx.float32)
    scale = max(1.0, mx.abs(expected).max().item())
    assert mx.abs(got - expected).max().item() <= TOLERANCE[dtype] * scale


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
def test_dense_kernel_equals_matmul(dtype, shape):
    n, k = shape
    mx.random.seed(n * k)
    w = mx.random.normal((n, k)).astype(dtype)
    for m in ROWS:
        x = mx.random.normal((m, k)).astype(dtype)
        got = BACKEND.matmul(x, w)
        assert got.dtype == dtype and got.shape == (m, n)
        assert_close(got, x.astype(mx.float32) @ w.astype(mx.float32).T, dtype)


def quantized(n: int, k: int, group_size: int, bits: int, scale_dtype):
    w = mx.random.normal((n, k))
    q, scales, biases = mx.quantize(w, group_size=group_size, bits=bits)
    return q, scales.astype(scale_dtype), biases.astype(scale_dtype)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("scale_dtype", [mx.float32, mx.bfloat16], ids=["f32", "bf16"])
def test_quantized_kernel_equals_quantized_matmul(bits, group_size, scale_dtype):
    mx.random.seed(bits * group_size)
    n, k = 37, 384
    q, scales, biases = quantized(n, k, group_size, bits, scale_dtype)
    for m in ROWS:
        x = mx.random.normal((m, k)).astype(scale_dtype)
        got = BACKEND.qmatmul(x, q, scales, biases, group_size, bits)
        expected = mx.quantized_matmul(x, q, scales, biases, transpose=True, group_size=group_size, bits=bits)
        assert got.dtype == expected.dtype and got.shape == expected.shape == (m, n)
        # against the float32 product of the same dequantized weights: MLX's own bf16 kernel rounds as it goes
        f32 = [a.astype(mx.float32) for a in (scales, biases)]
        exact = x.astype(mx.float32) @ mx.dequantize(q, *f32, group_size=group_size, bits=bits).T
        assert_close(got, exact, scale_dtype)
        if scale_dtype == mx.float32:
            assert_close(got, expected, mx.float32)


def kernel_calls():
    """One call per weight format: dense f32/bf16 and 4-/8-bit, on a matrix big enough to split over threads."""
    mx.random.seed(7)
    n, k = 300, 512  # 600 KB of float32: past the single-thread cutoff, so the threaded split is covered too
    w = mx.random.normal((n, k))
    calls = {
        "f32": (mx.float32, lambda x: BACKEND.matmul(x, w)),
        "bf16": (mx.bfloat16, lambda x: BACKEND.matmul(x, w.astype(mx.bfloat16))),
    }
    for bits in (4, 8):
        q, s, b = mx.quantize(w, group_size=64, bits=bits)
        calls[f"q{bits}"] = (mx.float32, lambda x, q=q, s=s, b=b, bits=bits: BACKEND.qmatmul(x, q, s, b, 64, bits))
    return k, calls


def test_each_row_is_bitwise_the_row_computed_alone():
    """Row i of an M-row call equals a 1-row call bit for bit, for M = 1..MAX_ROWS (32) and every weight format."""
    k, calls = kernel_calls()
    rows = verify_kernel.MAX_ROWS
    for name, (dtype, call) in calls.items():
        x = mx.random.normal((rows, k)).astype(dtype)
        alone = mx.concatenate([call(x[i : i + 1]) for i in range(rows)])
        for m in range(1, rows + 1):
            together = call(x[:m][None])[0]  # a [1, M, K] input, as a model's layers see it
            assert mx.array_equal(together, alone[:m]).item(), f"{name}: rows of an {m}-row call differ"


def test_the_threaded_split_matches_matmul():
    mx.random.seed(3)
    x, w = mx.random.normal((3, 512)), mx.random.normal((300, 512))  # 600 KB: split over the kernel's threads
    assert_close(BACKEND.matmul(x, w), x @ w.T, mx.float32)


def test_bad_operands_are_refused_by_the_kernel():
    with pytest.raises(ValueError, match="share one float dtype"):  # 16-bit rows against float32 weights
        BACKEND.matmul(mx.ones((2, 4), mx.bfloat16), mx.ones((3, 4)))
    with pytest.raises(ValueError, match="share one float dtype"):
        BACKEND.matmul(mx.ones((2, 4)), mx.ones((3, 4), mx.int32))
    with pytest.raises(ValueError, match="x \\[..., K\\]"):
        BACKEND.matmul(mx.ones((2, 5)), mx.ones((3, 4)))
    q, s, b = mx.quantize(mx.ones((8, 64)), group_size=64, bits=4)
    with pytest.raises(ValueError, match="2, 3, 4, 5, 6 and 8 bits"):
        BACKEND.qmatmul(mx.ones((1, 64)), q, s, b, 64, 7)
    with pytest.raises(ValueError, match="disagree in shape"):  # 4-bit codes read as 3-bit ones
        BACKEND.qmatmul(mx.ones((1, 64)), q, s, b, 64, 3)


# ---- mlx-lm's swiglu through the kernel ----


def same_bits(a: mx.array, b: mx.array) -> bool:
    """Equal bit for bit, NaNs of either sign counting as equal."""
    x, y = np.array(a), np.array(b)
    return bool(np.all((x.view(np.uint32) == y.view(np.uint32)) | (np.isnan(x) & np.isnan(y))))


EDGES = [
    0.0,
    -0.0,
    1e-30,
    -1e-30,
    1e-45,
    88.0,
    88.1,
    -88.0,
    -88.1,
    87.9,
    -87.9,
    100.0,
    -100.0,
    3.4e38,
    -3.4e38,
    np.inf,
    -np.inf,
    np.nan,
]


def test_the_kernel_swiglu_is_mlx_lms_bit_for_bit():
    from mlx_lm.models.activations import swiglu

    rng = np.random.default_rng(0)
    # gates over every range exp sees (its clamps at +-88 and the overflow past them), odd lengths for the tails
    gate = np.concatenate([rng.standard_normal(20_001) * s for s in (0.05, 1, 4, 20, 60)] + [np.array(EDGES)])
    up = rng.standard_normal(gate.size) * 3
    g, u = mx.array(gate.astype(np.float32)), mx.array(up.astype(np.float32))
    assert same_bits(BACKEND.swiglu(g, u), swiglu(g, u))
    assert same_bits(BACKEND.swiglu(g, u), nn.silu(g) * u)  # the uncompiled ops too
    three_d = (g[: 3 * 8960].reshape(1, 3, 8960), u[: 3 * 8960].reshape(1, 3, 8960))  # an MLP's [B, L, D]
    assert same_bits(BACKEND.swiglu(*three_d), swiglu(*three_d))
    strided = (g[: 2 * 999].reshape(999, 2).T, u[: 2 * 999].reshape(999, 2).T)  # made contiguous first
    assert same_bits(BACKEND.swiglu(*strided), swiglu(*strided))


def test_the_kernel_swiglu_leaves_what_it_does_not_take_to_mlx_lm():
    from mlxspec.kernels.activations import KernelSwiglu

    stand_in = KernelSwiglu(BACKEND)
    g16, u16 = mx.ones((4, 8), dtype=mx.float16), mx.ones((4, 8), dtype=mx.float16)
    assert stand_in(g16, u16).dtype == mx.float16  # the kernel takes float32 only
    g, u = mx.array(np.linspace(-3, 3, 8, dtype=np.float32)), mx.ones((4, 8))
    assert stand_in(g, u).shape == (4, 8)  # broadcast shapes: mlx-lm's


def test_the_kernel_rms_norm_is_mlx_fasts_bit_for_bit():
    rng = np.random.default_rng(1)
    for d in (1, 7, 256, 640, 1536):  # Gemma's head norms, both beds' hidden sizes, odd widths
        for scale in (1e-3, 1.0, 40.0, 1e4):
            x = mx.array((rng.standard_normal((3, 2, d)) * scale).astype(np.float32))
            w = mx.array(rng.standard_normal(d).astype(np.float32))
            for eps in (1e-6, 1e-5):
                assert same_bits(BACKEND.rms_norm(x, w, eps), mx.fast.rms_norm(x, w, eps)), (d, scale, eps)
    edges = mx.array(np.array([EDGES[:16]], dtype=np.float32))  # overflowing squares, zeros, infinities
    assert same_bits(BACKEND.rms_norm(edges, mx.ones((16,)), 1e-6), mx.fast.rms_norm(edges, mx.ones((16,)), 1e-6))
    strided = mx.array(rng.standard_normal((64, 4)).astype(np.float32)).T  # made contiguous first
    w = mx.array(rng.standard_normal(64).astype(np.float32))
    assert same_bits(BACKEND.rms_norm(strided, w, 1e-6), mx.fast.rms_norm(strided, w, 1e-6))


def test_the_norm_stand_in_is_mlx_core_but_for_rms_norm_and_leaves_what_it_does_not_take():
    from mlxspec.kernels.norms import MxWithKernelNorm

    stand_in = MxWithKernelNorm(BACKEND)
    assert stand_in.array is mx.array and stand_in.fast.rope is mx.fast.rope  # every other name is mlx.core's
    x16, w16 = mx.ones((2, 8), dtype=mx.float16), mx.ones((8,), dtype=mx.float16)
    assert stand_in.fast.rms_norm(x16, w16, 1e-6).dtype == mx.float16  # MLX's own
    assert stand_in.fast.rms_norm(mx.ones((2, 8)), None, 1e-6).shape == (2, 8)  # no weight: MLX's own


# ---- routing a model's layers ----


def layer_types(model: nn.Module) -> list[type]:
    return [type(m) for _, m in model.named_modules()]


@pytest.mark.parametrize("family", ["llama", "gemma2"])  # untied LM head; tied embedding as the LM head
def test_the_routed_view_keeps_the_logits_shares_the_weights_and_leaves_the_model_alone(family):
    model = make_tiny(family, seed=1, vocab_size=32)
    tokens = mx.array([[1, 5, 9, 3, 7]])
    before_types, before_logits = layer_types(model), model(tokens)
    weights = {id(v) for _, v in tree_flatten(model.parameters())}
    view = verify_kernel.routed_view(model, BACKEND)
    routed = layer_types(view)
    count = verify_kernel.count_routed(view)
    attention = sum("scaled_dot_product_attention" in getattr(t, "routed", ()) for t in routed)
    swiglu = sum("swiglu" in getattr(t, "routed", ()) for t in routed)
    # llama's attention calls mlx-lm's scaled_dot_product_attention, so every layer's is routed; gemma2 computes
    # its soft-capped attention by hand, which the kernel does not take. llama's MLP calls mlx-lm's swiglu, gemma2's
    # a GELU
    assert attention == (model.args.num_hidden_layers if family == "llama" else 0)
    assert swiglu == (model.args.num_hidden_layers if family == "llama" else 0)
    norms = sum("mx" in getattr(t, "routed", ()) for t in routed)  # every RMS norm: two a layer and the final one
    assert norms == (2 if family == "llama" else 4) * model.args.num_hidden_layers + 1
    assert count == sum(t in (verify_kernel.VerifyLinear, verify_kernel.VerifyEmbedding) for t in routed) + attention
    assert_close(view(tokens), before_logits, mx.float32)
    assert layer_types(model) == before_types  # the model itself is never changed
    assert {id(v) for _, v in tree_flatten(view.parameters())} == weights  # shared, never copied
    assert verify_kernel.routed_view(model, BACKEND) is view  # built once per model
    assert verify_kernel.routed_view(model, None) is model


def test_routing_a_quantized_model_calls_the_quantized_kernel():
    model = make_tiny("llama", seed=2, vocab_size=32, hidden_size=64, intermediate_size=128)
    nn.quantize(model, group_size=32, bits=4)
    tokens = mx.array([[1, 5, 9]])
    expected = model(tokens)
    view = verify_kernel.routed_view(model, BACKEND)
    assert any(isinstance(m, verify_kernel.VerifyQuantizedLinear) for _, m in view.named_modules())
    assert_close(view(tokens), expected, mx.float32)


@pytest.mark.parametrize("reference_blas", [False, True], ids=["real-blas", "reference-blas"])
def test_more_rows_than_the_kernel_takes(monkeypatch, reference_blas):
    """With a real BLAS, MLX's matmul unchanged; with MLX's reference BLAS (about 1 GFLOP/s), the kernel MAX_ROWS
    rows at a time, every row bit for bit what it gives alone. A quantized layer always takes the kernel in chunks
    (MLX's CPU quantized_matmul re-reads the weights for every row)."""
    monkeypatch.setattr(verify_kernel, "_reference_blas", lambda: reference_blas)
    layer = nn.Linear(24, 10)
    x = mx.random.normal((1, 2 * verify_kernel.MAX_ROWS + 3, 24))
    routed = verify_kernel.route_layer(layer, BACKEND)
    assert isinstance(routed, verify_kernel.VerifyLinear)
    alone = mx.concatenate([routed(x[:, i : i + 1]) for i in range(x.shape[1])], axis=1)
    assert mx.array_equal(routed(x), alone if reference_blas else layer(x)).item()
    quantized = verify_kernel.route_layer(nn.QuantizedLinear(64, 10, group_size=32, bits=5), BACKEND)
    x = mx.random.normal((1, 2 * verify_kernel.MAX_ROWS + 3, 64))
    alone = mx.concatenate([quantized(x[:, i : i + 1]) for i in range(x.shape[1])], axis=1)
    assert mx.array_equal(quantized(x), alone).item()


def test_kernel_choice_is_resolved_by_device_and_name():
    backend, status = verify_kernel.resolve("off")
    assert backend is None and status.startswith("off")
    backend, status = verify_kernel.resolve("on")
    assert backend is BACKEND and status == ""
    with pytest.raises(UserError, match="not one of auto, on, off"):
        verify_kernel.resolve("fast")


# ---- the engine with the kernel on ----


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_greedy_speculation_through_the_kernel_equals_plain_decoding_through_it(family):
    """Both sides through the kernel: rows never depend on how many were verified together, so the tokens match
    (and match mlx-lm's own decoding up to near-ties of its different matmul)."""
    target = make_tiny(family, seed=0, vocab_size=32)
    draft = make_tiny(family, seed=3, vocab_size=32)
    prompt = [1, 2, 3, 4]
    plain = speculative_tokens(target, None, prompt, 24, kernel="on")
    engines = []
    speculative = speculative_tokens(target, draft, prompt, 24, num_draft=4, kernel="on", engine_out=engines)
    assert speculative == plain
    assert engines[0].target_calls < 24  # drafts were accepted: fewer target forwards than tokens
    assert_greedy_equal(target, prompt, plain, mlx_lm_greedy(target, prompt, 24))


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("scale_dtype", [mx.float32, mx.bfloat16, mx.float16], ids=["f32", "bf16", "f16"])
def test_the_quantized_path_matches_its_scalar_reference_at_every_row_count(bits, group_size, scale_dtype):
    """The vector path (csrc/matmul_affine.cpp: codes widened and dequantized in registers) against the scalar
    reference beside it (double accumulation over MLX's packed layout, value 2b in the low nibble of byte b), for
    M = 1..32 with ragged N and a K of 3 or 5 groups. Tolerance: float32 accumulation over K <= 640 terms of
    magnitude ~1, 2e-5 relative to the largest output; a misread nibble or group is off by O(1)."""
    if not hasattr(BACKEND.module, "affine_reference"):
        pytest.fail("the kernel was built without its scalar reference; reinstall (pip install -e .)")
    mx.random.seed(bits + group_size)
    for n, groups in ((1, 3), (5, 5), (37, 3)):
        k = group_size * groups
        q, scales, biases = quantized(n, k, group_size, bits, scale_dtype)
        x = mx.random.normal((32, k))
        reference = BACKEND.module.affine_reference(x, q, scales, biases, group_size, bits)
        largest = mx.abs(reference).max().item()
        for m in (1, 2, 3, 4, 5, 8, 17, 32):
            got = BACKEND.qmatmul(x[:m], q, scales, biases, group_size, bits)
            error = mx.abs(got - reference[:m]).max().item()
            assert error <= 2e-5 * max(largest, 1.0), (n, k, m, error, largest)
