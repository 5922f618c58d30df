"""What chose the drafter is kept and said (issue 37's defects): a model loaded with prompt lookup as its drafter
keeps it when a call passes its own DecodeOptions; -v names --draft auto's choice and why; --json names a stored
tune as what chose; a cross-tokenizer note gives the models' vocabulary widths."""

from __future__ import annotations

import json

import pytest

import mlxspec
from mlxspec import DecodeOptions
from mlxspec.loading import DEFAULT_TARGET

PROMPT = "import os\nimport sys\nimport os\nimport sys\nimport"


@pytest.fixture(scope="module")
def own_target(tmp_path_factory):
    """The embedded target's files at a path of the user's own: no drafter fits it. (The embedded target named by its
    own path drafts with the embedded draft, issue 44.)"""
    import shutil

    out = tmp_path_factory.mktemp("own") / "target"
    shutil.copytree(DEFAULT_TARGET, out)
    return out


@pytest.mark.slow
def test_a_call_with_its_own_options_keeps_the_loads_lookup_drafter(own_target):
    spec = mlxspec.load(str(own_target), draft="auto")  # a model of "the user's own": no drafter fits it
    assert spec.options.lookup
    drafted = spec.generate(PROMPT, DecodeOptions(max_tokens=16, num_draft=4))
    assert drafted.stats.mode.startswith("lookup") and drafted.stats.accepted > 0
    plain = spec.generate(PROMPT, DecodeOptions(max_tokens=16, use_draft=False))
    assert plain.stats.mode == "plain" and plain.tokens == drafted.tokens


@pytest.mark.slow
def test_verbose_names_the_draft_auto_choice_and_why(cli_run, own_target):
    code, out, err = cli_run("generate", PROMPT, "--model", own_target, "--max-tokens", "8", "-v")
    assert code == 0, err
    assert "--draft auto: no cached drafter fits this target" in err and "prompt lookup drafts" in err
    code, out, err = cli_run("generate", PROMPT, "--model", own_target, "--max-tokens", "8")
    assert "--draft auto" not in err  # without -v nothing changes


@pytest.mark.slow  # 10-15 s on 2 cores: in the whole suite, not the quick run
def test_json_names_a_stored_tune_as_what_chose_the_drafter(cli_run):
    from mlxspec.bench.tune import Regime, Setting, save_tune
    from mlxspec.cli.tune import tune_key_for

    save_tune(tune_key_for(None, "auto"), {"greedy": Regime(Setting("lookup", None, "auto"), 100.0, 130.0)}, {})
    code, out, err = cli_run("generate", PROMPT, "--max-tokens", "8", "--json")
    assert code == 0, err
    choice = json.loads(out)["drafter_choice"]
    assert choice["chosen"]["by"] == "mlxspec tune" and choice["chosen"]["drafter"] == "lookup"
    assert "tuned on this machine" in choice["line"]


def test_the_cross_tokenizer_note_gives_the_models_vocabulary_widths():
    import tempfile
    from pathlib import Path

    from tiny import save_tiny_model_dir

    from mlxspec.drafting.cross_tokenizer.bridge import cross_tokenizer_bridge
    from mlxspec.loading import load_model

    with tempfile.TemporaryDirectory() as tmp:
        target = load_model(save_tiny_model_dir(Path(tmp) / "t", seed=0, vocab_size=40))
        draft = load_model(save_tiny_model_dir(Path(tmp) / "d", seed=1, tokenizer_chars="abc"))
        _, note = cross_tokenizer_bridge(target, draft)
    assert f"(vocabulary sizes differ: target {target.vocab_size}, draft {draft.vocab_size})" in note


def test_the_plan_counts_the_load_time_peak_of_half_precision_weights(tmp_path, cli_run):
    """On the CPU, loading widens stored float16 weights to float32 a tensor at a time: beside the float32 weights
    the tensor being cast is alive in float16 too. The plan counts that peak where it exceeds the running one, in
    a row of its own (the rows add up to the total), and says so. (Against measured peaks: the real tier.)"""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from tiny import make_tiny

    from mlxspec.plan.devices import Device
    from mlxspec.plan.metadata import load_metadata
    from mlxspec.plan.planner import PlanRequest, load_staging_bytes, make_plan

    model = make_tiny("llama", seed=0, vocab_size=4096, hidden_size=256, intermediate_size=512)
    folder = tmp_path / "half"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(model.config)))
    weights = {k: v.astype(mx.float16) for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    meta = load_metadata(str(folder))
    cpu = Device("cpu", 0, 1 << 40, "test", backend="cpu")
    plan = make_plan(PlanRequest(target=meta, device=cpu, context=64))
    staged = load_staging_bytes(PlanRequest(target=meta, device=cpu, context=64))
    assert staged == 2 * 4096 * 256  # the largest tensor (the embedding) in float16
    weights_item = next(i.bytes for i in plan.items if i.name == "target weights")
    assert plan.total_bytes >= weights_item + staged
    assert plan.total_bytes == sum(item.bytes for item in plan.items)  # the rows add up to the total
    assert any(item.name == "load-time peak" for item in plan.items)
    assert any("loading peaks at" in note for note in plan.notes)
    quantized = make_plan(PlanRequest(target=meta, device=cpu, context=64, target_bits=4))
    assert not any("loading peaks at" in note for note in quantized.notes)
    assert quantized.total_bytes == sum(item.bytes for item in quantized.items)
    gpu = make_plan(PlanRequest(target=meta, device=Device("gpu", 0, 1 << 40, "test", backend="gpu"), context=64))
    assert not any("loading peaks at" in note for note in gpu.notes)
