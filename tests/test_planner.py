"""The memory planner: exact parameter counts per family, cache accounting as MLX allocates it, and the CLI."""

import json
import subprocess
import sys

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes
from tiny import make_tiny

from mlxspec import memory_model as mm
from mlxspec.caches import make_speculative_cache
from mlxspec.devices import PRESETS, Device, parse_size
from mlxspec.metadata import load_metadata, preset_names, safetensors_bytes
from mlxspec.planner import PlanRequest, make_plan, max_context, total_bytes

FAMILY_OF_PRESET = {name: load_metadata(name).config["model_type"] for name in preset_names()}


def instantiated_parameters(config: dict) -> int:
    """Parameters of the mlx-lm model as `mlx_lm.load` leaves it (lazy arrays: nothing is allocated)."""
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    if config["model_type"].startswith("gemma"):
        weights.pop("lm_head.weight", None)  # real Gemma checkpoints carry no lm_head; load ties it
    if hasattr(model, "sanitize"):
        model.sanitize(weights)
    return sum(v.size for _, v in tree_flatten(model.parameters()))


@pytest.mark.parametrize("preset", preset_names())
def test_parameter_count_equals_the_instantiated_mlx_lm_model(preset):
    config = load_metadata(preset).config
    assert mm.count_parameters(config).total == instantiated_parameters(config)


def test_every_required_family_has_a_preset():
    families = set(FAMILY_OF_PRESET.values())
    assert {"llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2", "gemma3_text"} <= families
    assert families & {"mixtral", "qwen3_moe"}, "an MoE preset is required"
    for name in preset_names():
        assert load_metadata(name).config.get("_model_id"), f"{name} must name the model it came from"


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "gemma3_text"])
def test_tiny_model_parameter_counts(family):
    config = make_tiny(family, hidden_size=64, num_attention_heads=4, vocab_size=100).config
    assert mm.count_parameters(config).total == instantiated_parameters(config)


def test_kv_cache_bytes_match_what_mlx_allocates():
    """The planner's KV bytes equal the nbytes of mlxspec's real caches after a prefill and a rolled-back step."""
    for family, kv_bits in [("llama", None), ("gemma3_text", None), ("llama", 8)]:
        model = make_tiny(family, hidden_size=128, num_attention_heads=2, num_key_value_heads=1, sliding_window=64)
        cache = make_speculative_cache(model, max_rollback=5, kv_bits=kv_bits)
        context = 300
        model(mx.arange(context)[None] % 8, cache=cache)
        model(mx.zeros((1, 5), mx.int32), cache=cache)  # a verify pass of 5 positions...
        for layer in cache:
            layer.trim(5)  # ...rolled back, as a rejected step does
        mx.eval([c.state for c in cache])
        measured = sum(c.nbytes for c in cache)
        predicted = mm.kv_cache_bytes(model.config, context, rollback=5, kv_bits=kv_bits, dtype="float32")
        assert measured == predicted, (family, kv_bits, measured, predicted)


def test_quantized_weight_bytes_include_scales_and_biases():
    params = mm.ParameterCount(embedding=64 * 1000, attention=0, mlp=0, norms=64, lm_head=0)
    # 64000 weights at 4 bits = 32000 bytes; 1000 groups of 64, a bf16 scale and bias each = 4000 bytes.
    assert mm.weight_bytes(params, bits=4, group_size=64) == 32000 + 4000 + 64 * 2


def test_sizes_parse():
    assert parse_size("16GB") == 16 * 10**9
    assert parse_size("10.7GiB") == int(10.7 * 2**30)
    assert parse_size("512mb") == 512 * 10**6


def test_plan_fits_and_max_context_is_the_boundary():
    request = PlanRequest(
        target=load_metadata("llama-3.1-8b"),
        draft=load_metadata("llama-3.2-1b"),
        device=PRESETS["m2-16gb"],
        context=8192,
        target_bits=4,
        draft_bits=4,
    )
    plan = make_plan(request)
    assert plan.fits
    limit = max_context(request)
    assert total_bytes(request, limit) <= request.device.budget_bytes < total_bytes(request, limit + 1)
    assert plan.max_context["target alone"] >= plan.max_context["target + draft"]


def test_plan_that_does_not_fit_recommends_changes_that_do():
    request = PlanRequest(
        target=load_metadata("qwen2.5-7b"), draft=load_metadata("qwen2.5-0.5b"), device=PRESETS["m1-8gb"], context=8192
    )
    plan = make_plan(request)
    assert not plan.fits
    assert plan.recommendations and plan.recommendations[-1]["fits"]
    assert any("--kv-bits" in r["how"] for r in plan.recommendations)


def test_device_budgets_are_reported_figures_or_marked_estimates():
    """Budgets are not one share of RAM; each is a reported working-set figure or says it is an estimate, and no
    estimate claims more than the published 75%."""
    from mlxspec.devices import ESTIMATED, REPORTED

    shares = {round(d.budget_bytes / d.ram_bytes, 3) for d in PRESETS.values()}
    assert len(shares) > 2
    for device in PRESETS.values():
        assert 0 < device.budget_bytes < device.ram_bytes
        assert device.source in (REPORTED, ESTIMATED)
        if device.source == ESTIMATED:
            assert device.budget_bytes <= 0.75 * device.ram_bytes
        assert "assumes nothing else runs" in device.source


def test_local_directory_uses_exact_safetensors_bytes(tiny_dirs):
    meta = load_metadata(str(tiny_dirs["target"]))
    assert meta.weight_bytes == safetensors_bytes(tiny_dirs["target"] / "model.safetensors")
    assert meta.weight_bytes == mm.count_parameters(meta.config).total * 4  # float32 tiny model


def test_plan_cli_json_and_errors():
    def run(*args):
        return subprocess.run([sys.executable, "-m", "mlxspec.cli", "plan", *args], capture_output=True, text=True)

    ok = run("--model", "mixtral-8x7b", "--device", "m3-max-64gb", "--target-bits", "4", "--json")
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    assert {"items", "fits", "max_context", "recommendations", "drafter_overhead_bytes"} <= set(out)
    for args, message in [
        (("--model", "nope"), "not a preset"),
        (("--model", "qwen3-8b", "--device", "m9"), "m9"),
        (("--model", "qwen3-8b", "--memory", "lots"), "lots"),
    ]:
        bad = run(*args)
        assert bad.returncode == 2 and "Traceback" not in bad.stderr and message in bad.stderr


def test_cpu_note_for_quantized_targets():
    cpu = Device("cpu box", 24 * 2**30, 18 * 2**30, "test", backend="cpu")
    plan = make_plan(PlanRequest(target=load_metadata("qwen2.5-0.5b"), device=cpu, target_bits=4))
    assert any("quantized_matmul" in note for note in plan.notes)


def test_nested_text_config_is_planned_as_its_language_model():
    flat = load_metadata("gemma-3-12b").config
    nested = {"model_type": "gemma3", "text_config": {k: v for k, v in flat.items() if k != "model_type"}}
    nested["text_config"]["model_type"] = "gemma3_text"
    assert mm.count_parameters(nested).total == mm.count_parameters(flat).total


def test_unknown_families_and_missing_keys_are_refused_by_name(tmp_path):
    from mlxspec import UserError

    mamba = {"model_type": "mamba", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 8}
    with pytest.raises(UserError, match="model_type 'mamba' is not supported"):
        mm.count_parameters(mamba)
    config = dict(load_metadata("llama-3.2-1b").config)
    del config["hidden_size"]
    with pytest.raises(UserError, match="'hidden_size'"):
        mm.count_parameters(config)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_tie_word_embeddings_defaults_as_mlx_lm_does(family):
    """A config without tie_word_embeddings is counted as the mlx-lm model file builds it."""
    config = dict(make_tiny(family, hidden_size=64, num_attention_heads=4, vocab_size=100).config)
    del config["tie_word_embeddings"]
    assert mm.count_parameters(config).total == instantiated_parameters(config)


def test_suggestions_save_something_and_come_cheapest_then_biggest_first():
    request = PlanRequest(
        target=load_metadata("qwen2.5-7b"),
        draft=load_metadata("qwen2.5-0.5b"),
        device=PRESETS["m2-16gb"],
        context=16384,
    )
    plan = make_plan(request)
    hows = [r["how"] for r in plan.recommendations]
    assert all(r["saving_bytes"] >= 2**20 for r in plan.recommendations)
    assert {"--no-draft", "--no-draft --lookup", "--kv-bits 8"} <= set(hows)
    assert "--num-draft 2" not in hows  # it saves nothing worth saying here
    kv8, kv4 = hows.index("--kv-bits 8"), hows.index("--kv-bits 4")
    assert kv8 < kv4 and hows.index("--no-draft --lookup") < hows.index("--no-draft")


def test_a_plan_that_cannot_fit_says_which_context_would():
    request = PlanRequest(target=load_metadata("qwen2.5-7b"), device=PRESETS["m1-8gb"], context=131072, target_bits=4)
    plan = make_plan(request)
    assert not plan.fits
    context_advice = [r for r in plan.recommendations if r["how"].startswith("context <=")]
    assert context_advice and context_advice[0]["max_context"] == max_context(request)


def test_plan_without_a_model_plans_the_embedded_pair_at_its_own_context():
    proc = subprocess.run([sys.executable, "-m", "mlxspec", "plan", "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["request"]["context"] == 512 and out["request"]["draft"] == "embedded draft"
