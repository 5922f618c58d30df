"""A 16-bit checkpoint on the CPU (loading.widen_for_cpu): its Linear weight matrices stay bfloat16/float16 in
memory and the kernel widens them as it reads (exactly), while embeddings, norms and biases become float32 so every
activation is float32. The logits are bit for bit those of the same weights held as float32, at 1 and several rows;
the weights take about half the bytes, and the planner counts what is held."""

from __future__ import annotations

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from tiny import make_tiny, save_char_tokenizer

from mlxspec.kernels.verify import cpu_backend, routed_view
from mlxspec.loading import load_model


def save_16_bit(path, dtype: str, tied: bool):
    model = make_tiny("llama", seed=3, hidden_size=64, intermediate_size=128, tie_word_embeddings=tied)
    model.set_dtype(getattr(mx, dtype))
    path.mkdir(parents=True, exist_ok=True)
    config = {**model.config, "eos_token_id": 7, "torch_dtype": dtype}
    (path / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    save_char_tokenizer(path)
    return path


def widened(model: nn.Module) -> nn.Module:
    """The same weights, every one float32 (how mlxspec held a 16-bit checkpoint on the CPU before)."""
    model.set_dtype(mx.float32)
    return model


@pytest.mark.parametrize("dtype,tied", [("bfloat16", False), ("float16", True)])
def test_linear_weights_stay_16_bit_and_the_logits_are_float32s_bit_for_bit(tmp_path, dtype, tied):
    backend, why = cpu_backend()
    assert backend is not None, why
    path = save_16_bit(tmp_path / "m", dtype, tied)
    kept = load_model(path)
    linear = [m for _, m in kept.model.named_modules() if isinstance(m, nn.Linear)]
    assert linear and all(m.weight.dtype == getattr(mx, dtype) for m in linear)
    others = [v for name, v in tree_flatten(kept.model.parameters()) if not any(v is m.weight for m in linear)]
    assert others and all(v.dtype == mx.float32 for v in others)
    assert kept.compute_dtype == "float32"
    wide = widened(load_model(path).model)
    tokens = mx.array([[1, 2, 3, 4, 5, 6]])
    for view_of in (lambda m: routed_view(m, backend, attention=False), lambda m: m):  # the kernel, MLX's ops
        got, want = np.array(view_of(kept.model)(tokens)), np.array(view_of(wide)(tokens))
        assert got.dtype == np.float32
        if view_of(wide) is wide:  # MLX promotes the 16-bit weights per call: equal values, not a promise of bits
            assert np.allclose(got, want, rtol=1e-5, atol=1e-5)
        else:
            assert np.array_equal(got, want)
    one = np.array(routed_view(kept.model, backend, attention=False)(tokens[:, :1]))
    assert np.array_equal(one, np.array(routed_view(wide, backend, attention=False)(tokens[:, :1])))
    held = sum(v.nbytes for _, v in tree_flatten(kept.model.parameters()))
    assert held < 0.75 * sum(v.nbytes for _, v in tree_flatten(wide.parameters()))


def test_the_planner_counts_16_bit_matrices_as_held(tmp_path):
    from mlxspec.plan.devices import Device
    from mlxspec.plan.metadata import load_metadata
    from mlxspec.plan.weights import model_weight_bytes

    path = save_16_bit(tmp_path / "m", "bfloat16", tied=False)
    held = sum(v.nbytes for _, v in tree_flatten(load_model(path).model.parameters()))
    cpu = Device("cpu", 24 * 2**30, 16 * 2**30, "test", backend="cpu")
    planned, note = model_weight_bytes(load_metadata(str(path)), None, 64, cpu)
    assert abs(planned - held) <= 0.05 * held, (planned, held, note)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_kernel_reads_16_bit_weights_under_float32_rows_as_their_float32_values(dtype):
    """Bit for bit the product with the weights widened first, at 1..32 rows and a ragged K and N."""
    backend, why = cpu_backend()
    assert backend is not None, why
    rng = np.random.default_rng(21)
    w = mx.array(rng.standard_normal((45, 203)).astype(np.float32)).astype(getattr(mx, dtype))
    x = mx.array(rng.standard_normal((32, 203)).astype(np.float32))
    full = np.array(backend.matmul(x, w))
    assert full.dtype == np.float32 and np.array_equal(full, np.array(backend.matmul(x, w.astype(mx.float32))))
    for m in (1, 2, 5, 9):
        assert np.array_equal(np.array(backend.matmul(x[:m], w)), full[:m]), m
