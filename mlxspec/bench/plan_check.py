"""Check the planner against MLX's measured peak memory (CPU backend, float32), over contexts 256-4096.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 python scripts/plan_vs_measured.py

Pairs: the embedded target + draft, and a random-weight Qwen2.5-0.5B (its real config.json preset) with a random
2-layer draft that shares its vocabulary. Each run prefills context - 32 tokens, then decodes 32 tokens
speculatively (K=4), and compares mx.get_peak_memory() with the plan's MLX-allocated bytes (runtime overhead,
which MLX does not count, excluded).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import _get_classes

from mlxspec.decoding.assembly import build_engine
from mlxspec.drafting.factory import make_drafter
from mlxspec.loading import DEFAULT_DRAFT, DEFAULT_TARGET, load_model
from mlxspec.options import DecodeOptions
from mlxspec.plan.devices import Device
from mlxspec.plan.metadata import ModelMetadata, load_metadata
from mlxspec.plan.planner import PlanRequest, make_plan

GENERATED, NUM_DRAFT = 32, 4


def random_model(config: dict):
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def measure(target, draft, context: int, vocab: int) -> int:
    options = DecodeOptions(num_draft=NUM_DRAFT)
    mx.clear_cache()
    mx.reset_peak_memory()
    engine = build_engine(target, make_drafter(options, draft_model=draft), options)
    prompt = [(i * 7919) % vocab for i in range(context - GENERATED)]
    engine.prefill(prompt)
    produced = 0
    while produced < GENERATED:
        produced += len(engine.step(GENERATED - produced).tokens)
    peak = mx.get_peak_memory()
    del engine
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", default="256,512,1024,2048,4096")
    parser.add_argument("--out", type=Path, default=Path("runs/plan_vs_measured.json"))
    args = parser.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    cpu = Device("this CPU", 0, 1 << 50, "unbounded, for comparison", backend="cpu")

    qwen = load_metadata("qwen2.5-0.5b")
    draft_config = {
        **qwen.config,
        "num_hidden_layers": 2,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    # Built one pair at a time: weights of a pair not under test must not sit in its peak.
    pairs = {
        "embedded target + draft": lambda: (
            load_model(DEFAULT_TARGET).model,
            load_model(DEFAULT_DRAFT).model,
            load_metadata(str(DEFAULT_TARGET)),
            load_metadata(str(DEFAULT_DRAFT)),
        ),
        "Qwen2.5-0.5B (random) + 2-layer draft": lambda: (
            random_model(qwen.config),
            random_model(draft_config),
            qwen,
            ModelMetadata("qwen-draft", draft_config, None, "random"),
        ),
    }
    rows = []
    for name, build in pairs.items():
        mx.clear_cache()
        target, draft, target_meta, draft_meta = build()
        for context in contexts:
            measured = measure(target, draft, context, target_meta.config["vocab_size"])
            request = PlanRequest(
                target=target_meta, draft=draft_meta, device=cpu, context=context, num_draft=NUM_DRAFT
            )
            predicted = make_plan(request).mlx_bytes
            error = (predicted - measured) / measured
            rows.append(
                {
                    "pair": name,
                    "context": context,
                    "predicted_bytes": predicted,
                    "measured_bytes": measured,
                    "error": error,
                }
            )
            print(
                f"| {name} | {context} | {predicted / 2**20:.1f} | {measured / 2**20:.1f} | {100 * error:+.1f}% |",
                flush=True,
            )
        del target, draft
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    worst = max(abs(r["error"]) for r in rows)
    print(f"worst error {100 * worst:.1f}% (bar: 15%)")


if __name__ == "__main__":
    main()
