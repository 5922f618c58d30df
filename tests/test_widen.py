"""The bench bed: a widened model computes the original's function (logits and greedy tokens)."""

import mlx.core as mx
import pytest
from helpers import mlx_lm_greedy
from tiny import make_tiny

from mlxspec import UserError
from mlxspec.bench.widen import WidenSpec, widen


def test_a_widened_tiny_llama_has_the_same_logits_and_greedy_tokens():
    model = make_tiny("llama", logit_scale=1.0)
    wide, config = widen(model, model.config, WidenSpec(layers=5, width=64))
    assert config["num_attention_heads"] == 8 and config["num_key_value_heads"] == 4
    assert config["intermediate_size"] == 128 and config["num_hidden_layers"] == 5
    tokens = mx.array([[1, 2, 3, 4, 5, 6, 7, 0, 1, 2]])
    assert mx.allclose(wide(tokens), model(tokens), atol=1e-4).item()
    prompt = [1, 2, 3]
    assert mlx_lm_greedy(wide, prompt, 12) == mlx_lm_greedy(model, prompt, 12)


def test_the_embedded_target_widened_keeps_its_function():
    import mlxspec

    spec = mlxspec.load(draft=None)
    target = spec.target
    wide, config = widen(target.model, target.config, WidenSpec.parse("8x576"))
    prompt = spec.encode("import os\nimport sys\n\n\ndef main(argv):")
    tokens = mx.array(prompt)[None]
    assert mx.allclose(wide(tokens), target.model(tokens), atol=1e-4).item()
    assert mlx_lm_greedy(wide, prompt, 16) == mlx_lm_greedy(target.model, prompt, 16)


@pytest.mark.parametrize("text", ["24", "0x768", "24x700", "1x768", "axb"])
def test_shapes_that_cannot_hold_the_model_are_refused(text):
    model = make_tiny("llama")
    with pytest.raises(UserError, match="--widen"):
        widen(model, model.config, WidenSpec.parse(text))


def test_bench_refuses_medusa_heads_on_a_widening(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "mlxspec", "bench", "--widen", "8x576", "--medusa", "models/medusa"],
        capture_output=True,
        text=True,
        env={"MLXSPEC_NO_OPENBLAS": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 2 and "drop --medusa" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
