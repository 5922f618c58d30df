"""Hot-vocabulary EAGLE-3 heads (FR-Spec style): the output layer is the target's own rows of the draft vocabulary,
borrowed when the head is wired and never stored; the trainer's teacher logits come from cached target features.

What must hold: the borrowed rows reproduce the target's own logits of those tokens (tied, untied, soft-capped and
quantized output layers); a head written with --target-rows stores no lm_head and decodes exactly; a file that
claims borrowed rows yet ships its own is refused in one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from helpers import assert_one_line
from mlx.utils import tree_flatten
from tiny import make_tiny, save_tiny_model_dir

from mlxspec.decoding.target_features import final_norm, forward_with_hidden, output_cap, output_rows
from mlxspec.train.eagle3 import draft_vocabulary_logits


@pytest.mark.parametrize("family", ["llama", "gemma2", "gemma3_text"])
@pytest.mark.parametrize("bits", [None, 4])
def test_borrowed_rows_give_the_targets_own_logits_of_those_tokens(family, bits):
    """From the last layer's output, final norm then the borrowed rows (and the cap) equal the model's own logits at
    the draft ids: the teacher the trainer uses and the head's output layer are the target's, untouched."""
    import mlx.nn as nn

    model = make_tiny(family, seed=3, num_hidden_layers=2, vocab_size=96, hidden_size=64)
    if bits:
        nn.quantize(model, group_size=32, bits=bits)
    tokens = mx.array([[1, 5, 9, 2, 4, 11, 3, 90]])
    ids = mx.array([0, 3, 4, 9, 17, 95], dtype=mx.int32)
    last, logits = forward_with_hidden(model, tokens, None, (1,))
    ours = draft_vocabulary_logits(final_norm(model)(last), output_rows(model, ids), output_cap(model))
    assert np.allclose(np.array(ours), np.array(logits[..., ids]), atol=2e-4), family


@pytest.mark.slow
def test_a_target_rows_head_stores_no_output_layer_decodes_exactly_and_refuses_a_shipped_one(cli_run, tmp_path):
    """train-heads --kind eagle3 --target-rows on a tiny Gemma 3 target (tied output, sliding windows), with English
    prompts in its data, written under mlxspec's cache heads/: no lm_head in the file, its config says so, --eagle
    decodes as plainly; --draft auto weighs it by its recorded acceptance; the same head given an lm_head of its own
    is refused by name."""
    target_dir = save_tiny_model_dir(tmp_path / "target", "gemma3_text", seed=1, num_hidden_layers=4)
    out = Path(os.environ["MLXSPEC_CACHE"]) / "heads" / "hot"  # where --draft auto looks for trained heads
    code, _, err = cli_run(
        "train-heads", "--kind", "eagle3", "--model", target_dir, "--out", out, "--steps", "3", "--seq-len", "80",
        "--distill-sequences", "8", "--batch-size", "2", "--draft-vocab", "6", "--target-rows",
        "--english-share", "0.5",
    )  # fmt: skip
    assert code == 0, err
    assert "english, greedy" in err and "target features" in err
    raw = json.loads((out / "config.json").read_text())
    assert raw["mlxspec"]["lm_head"] == "target" and raw["draft_vocab_size"] == 6
    stored = mx.load(str(out / "model.safetensors"))
    assert not any(name.startswith("lm_head") for name in stored)
    common = ("generate", "abcab", "--model", target_dir, "--max-tokens", "12", "--json")
    code, plain, err = cli_run(*common, "--no-draft")
    assert code == 0, err
    code, drafted, err = cli_run(*common, "--eagle", out, "-k", "3")
    assert code == 0, err
    result = json.loads(drafted)
    assert result["tokens"] == json.loads(plain)["tokens"] and result["stats"]["drafted"] > 0
    # Three steps leave it weak: --draft auto lists it and passes it over, naming its recorded acceptance...
    code, listed, err = cli_run("drafters", "--model", target_dir, "--json")
    assert code == 0 and json.loads(listed)["pick"] is None, listed + err
    (ours,) = [c for c in json.loads(listed)["candidates"] if c["source"] == str(out)]
    assert "held-out acceptance" in ours["why"] and "too low to pay" in ours["why"]
    # ...and takes it once its record says it pays.
    raw["mlxspec"]["acceptance"] = [0.8, 0.7]
    (out / "config.json").write_text(json.dumps(raw))
    code, listed, err = cli_run("drafters", "--model", target_dir, "--json")
    assert code == 0 and json.loads(listed)["pick"]["source"] == str(out), listed + err
    code, auto, err = cli_run(*common, "--draft", "auto", "-k", "3")
    assert code == 0 and json.loads(auto)["mode"].startswith("eagle3"), auto + err
    assert json.loads(auto)["tokens"] == json.loads(plain)["tokens"]
    stored["lm_head.weight"] = mx.zeros((6, raw["hidden_size"]))
    mx.save_safetensors(str(out / "model.safetensors"), stored)
    assert_one_line(cli_run(*common, "--eagle", out), "yet ships lm_head.weight")


def test_training_reads_cached_target_features(tmp_path):
    """The features file holds float32 taps and final hidden states of every window, so a resumed or second run
    does not run the target again; its values are the target's."""
    from mlxspec.loading import load_model
    from mlxspec.train.eagle3 import TargetFeatures

    target = load_model(save_tiny_model_dir(tmp_path / "t", "gemma3_text", seed=2, num_hidden_layers=4))
    windows = np.arange(3 * 16, dtype=np.int32).reshape(3, 16) % 8
    lines: list[str] = []
    first = TargetFeatures(target, windows, (0, 2), tmp_path, lines.append)
    again = TargetFeatures(target, windows, (0, 2), tmp_path, lines.append)
    assert len(lines) == 1 and np.array_equal(first.taps, again.taps)
    taps, _ = forward_with_hidden(target.model, mx.array(windows), None, (0, 2))
    assert np.array_equal(first.taps, np.array(taps))
    assert first.final.shape == (3, 16, target.config["hidden_size"])
    assert dict(tree_flatten(target.model.parameters()))  # the target is untouched


def test_a_window_no_longer_than_the_prompts_is_refused_before_loading(cli_run, tmp_path):
    """A continuation of 0 tokens would reach mlx-lm's batch generator, which raises a ValueError."""
    code, out, err = cli_run("train-heads", "--kind", "eagle3", "--out", tmp_path / "h", "--seq-len", "64")
    assert code == 2 and "--seq-len 64 leaves no room for the target's continuation" in err, err
    assert "Traceback" not in err
