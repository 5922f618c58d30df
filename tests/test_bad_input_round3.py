"""Bad input, round three (issue 36): each row refused in one line with exit 2 (a UserError through the API), or
correct. The hostile torch checkpoints (rows 1, 2, 4, 5) are in test_hostile_checkpoints.py; the server's rows run
against a real `mlxspec serve` process in test_server_bad_input.py."""

from __future__ import annotations

import json
import shutil
import time

import mlx.core as mx
import pytest
from helpers import assert_one_line
from test_dflash import loaded, tiny_target
from tiny_dflash import save_zlab_dflash

import mlxspec
from mlxspec import UserError
from mlxspec.drafting.dflash.files import load_dflash

G = ("generate", "def f(", "--max-tokens", "8")


# ---- row 3: counts in a config are checked before anything is built from them ----


@pytest.fixture(scope="module")
def medusa_dir(tiny_dirs, tmp_path_factory):
    from mlxspec.drafting.heads.files import base_model_identity
    from mlxspec.drafting.heads.medusa import MedusaConfig, MedusaHeads, save_medusa
    from mlxspec.loading import load_model

    target = load_model(tiny_dirs["target"])
    hidden, vocab = target.config["hidden_size"], target.config["vocab_size"]
    config = MedusaConfig(
        num_heads=2, hidden_size=hidden, vocab_size=vocab, base_model_identity=base_model_identity(target.path)
    )
    path = tmp_path_factory.mktemp("medusa") / "heads"
    save_medusa(MedusaHeads(config), path)
    return path


@pytest.mark.parametrize("heads, message", [(10**9, "num_heads=1000000000"), (2**62, "1-64"), (40, "40, but its")])
def test_a_medusa_config_with_too_many_heads_is_refused_before_building_them(
    cli_run, tiny_dirs, medusa_dir, tmp_path, heads, message
):
    copy = tmp_path / "heads"
    shutil.copytree(medusa_dir, copy)
    config = json.loads((copy / "medusa_config.json").read_text())
    (copy / "medusa_config.json").write_text(json.dumps({**config, "num_heads": heads}))
    start = time.perf_counter()
    assert_one_line(cli_run(*G, "--model", tiny_dirs["target"], "--medusa", copy), message)
    assert time.perf_counter() - start < 60  # (a hang guard: 10^9 heads took 51 s to run out of memory)


@pytest.mark.parametrize(
    "where, key, value, message",
    [
        ("dflash_config", "block_size", 10**9, "block_size=1000000000"),
        ("dflash_config", "block_size", 2**62, "from 2 to 1024"),
        ("", "num_hidden_layers", 10**9, "num_hidden_layers=1000000000"),
        ("", "num_hidden_layers", 200, "200 layers but holds"),
        ("", "hidden_size", "64", "hidden_size='64'"),
        ("", "intermediate_size", [48], "intermediate_size=[48]"),
        ("", "rope_scaling", "linear", "rope_scaling='linear'"),
        ("", "rope_scaling", ["linear", 2], "rope_scaling=['linear', 2]"),
        ("", "rope_scaling", {"rope_type": "linear"}, "factor=None"),
        ("", "rope_scaling", {"rope_type": "longrope", "factor": 8.0}, "is not one mlx-lm can build"),
        ("", "rope_scaling", {"rope_type": "nonsense"}, "is not one mlx-lm can build"),
        ("", "rope_scaling", {"rope_type": 5}, "rope_type=5"),
    ],
)
def test_a_dflash_config_out_of_range_or_of_the_wrong_type_is_refused_by_name(tmp_path, where, key, value, message):
    target = tiny_target("llama")
    path = save_zlab_dflash(tmp_path / "d", target, "old")
    config = json.loads((path / "config.json").read_text())
    (config[where] if where else config)[key] = value
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=None) as error:
        load_dflash(path, loaded(target))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_dflash_drafter_with_linear_rope_scaling_and_a_factor_loads(tmp_path):
    target = tiny_target("llama")
    path = save_zlab_dflash(tmp_path / "d", target, "old")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}))
    assert load_dflash(path, loaded(target)).config.rope_scaling["factor"] == 2.0


assert mx and mlxspec


# ---- row 6: a top-p that is 0 in float32 keeps the best token, as any tiny top-p does ----

EDGE_TOP_PS = [1e-300, 1e-46, 1.4e-45, 1e-40, 1.1754943508222875e-38, 1e-30]


def test_a_top_p_at_the_float32_edges_keeps_the_best_token_in_every_path():
    """Every tiny top-p samples the greedy text: plain decoding, draft-model chains (rejection) and lookup (match),
    and the whole-vocabulary ranking that redraws a short row."""
    import numpy as np

    from mlxspec.decoding.sampling import to_probs_checked, to_probs_sorted
    from mlxspec.options import SamplingConfig

    logits = mx.array(np.random.default_rng(0).normal(size=(3, 5000)).astype(np.float32) * 3)
    best = np.array(mx.argmax(logits, axis=-1))
    for top_p in EDGE_TOP_PS:
        config = SamplingConfig(1.0, top_p, 0, 0.0)
        for probs in (to_probs_checked(logits, config)[0], to_probs_sorted(logits, config)):
            probs = np.array(probs)
            assert np.isfinite(probs).all(), top_p
            assert (probs.argmax(axis=-1) == best).all() and np.allclose(probs.max(axis=-1), 1.0), top_p
    spec = mlxspec.load()
    prompt = '# Copyright 2001\n"""Utilities for'
    greedy = spec.generate(prompt, max_tokens=12, temperature=0.0, use_draft=False).tokens
    for top_p in (1e-300, 1e-40):
        for changes in (dict(use_draft=False), dict(num_draft=3), dict(use_draft=False, lookup=True)):
            got = spec.generate(prompt, max_tokens=12, temperature=1.0, top_p=top_p, seed=3, **changes).tokens
            assert got == greedy, (top_p, changes)


def test_the_cli_samples_the_greedy_text_at_a_top_p_of_1e_300(cli_run):
    prompt = '# Copyright 2001\n"""Utilities for'
    common = ("generate", prompt, "--max-tokens", "12", "--json")
    code, greedy, err = cli_run(*common, "--temp", "0", "--no-draft")
    assert code == 0, err
    code, tiny, err = cli_run(*common, "--temp", "1", "--top-p", "1e-300", "--no-draft")
    assert code == 0, err
    assert json.loads(tiny)["tokens"] == json.loads(greedy)["tokens"]
