"""The opt-in int8-activation path of the quantized kernel (csrc/matmul_affine_q8.cpp): x quantized per block of 32
to int8 (d = max|x| / 127, xq = round-half-even(x * (1 / d))), then integer dot products with the weight codes.

Held against a numpy float64 reference of the whole formula written here from the definition (not from the
kernel), against the kernel's own scalar reference, and for row independence: the path is lossy, but it must be
exactly the lossy thing it says, and a row's bits must not depend on the rows beside it."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxspec.kernels import verify as verify_kernel

BACKEND, WHY = verify_kernel.cpu_backend()
if BACKEND is None or not hasattr(BACKEND.module, "affine_reference"):
    pytest.skip(f"the verify kernel was not built on this machine: {WHY}", allow_module_level=True)

BLOCK = 32


def int8_product(x, q, scales, biases, group_size: int, bits: int) -> mx.array:
    return BACKEND.module.verify_qmatmul(x, q, scales, biases, group_size, bits, int8_activations=True, stream=mx.cpu)


def unpacked_codes(q: mx.array, bits: int, k: int) -> np.ndarray:
    """MLX's little-endian bit stream per row: value c of a row at bits [c * bits, (c + 1) * bits)."""
    packed = np.array(q).view(np.uint8)
    stream = np.unpackbits(packed, axis=1, bitorder="little")[:, : k * bits].reshape(len(packed), k, bits)
    return (stream.astype(np.int64) << np.arange(bits)).sum(axis=2)


def numpy_reference(x, q, scales, biases, group_size: int, bits: int) -> np.ndarray:
    """y = sum over blocks of d * (scale * dot(codes, xq) + bias * sum(xq)), the quantization in float32 as the
    kernel's definition states, everything after it in float64."""
    xf = np.array(x.astype(mx.float32))
    m, k = xf.shape
    blocks = xf.reshape(m, k // BLOCK, BLOCK)
    d = (np.abs(blocks).max(axis=2) / np.float32(127)).astype(np.float32)
    inverse = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
    xq = np.rint(blocks * inverse[:, :, None]).astype(np.int64)  # float32 product, ties to even
    codes = unpacked_codes(q, bits, k).reshape(-1, k // BLOCK, BLOCK)
    dots = np.einsum("mbc,nbc->mnb", xq, codes).astype(np.float64)
    per_group = group_size // BLOCK
    s = np.repeat(np.array(scales.astype(mx.float32)).astype(np.float64), per_group, axis=1)  # [n, blocks]
    b = np.repeat(np.array(biases.astype(mx.float32)).astype(np.float64), per_group, axis=1)
    sums = xq.sum(axis=2).astype(np.float64)  # [m, blocks]
    dd = d.astype(np.float64)
    return (dd[:, None, :] * (s[None] * dots + b[None] * sums[:, None, :])).sum(axis=2)


def quantized(n: int, k: int, group_size: int, bits: int, scale_dtype):
    w = mx.random.normal((n, k))
    q, scales, biases = mx.quantize(w, group_size=group_size, bits=bits)
    return q, scales.astype(scale_dtype), biases.astype(scale_dtype)


@pytest.mark.parametrize("bits", [4, 5, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("scale_dtype", [mx.float32, mx.bfloat16, mx.float16], ids=["f32", "bf16", "f16"])
def test_int8_activations_equal_their_definition_at_every_row_count(bits, group_size, scale_dtype):
    """For M = 1..32, ragged N (1, 5, 37: not multiples of the 4-column tile) and 3 or 9 groups. Tolerance: the
    kernel sums K / 32 block terms in float32, 2e-5 relative to the largest output; one activation rounded a step
    the other way moves an output by d * scale, about 1e-3 of it, and a misread code by far more."""
    mx.random.seed(7 * bits + group_size)
    for n, groups in ((1, 3), (5, 9), (37, 3)):
        k = group_size * groups
        q, scales, biases = quantized(n, k, group_size, bits, scale_dtype)
        x = mx.random.normal((32, k)) * mx.random.uniform(0.1, 3.0, (32, 1))
        x[3, :BLOCK] = 0.0  # an all-zero block: d = 0, no division by it
        expected = numpy_reference(x, q, scales, biases, group_size, bits)
        reference = np.array(BACKEND.module.affine_reference(x, q, scales, biases, group_size, bits, True))
        largest = max(np.abs(expected).max(), 1.0)
        assert np.abs(reference - expected).max() <= 2e-6 * largest
        for m in (1, 2, 3, 4, 5, 8, 17, 32):
            got = np.array(int8_product(x[:m], q, scales, biases, group_size, bits))
            error = np.abs(got - expected[:m]).max()
            assert error <= 2e-5 * largest, (n, k, m, error, largest)


@pytest.mark.parametrize("bits", [4, 5, 8])
def test_each_int8_row_is_bitwise_the_row_computed_alone(bits):
    """Speculative output equals plain decoding in this mode only if a row's bits do not depend on M or the tile;
    N = 3000 x K = 512 at 4 bits is over the threaded split's threshold, so the split is exercised too."""
    mx.random.seed(bits)
    n, k, group_size = 3000, 512, 64
    q, scales, biases = quantized(n, k, group_size, bits, mx.float16)
    x = mx.random.normal((32, k))
    alone = [int8_product(x[i : i + 1], q, scales, biases, group_size, bits) for i in range(32)]
    for m in (2, 3, 5, 8, 9, 32):
        together = int8_product(x[:m], q, scales, biases, group_size, bits)
        for i in range(m):
            assert mx.array_equal(together[i : i + 1], alone[i]).item(), (m, i)


@pytest.mark.parametrize("bits", [4, 5, 8])
def test_int8_activations_stay_near_the_float_product(bits):
    """The lossy part, bounded: per block, rounding x to int8 moves each value by at most d / 2 = max|x| / 254,
    so |y_int8 - y_float| <= sum over blocks of max|x_b| / 254 * sum |w| over the block. Checked as that bound,
    and as an error far under the product's own size (a sign or scale slip would not be)."""
    mx.random.seed(11 + bits)
    n, k, group_size = 64, 1024, 64
    q, scales, biases = quantized(n, k, group_size, bits, mx.float32)
    x = mx.random.normal((4, k))
    w = mx.dequantize(q, scales, biases, group_size=group_size, bits=bits)
    exact = np.array(x, dtype=np.float64) @ np.array(w, dtype=np.float64).T
    got = np.array(int8_product(x, q, scales, biases, group_size, bits))
    amax = np.abs(np.array(x)).reshape(4, -1, BLOCK).max(axis=2)  # [m, blocks]
    wsum = np.abs(np.array(w, dtype=np.float64)).reshape(n, -1, BLOCK).sum(axis=2)  # [n, blocks]
    bound = (amax[:, None, :] / 254.0 * wsum[None]).sum(axis=2) * (1 + 1e-4) + 1e-5
    assert (np.abs(got - exact) <= bound).all()
    relative = np.abs(got - exact).max() / np.abs(exact).max()
    assert 0 < relative < 0.02, relative  # lossy (never silently the float path), and not by much


def test_int8_activations_refuse_the_bits_they_do_not_take():
    q, scales, biases = quantized(8, 64, 32, 3, mx.float32)
    with pytest.raises(ValueError, match="4-, 5- and 8-bit"):
        int8_product(mx.zeros((1, 64)), q, scales, biases, 32, 3)


# ---- --kernel int8 as a user runs it ----


@pytest.fixture(scope="module")
def quantized_pair(tiny_dirs):
    import mlxspec

    return mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["target"], quantize_target=4, draft_bits=4)


def test_speculation_with_int8_activations_equals_plain_decoding_with_them(quantized_pair):
    """Exactness holds within the mode: a draft changes nothing of its text, greedy or seeded, and stats.kernel
    says which arithmetic ran."""
    run = dict(max_tokens=24, stop_at_eos=False)
    for prompt in ("abc", "bad", "cafe"):
        plain = quantized_pair.generate(prompt, kernel="int8", use_draft=False, **run)
        drafted = quantized_pair.generate(prompt, kernel="int8", num_draft=3, **run)
        assert drafted.tokens == plain.tokens and drafted.stats.accepted > 0
        assert plain.stats.kernel.startswith("cpu-int8") and drafted.stats.kernel.startswith("cpu-int8")
        seeded = dict(run, temperature=1.0, seed=5)
        assert quantized_pair.generate(prompt, kernel="int8", num_draft=3, **seeded).tokens == (
            quantized_pair.generate(prompt, kernel="int8", use_draft=False, **seeded).tokens
        )
    assert quantized_pair.generate("abc", kernel="on", use_draft=False, **run).stats.kernel.startswith("cpu (")


def test_a_prompt_cache_never_continues_another_kernels_arithmetic(tiny_dirs):
    """KV computed with float activations is another model's for an int8 run: a cached prompt is reused only by a
    run of the same kernel, so the int8 run's text is the one it has cold."""
    import mlxspec

    run = dict(max_tokens=12, stop_at_eos=False, use_draft=False)
    cold = mlxspec.load(tiny_dirs["target"], draft=None, quantize_target=4).generate("abcabc", kernel="int8", **run)
    spec = mlxspec.load(tiny_dirs["target"], draft=None, quantize_target=4, prompt_cache=2)
    spec.generate("abcab", kernel="on", **run)
    warm = spec.generate("abcabc", kernel="int8", **run)
    assert warm.tokens == cold.tokens and warm.stats.reused_tokens == 0
    again = spec.generate("abcabc", kernel="int8", **run)  # and a run of the same kernel does reuse
    assert again.stats.reused_tokens > 0 and again.tokens == cold.tokens


def test_kernel_int8_where_it_cannot_run_is_refused_in_one_line(cli_run, monkeypatch):
    monkeypatch.setattr(verify_kernel, "cpu_backend", lambda: (None, "not built (test)"))
    code, out, err = cli_run("generate", "abc", "--max-tokens", "2", "--kernel", "int8")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "--kernel int8" in err and "--kernel auto or off" in err, err
