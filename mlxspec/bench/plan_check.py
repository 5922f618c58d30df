"""`mlxspec bench plan`: the memory planner against MLX's measured peak memory over several contexts.

Pairs: the embedded target + draft, a random-weight Qwen2.5-0.5B (its real config.json preset) with a random
2-layer draft that shares its vocabulary, or any model directory, alone. Each run prefills context - 32 tokens,
then decodes 32 tokens (speculatively, k=4, where there is a draft), and compares mx.get_peak_memory() with the
plan's MLX-allocated bytes (runtime overhead, which MLX does not count, left out).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mlxspec.bench.steps import Steps, machine

GENERATED, NUM_DRAFT = 32, 4
PAIRS = ("embedded", "qwen2.5-0.5b-random")


@dataclass
class PlanCheckConfig:
    contexts: tuple[int, ...] = (256, 512, 1024, 2048, 4096)
    pairs: tuple[str, ...] = PAIRS


def random_model(config: dict):
    import mlx.core as mx
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def measure_peak(target, draft, context: int, vocab: int) -> int:
    import mlx.core as mx

    from mlxspec.decoding.assembly import build_engine
    from mlxspec.drafting.factory import make_drafter
    from mlxspec.options import DecodeOptions

    options = DecodeOptions(num_draft=NUM_DRAFT)
    mx.clear_cache()
    mx.reset_peak_memory()
    engine = build_engine(target, make_drafter(options, draft_model=draft), options)
    engine.prefill([(i * 7919) % vocab for i in range(context - GENERATED)])
    produced = 0
    while produced < GENERATED:
        produced += len(engine.step(GENERATED - produced).tokens)
    return mx.get_peak_memory()


def build_pair(name: str) -> tuple:
    """(target module, draft module, target metadata, draft metadata), built one pair at a time so that weights of
    a pair not under test never sit in its peak."""
    from mlxspec.loading import DEFAULT_DRAFT, DEFAULT_TARGET, load_model
    from mlxspec.plan.metadata import ModelMetadata, load_metadata

    if Path(name).is_dir():  # a model of the user's own, alone (plain decoding)
        return load_model(name).model, None, load_metadata(name), None
    if name == "embedded":
        target, draft = load_model(DEFAULT_TARGET).model, load_model(DEFAULT_DRAFT).model
        return target, draft, load_metadata(str(DEFAULT_TARGET)), load_metadata(str(DEFAULT_DRAFT))
    qwen = load_metadata("qwen2.5-0.5b")
    small = dict(num_hidden_layers=2, hidden_size=256, intermediate_size=512, num_attention_heads=4)
    draft_config = {**qwen.config, **small, "num_key_value_heads": 2}
    draft_meta = ModelMetadata("qwen-draft", draft_config, None, "random")
    return random_model(qwen.config), random_model(draft_config), qwen, draft_meta


def run_plan_check(config: PlanCheckConfig, echo=print) -> dict:
    import mlx.core as mx

    from mlxspec.plan.devices import Device
    from mlxspec.plan.planner import PlanRequest, make_plan

    cpu = Device("this CPU", 0, 1 << 50, "unbounded, for comparison", backend="cpu")
    steps = Steps(len(config.pairs) * len(config.contexts), "bench plan")
    rows = []
    echo("| pair | context | planned MiB | measured MiB | error |")
    echo("|---|---|---|---|---|")
    for name in config.pairs:
        mx.clear_cache()
        target, draft, target_meta, draft_meta = build_pair(name)
        for context in config.contexts:
            measured = measure_peak(target, draft, context, target_meta.config["vocab_size"])
            request = PlanRequest(
                target=target_meta, draft=draft_meta, device=cpu, context=context, num_draft=NUM_DRAFT
            )
            planned = make_plan(request).mlx_bytes
            error = (planned - measured) / measured
            rows.append({"pair": name, "context": context, "planned_bytes": planned, "measured_bytes": measured})
            rows[-1]["error"] = round(error, 4)
            echo(f"| {name} | {context} | {planned / 2**20:.1f} | {measured / 2**20:.1f} | {100 * error:+.1f}% |")
            steps.done(f"{name} at {context}")
        del target, draft
    worst = max(abs(r["error"]) for r in rows)
    echo(f"worst error {100 * worst:.1f}%")
    return {"machine": machine(), "rows": rows, "worst_error": worst}
