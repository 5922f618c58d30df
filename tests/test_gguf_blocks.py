"""GGUF's quantized blocks kept at their own bits (mlxspec/gguf/blocks.py, weights.py): each exact block type read
into MLX's affine format dequantizes bit for bit to what the `gguf` package (llama.cpp's own numpy reader) gives;
the kernel multiplies it within float32 rounding of a float64 reference at 1..32 rows; a GGUF holding every block
type converts into a quantized mlx-lm model that computes the file's float model, and says per type what it did."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from mlx.utils import tree_flatten
from test_gguf import TOKENS, write_gguf
from tiny import make_tiny

from mlxspec.gguf.blocks import BLOCK_BYTES, EXACT, exact_affine, pack, requantized
from mlxspec.gguf.convert import converted_dir
from mlxspec.kernels.verify import count_routed, cpu_backend, routed_view

HALF_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2]}
Q6_K_BYTES = 210


def random_blocks(type_name: str, rows: int, k: int, rng, scale: float = 1.0) -> np.ndarray:
    """Valid blocks of random codes and scales: [rows, k / block * block bytes] uint8, as a GGUF holds them."""
    size = Q6_K_BYTES if type_name == "Q6_K" else BLOCK_BYTES[type_name]
    per = 256 if type_name.endswith("_K") else 32
    raw = rng.integers(0, 256, (rows, k // per * size), dtype=np.uint8)
    blocks = raw.reshape(-1, size)
    fields = [size - 2] if type_name == "Q6_K" else HALF_FIELDS[type_name]  # Q6_K's d is its last two bytes
    for offset in fields:
        d = (rng.uniform(-1, 1, blocks.shape[0]) * scale).astype(np.float16)
        blocks[:, offset : offset + 2] = d.view(np.uint8).reshape(-1, 2)
    return raw


def as_mlx(values: np.ndarray) -> mx.array:
    return mx.array(values.astype(np.float32))


@pytest.mark.parametrize("type_name", sorted(EXACT))
def test_each_exact_block_type_dequantizes_bit_for_bit_as_ggml_does(type_name):
    rng = np.random.default_rng(1)
    rows, k = 7, 512
    raw = random_blocks(type_name, rows, k, rng)
    expected = dequantize(raw, GGMLQuantizationType[type_name]).reshape(rows, k)
    held = exact_affine(raw, type_name, (rows, k))
    assert held.exact and held.bits == {"4": 4, "5": 5, "8": 8}[type_name[1]]
    # the file's own float16 scales stay float16; K-quants' products d * sc need float32
    assert held.scales.dtype == (np.float32 if type_name.endswith("_K") else np.float16)
    got = mx.dequantize(mx.array(held.weight), as_mlx(held.scales), as_mlx(held.biases), group_size=32, bits=held.bits)
    assert np.array_equal(np.array(got), expected), np.abs(np.array(got) - expected).max()


def test_a_broken_bit_layout_is_seen():
    """The guard above guards: codes packed in another order (nibbles swapped) no longer dequantize as ggml."""
    rng = np.random.default_rng(2)
    raw = random_blocks("Q4_K", 3, 256, rng)
    expected = dequantize(raw, GGMLQuantizationType.Q4_K).reshape(3, 256)
    held = exact_affine(raw, "Q4_K", (3, 256))
    as_bytes = held.weight.view(np.uint8)
    swapped = ((as_bytes << 4) | (as_bytes >> 4)).view(np.uint32)
    got = mx.dequantize(mx.array(swapped), as_mlx(held.scales), as_mlx(held.biases), group_size=32, bits=4)
    assert not np.array_equal(np.array(got), expected)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_pack_writes_mlx_bit_stream(bits):
    codes = np.random.default_rng(bits).integers(0, 2**bits, (5, 96), dtype=np.uint8)
    ones = mx.ones((5, 3))
    got = mx.dequantize(mx.array(pack(codes, bits)), ones, mx.zeros((5, 3)), group_size=32, bits=bits)
    assert np.array_equal(np.array(got), codes.astype(np.float32))


def test_q6_k_is_requantized_with_its_error_measured():
    rng = np.random.default_rng(3)
    raw = random_blocks("Q6_K", 4, 512, rng)
    values = dequantize(raw, GGMLQuantizationType.Q6_K).reshape(4, 512)
    held = requantized(values)
    assert not held.exact and held.bits == 8
    back = np.array(
        mx.dequantize(mx.array(held.weight), as_mlx(held.scales), as_mlx(held.biases), group_size=32, bits=8)
    )
    measured = np.sqrt(np.mean((back - values) ** 2)) / np.sqrt(np.mean(values**2))
    assert 0 < held.error < 0.01 and abs(held.error - measured) < 1e-3 * max(measured, 1e-6) + 1e-6


@pytest.mark.parametrize("type_name", sorted(EXACT))
def test_the_kernel_multiplies_each_block_type_at_every_row_count(type_name):
    """Against float64 on the file's values, within float32 rounding, with ragged N; every row's bits the same
    whatever rows came with it."""
    backend, why = cpu_backend()
    assert backend is not None, why
    rng = np.random.default_rng(4)
    n, k = 37, 768
    raw = random_blocks(type_name, n, k, rng, scale=0.05)
    values = dequantize(raw, GGMLQuantizationType[type_name]).reshape(n, k).astype(np.float64)
    held = exact_affine(raw, type_name, (n, k))
    w, scales, biases = mx.array(held.weight), mx.array(held.scales), mx.array(held.biases)
    x = mx.array(rng.standard_normal((32, k)).astype(np.float32))
    full = np.array(backend.qmatmul(x, w, scales, biases, 32, held.bits))
    reference = np.array(x, dtype=np.float64) @ values.T
    scale = np.abs(np.array(x, dtype=np.float64)) @ np.abs(values).T  # the sum of |terms| bounds rounding
    assert np.all(np.abs(full - reference) <= 4e-6 * scale + 1e-30), np.abs(full - reference).max()
    for m in (1, 2, 3, 4, 5, 7, 9, 17):
        assert np.array_equal(np.array(backend.qmatmul(x[:m], w, scales, biases, 32, held.bits)), full[:m]), m


# ---- a whole GGUF of quantized tensors ----

TYPES_BY_LAYER = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K"]


def tiny_llama():
    return make_tiny("llama", seed=5, vocab_size=len(TOKENS), hidden_size=256, intermediate_size=512,
                     num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, rope_scaling=None)  # fmt: skip


def quantized_gguf(tmp_path, with_q6_k: bool):
    """A tiny llama (permuted q/k rows) whose every matrix is a random quantized tensor, one block type after
    another, and the float model the file means (the gguf package's dequantization, llama.cpp's permutation undone)."""
    model, expected = tiny_llama(), tiny_llama()
    rng = np.random.default_rng(6)
    raw_by_name, floats = {}, []
    for index, (name, weight) in enumerate((n, w) for n, w in tree_flatten(model.parameters()) if w.ndim == 2):
        type_name = "Q6_K" if with_q6_k and "down_proj" in name else TYPES_BY_LAYER[index % len(TYPES_BY_LAYER)]
        raw = random_blocks(type_name, *weight.shape, rng, scale=0.02)
        raw_by_name[name] = (type_name, raw)
        values = dequantize(raw, GGMLQuantizationType[type_name]).reshape(weight.shape)
        floats.append((name, mx.array(unpermuted(name, values, model.config))))
    path = write_gguf(tmp_path / "quantized.gguf", model, "llama", raw_tensors=raw_by_name)
    expected.load_weights(floats, strict=False)
    return path, expected, raw_by_name


def unpermuted(name: str, value: np.ndarray, config: dict) -> np.ndarray:
    if not name.endswith(("q_proj.weight", "k_proj.weight")):
        return value
    heads = config["num_attention_heads"] if "q_proj" in name else config["num_key_value_heads"]
    rows = value.shape[0]
    return value.reshape(heads, rows // heads // 2, 2, *value.shape[1:]).swapaxes(1, 2).reshape(value.shape)


@pytest.mark.parametrize("with_q6_k", [False, True])
def test_a_quantized_gguf_converts_at_its_own_bits(tmp_path, monkeypatch, with_q6_k):
    from mlxspec.loading import load_model

    monkeypatch.setenv("MLXSPEC_CACHE", str(tmp_path / "cache"))
    path, expected, raw_by_name = quantized_gguf(tmp_path, with_q6_k)
    lines = []
    out = converted_dir(path, say=lines.append)
    report = {line.split(":")[0]: line for line in lines[1:-1] if line.startswith(("Q", "F"))}
    for type_name in {t for t, _ in raw_by_name.values()}:
        assert type_name in report, lines
        assert report[type_name].endswith("exact") == (type_name != "Q6_K"), report[type_name]
    config = json.loads((out / "config.json").read_text())
    bits = {name.removesuffix(".weight"): int(t[1]) for name, (t, _) in raw_by_name.items()}
    factored = config.get("k_quants", {})  # Q4_K and Q5_K held as the file holds them (k_quants.py)
    assert set(factored) == {name.removesuffix(".weight") for name, (t, _) in raw_by_name.items() if t[1:] == "4_K"
                             or t[1:] == "5_K"}  # fmt: skip
    for prefix, want in bits.items():
        held = factored[prefix] if prefix in factored else config["quantization"][prefix]["bits"]
        assert held == (8 if want == 6 else want), prefix
    marker = json.loads((out / "gguf_source.json").read_text())
    assert "Q4_K:4-bit" in marker["weights"]
    loaded = load_model(path)
    quantized = {p: m for p, m in loaded.model.named_modules() if hasattr(m, "bits")}
    assert set(quantized) == set(bits)
    assert loaded.compute_dtype == "float32"
    tokens = mx.array([[2, 5, 6, 7, 8, 9, 10, 11, 12, 5, 6]])
    want, got = np.array(expected(tokens)), np.array(loaded.model(tokens))
    tolerance = 0.05 if with_q6_k else 1e-3  # exact block types: float32 rounding; Q6_K: re-quantized
    assert np.abs(got - want).max() <= tolerance * np.abs(want).max(), np.abs(got - want).max()
    routed = routed_view(loaded.model, cpu_backend()[0])  # the kernel: every quantized layer, float16 scales too
    assert count_routed(routed) >= len(bits)
    kernel = np.array(routed(tokens[:, :1]))  # one row: the kernel's path, not MLX's beyond 32 rows
    assert np.abs(kernel - want[:, :1]).max() <= tolerance * np.abs(want).max()


def test_the_planner_counts_a_gguf_at_its_own_bits(tmp_path, monkeypatch):
    """From the header alone, the weight bytes the loaded model holds on the CPU (within 5%: a quantized
    embedding's scales widen to float32 there), not the float16 of a dequantized conversion."""
    from mlxspec.loading import load_model
    from mlxspec.plan.metadata import load_metadata

    monkeypatch.setenv("MLXSPEC_CACHE", str(tmp_path / "cache"))
    path, _, _ = quantized_gguf(tmp_path, with_q6_k=True)
    planned = load_metadata(str(path)).weight_bytes
    held = sum(v.nbytes for _, v in tree_flatten(load_model(path).model.parameters()))
    assert abs(planned - held) <= 0.05 * held, (planned, held)
