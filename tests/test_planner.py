"""The memory planner: exact parameter counts per family, cache accounting as MLX allocates it, and the CLI."""

import json
import subprocess
import sys
from dataclasses import dataclass

import mlx.core as mx
import pytest
from helpers import assert_one_line
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache
from tiny import make_tiny

from mlxspec.cache.rollback import make_speculative_cache
from mlxspec.model_files import lazy_model
from mlxspec.plan import memory_model as mm
from mlxspec.plan.devices import PRESETS, Device, parse_size
from mlxspec.plan.metadata import load_metadata, preset_names, safetensors_bytes
from mlxspec.plan.planner import PlanRequest, make_plan, max_context, total_bytes
from mlxspec.plan.rank_split import RankSplit

FAMILY_OF_PRESET = {name: load_metadata(name).config["model_type"] for name in preset_names()}


def instantiated_parameters(config: dict) -> int:
    """Parameters of the mlx-lm model as `mlx_lm.load` leaves it (lazy arrays: nothing is allocated)."""
    model = lazy_model(config)
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
    from mlxspec.plan.devices import ESTIMATED, REPORTED

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
        return subprocess.run([sys.executable, "-m", "mlxspec.cli.main", "plan", *args], capture_output=True, text=True)

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
    assert any("quantized target" in note and "widening its codes costs arithmetic" in note for note in plan.notes)
    plain = make_plan(PlanRequest(target=load_metadata("qwen2.5-0.5b"), device=cpu))
    assert not any("quantized target" in note for note in plain.notes)


def test_nested_text_config_is_planned_as_its_language_model():
    flat = load_metadata("gemma-3-12b").config
    nested = {"model_type": "gemma3", "text_config": {k: v for k, v in flat.items() if k != "model_type"}}
    nested["text_config"]["model_type"] = "gemma3_text"
    assert mm.count_parameters(nested).total == mm.count_parameters(flat).total


def test_unknown_families_and_missing_keys_are_refused_by_name(tmp_path):
    from mlxspec import UserError

    unknown = {"model_type": "not_a_family", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 8}
    with pytest.raises(UserError, match="model_type 'not_a_family' is not one mlx-lm can build"):
        mm.count_parameters(unknown)
    config = dict(load_metadata("llama-3.2-1b").config)
    del config["hidden_size"]
    with pytest.raises(UserError, match="'hidden_size'"):
        mm.count_parameters(config)


# Published totals (model cards), independent of mlx-lm: the presets' counts must land within 1% of them.
PUBLISHED_BILLIONS = {
    "deepseek-v2-lite": 15.7,
    "qwen3-next-80b-a3b": 80.0,
    "qwen3.5-27b": 27.0,
    "lfm2-1.2b": 1.17,
    "granite-4.0-h-small": 32.0,
}


@pytest.mark.parametrize("preset", sorted(PUBLISHED_BILLIONS))
def test_mla_moe_and_hybrid_presets_count_their_published_parameters(preset):
    total = mm.count_parameters(load_metadata(preset).config).total / 1e9
    assert abs(total - PUBLISHED_BILLIONS[preset]) / PUBLISHED_BILLIONS[preset] < 0.01, total


def test_deepseek_v2_lite_no_longer_fits_16gb_in_bf16_and_hybrid_plans_carry_their_state():
    gpu16 = PRESETS["m2-16gb"] if "m2-16gb" in PRESETS else Device("16 GB", parse_size("16GB"), parse_size("11GB"), "t")
    plan = make_plan(PlanRequest(target=load_metadata("deepseek-v2-lite"), device=gpu16, context=4096))
    assert not plan.fits  # 15.7B parameters are 31 GB in bfloat16
    assert "15.71B params" in next(i.note for i in plan.items if i.name == "target weights")
    # Qwen3-Next: 12 attention layers hold KV; 36 DeltaNet layers hold 19.8M state elements, whatever the context.
    hybrid = load_metadata("qwen3-next-80b-a3b").config
    state = 19_759_104 * 2
    assert mm.kv_cache_bytes(hybrid, 1, 0, dtype="bfloat16") == state + 12 * 256 * (2 * 2 * 256) * 2
    assert mm.kv_cache_bytes(hybrid, 1, 0, dtype="bfloat16", snapshots=1) == 2 * state + 12 * 256 * (2 * 2 * 256) * 2


@pytest.mark.parametrize("family", ["qwen3_5", "mamba", "deepseek_v2"])
def test_hybrid_and_mla_cache_bytes_match_the_real_cache_after_a_rolled_back_step(family):
    """Recurrent state (constant) plus KV on the attention layers only, as mlxspec's real caches hold them after a
    prefill and a verify pass of 5 positions rolled back by snapshot (recurrent.rewind)."""
    from family_sweep import build

    from mlxspec.cache.recurrent import leaf_caches, recurrent_leaves, rewind, snapshot

    model = make_tiny(family) if family != "deepseek_v2" else build("deepseek_v2")
    config = model.config
    cache = make_speculative_cache(model, max_rollback=5)
    context = 300
    model(mx.arange(context)[None] % 8, cache=cache)
    before = snapshot(recurrent_leaves(cache))
    model(mx.zeros((1, 5), mx.int32), cache=cache)
    rewind(cache, before, 5)
    mx.eval([c.state for c in cache])
    measured = sum(c.nbytes for c in leaf_caches(cache))
    predicted = mm.kv_cache_bytes(config, context, rollback=5, dtype="float32")
    assert measured == predicted, (family, measured, predicted)
    state = sum(c.nbytes for c in recurrent_leaves(cache))
    snapshots = mm.kv_cache_bytes(config, context, rollback=5, dtype="float32", snapshots=3)
    assert snapshots == predicted + 3 * state


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


# ---- plan --ranks: one rank's share of a target split the way mlx-lm splits it ----


@dataclass
class FakeGroup:
    """What mlx-lm's shard() and pipeline() read of a group: its rank and size (nothing is communicated)."""

    this_rank: int
    ranks: int

    def rank(self) -> int:
        return self.this_rank

    def size(self) -> int:
        return self.ranks


def held_parameters(model) -> int:
    return sum(v.size for _, v in tree_flatten(model.parameters()))


@pytest.mark.parametrize(("family", "ranks"), [("llama", 2), ("qwen2", 2), ("llama", 4)])
def test_tensor_share_equals_what_mlx_lm_shard_leaves_on_a_rank(family, ranks):
    model = make_tiny(family, num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=4)
    whole, config = held_parameters(model), model.config
    model.shard(FakeGroup(1, ranks))
    split = RankSplit(ranks, "tensor")
    assert held_parameters(model) == round(split.weight_share(config) * whole)
    kv_heads = {layer.self_attn.n_kv_heads for layer in model.layers}
    assert kv_heads == {config["num_key_value_heads"] * split.layer_share(5)}  # the KV cache shrinks as its heads


@pytest.mark.parametrize("ranks", [2, 3])
def test_pipeline_share_covers_the_most_loaded_rank_mlx_lm_pipeline_makes(ranks):
    config = make_tiny("qwen2", num_hidden_layers=5).config
    split = RankSplit(ranks, "pipeline")
    held, cached = [], []
    for rank in range(ranks):
        model = make_tiny("qwen2", num_hidden_layers=5)
        whole = held_parameters(model)
        model.model.pipeline(FakeGroup(rank, ranks))
        held.append(held_parameters(model))
        cached.append(len(make_prompt_cache(model)))
    assert max(cached) / 5 == split.layer_share(5)
    planned = split.weight_share(config) * whole
    other_layers_norms = (5 - max(cached)) * 2 * config["hidden_size"]  # the plan keeps every norm: a bound
    assert planned - other_layers_norms <= max(held) <= planned


def test_plan_ranks_halves_the_target_shard_and_keeps_the_drafter_whole():
    target, draft = load_metadata("llama-3.1-70b"), load_metadata("llama-3.2-1b")
    device = PRESETS["m3-max-64gb"]
    one = {i.name: i.bytes for i in make_plan(PlanRequest(target, device, draft, context=8192)).items}
    two = make_plan(PlanRequest(target, device, draft, context=8192, split=RankSplit(2, "tensor")))
    items = {i.name: i.bytes for i in two.items}
    params = mm.count_parameters(target.config)
    layers = params.attention + params.mlp
    assert items["target weights"] == int(one["target weights"] * (params.total - layers / 2) / params.total)
    assert items["target KV cache"] == one["target KV cache"] // 2
    for name in ("draft weights", "draft KV cache", "activations"):
        assert items[name] == one[name]
    assert two.request["ranks"] == 2 and any("per rank" in note for note in two.notes)


def test_plan_ranks_cli_refuses_splits_mlx_lm_cannot_make(cli_run):  # noqa: F811
    assert_one_line(cli_run("plan", "--model", "llama-3.1-70b", "--ranks", "3"), "num_attention_heads=64", "3 ranks")
    assert_one_line(
        cli_run("plan", "--model", "llama-3.1-70b", "--ranks", "2", "--distributed", "pipeline"),
        "no pipeline split for llama; use --distributed tensor",
    )
    assert_one_line(cli_run("plan", "--model", "llama-3.1-70b", "--distributed", "tensor"), "pass --ranks N")
    code, out, err = cli_run("plan", "--model", "qwen2.5-7b", "--ranks", "3", "--distributed", "pipeline", "--json")
    assert code == 0, err
    assert json.loads(out)["request"]["distributed"] == "pipeline"


def test_a_memory_budget_under_distributed_points_to_plan_ranks(cli_run, tiny_dirs):  # noqa: F811
    args = ("generate", "ab", "--model", tiny_dirs["target"], "--memory-budget", "8GB", "--distributed", "tensor")
    assert_one_line(cli_run(*args), "--memory-budget plans one machine", "mlxspec plan --ranks N")


def test_every_suggested_flag_is_one_plan_takes_and_reproduces_its_numbers():
    """A suggestion names a flag of generate; plan takes the same flag, and passing it gives the suggested total."""

    def plan(*args):
        base = ("--model", "llama-3.1-8b", "--draft", "llama-3.2-1b", "--device", "m2-16gb", "--context", "8192")
        proc = subprocess.run(
            [sys.executable, "-m", "mlxspec.cli.main", "plan", *base, *args, "--json"], capture_output=True, text=True
        )
        result = json.loads(proc.stdout)
        assert proc.returncode == (0 if result["fits"] else 1), proc.stderr  # the exit status says the verdict
        return result

    suggestions = plan()["recommendations"]
    plan_flags = ("--quantize-target", "--draft-bits", "--kv-bits", "--draft-window", "--num-draft")
    checked = [s for s in suggestions if s["how"].split()[0] in plan_flags]
    assert "--quantize-target 4" in {s["how"] for s in checked}
    for suggestion in checked:
        assert plan(*suggestion["how"].split())["total_bytes"] == suggestion["total_bytes"], suggestion["how"]
