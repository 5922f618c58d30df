"""Tokens/s of plain and speculative decoding with the target sharded over the ranks mlx.launch starts (or on one
process without it), and the cost of one all-reduce, on the openings of held-out stdlib files.

  python scripts/bench_distributed.py --model runs/target-24x768                       # 1 process
  mlx.launch -n 2 --backend ring --python .venv/bin/python scripts/bench_distributed.py \\
      --model runs/target-24x768 --distributed tensor                                 # 2 ranks, tensor parallel
  mlx.launch -n 2 --backend ring --python .venv/bin/python scripts/bench_distributed.py \\
      --model runs/target-24x768-qwen2 --distributed pipeline                         # 2 ranks, by layers
      (models/recipes/as_qwen2.py writes that model: Llama has no pipeline split in mlx-lm, Qwen2 has)

Rank 0 prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_bench import prompts  # noqa: E402

import mlxspec  # noqa: E402


def all_reduce_ms(sharding, width: int, repeats: int = 50) -> float:
    """One all_sum of a [1, width] float32 row (what a layer's output all-reduce moves per token), in ms."""
    x = mx.ones((1, width))
    mx.eval(mx.distributed.all_sum(x, group=sharding.group))
    start = time.perf_counter()
    for _ in range(repeats):
        x = mx.distributed.all_sum(x, group=sharding.group) * 0.5
        mx.eval(x)
    return (time.perf_counter() - start) / repeats * 1000


def all_gather_ms(sharding, width: int, repeats: int = 50) -> float:
    """One all_gather of a [1, width] float32 row (a pipeline's final broadcast of the last hidden state), in ms."""
    x = mx.ones((1, width))
    mx.eval(mx.distributed.all_gather(x, group=sharding.group))
    start = time.perf_counter()
    for _ in range(repeats):
        x = mx.distributed.all_gather(x, group=sharding.group)[:1] * 0.5
        mx.eval(x)
    return (time.perf_counter() - start) / repeats * 1000


def forward_ms(model, repeats: int = 20) -> dict:
    """Wall and CPU (user, system) ms of one one-token forward after a 3-token prompt, no drafter: what a rank pays
    per target call, communication included."""
    import resource

    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([[1, 2, 3]]), cache=cache))
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(repeats):
        mx.eval(model(mx.array([[5]]), cache=cache))
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    per = 1000 / repeats
    return {
        "wall_ms": round(wall * per, 1),
        "user_ms": round((after.ru_utime - before.ru_utime) * per, 1),
        "system_ms": round((after.ru_stime - before.ru_stime) * per, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--draft", default="models/draft")
    parser.add_argument("--distributed", choices=("tensor", "pipeline"), default=None)
    parser.add_argument("-k", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--forward-only", action="store_true", help="Time one-token forwards only (forward_ms).")
    args = parser.parse_args()
    spec = mlxspec.load(args.model, draft=args.draft, distributed=args.distributed)
    if args.forward_only:
        timing = {"ranks": spec.sharding.size if spec.sharding else 1, "distributed": args.distributed}
        timing.update(forward_ms(spec.target.model))
        if spec.sharding is None or spec.sharding.rank == 0:
            print(json.dumps(timing), flush=True)
        return
    texts = prompts(args.prompts)
    spec.generate(texts[0], max_tokens=8)  # warm up: traces, kernel, caches
    report = {
        "ranks": spec.sharding.size if spec.sharding else 1,
        "distributed": args.distributed,
        "model": args.model,
        "k": args.k,
    }
    for name, options in (("plain", dict(use_draft=False)), ("draft", dict(num_draft=args.k))):
        rates, taus = [], []
        for text in texts:
            result = spec.generate(text, max_tokens=args.max_tokens, temperature=0, **options)
            rates.append(result.stats.tokens_per_second)
            taus.append(result.stats.tokens_per_target_call)
        report[name] = {"tok_s_median": round(statistics.median(rates), 2), "tau": round(statistics.mean(taus), 2)}
    report["speculative_over_plain"] = round(report["draft"]["tok_s_median"] / report["plain"]["tok_s_median"], 3)
    width = spec.target.config["hidden_size"]
    if args.distributed == "tensor":
        report["all_reduce_ms"] = round(all_reduce_ms(spec.sharding, width), 3)
        report["all_reduces_per_forward"] = 2 * spec.target.config["num_hidden_layers"]
    elif args.distributed == "pipeline":  # one send/receive per stage boundary, then one all-gather
        report["all_gather_ms"] = round(all_gather_ms(spec.sharding, width), 3)
        report["hops_per_forward"] = spec.sharding.size - 1
    if spec.sharding is None or spec.sharding.rank == 0:
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
