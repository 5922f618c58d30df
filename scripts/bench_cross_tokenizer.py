"""A draft with another tokenizer against a draft with the target's own, on held-out code, in one process.

Every prompt is decoded plainly, with the same-tokenizer draft and with the cross-tokenizer draft at each k, in
turn (so the machine's drift falls on all alike); greedy outputs must equal plain decoding's. Reports tok/s (decode,
after the prompt), α (accepted per drafted) and τ (tokens per target forward) per setting and temperature.

  bash models/recipes/train_xtok_draft.sh                       # the cross-tokenizer draft (runs/xtok/draft-mlx)
  python models/recipes/widen_model.py --widen 24x768 --out /tmp/target-24x768
  python scripts/bench_cross_tokenizer.py --model /tmp/target-24x768 --cross runs/xtok/draft-mlx \\
      --out docs/results/cross-tokenizer-widened.json

Run it with OpenBLAS preloaded as mlxspec's CLI does (LD_PRELOAD=.../libblas.so.3 OPENBLAS_THREAD_TIMEOUT=4).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import mlxspec
from mlxspec import DecodeOptions
from mlxspec.loading import DEFAULT_DRAFT, DEFAULT_TARGET

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_bench import prompts  # noqa: E402 - the held-out openings every serving bench uses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(DEFAULT_TARGET))
    parser.add_argument("--same", default=str(DEFAULT_DRAFT), help="a draft with the target's tokenizer")
    parser.add_argument("--cross", required=True, help="a draft with another tokenizer")
    parser.add_argument("-k", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--temps", type=float, nargs="+", default=[0.0, 0.7])
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    speculators = {
        "plain": mlxspec.load(args.model, draft=None),
        "same tokenizer": mlxspec.load(args.model, draft=args.same),
        "cross tokenizer": mlxspec.load(args.model, draft=args.cross),
    }
    print(speculators["cross tokenizer"].cross_tokenizer, flush=True)
    texts = prompts(args.prompts)
    rows = []
    for temperature in args.temps:
        settings = [("plain", None)] + [(name, k) for k in args.k for name in ("same tokenizer", "cross tokenizer")]
        totals = {
            s: {"tokens": 0, "seconds": 0.0, "drafted": 0, "accepted": 0, "calls": 0, "exact": 0} for s in settings
        }
        for i, text in enumerate(texts):
            reference = None
            for name, k in settings:
                options = DecodeOptions(
                    max_tokens=args.max_tokens,
                    temperature=temperature,
                    seed=i,
                    stop_at_eos=False,
                    use_draft=k is not None,
                    num_draft=k or "auto",
                )
                result = speculators[name].generate(text, options)
                reference = reference or result.tokens
                total = totals[(name, k)]
                total["tokens"] += result.stats.generated_tokens
                total["seconds"] += result.stats.generation_seconds
                total["drafted"] += result.stats.drafted
                total["accepted"] += result.stats.accepted
                total["calls"] += result.stats.target_calls
                total["exact"] += result.tokens == reference
        plain_rate = totals[("plain", None)]["tokens"] / totals[("plain", None)]["seconds"]
        for (name, k), t in totals.items():
            row = {
                "temperature": temperature,
                "draft": name,
                "k": k,
                "tok_s": round(t["tokens"] / t["seconds"], 1),
                "speedup": round(t["tokens"] / t["seconds"] / plain_rate, 3),
                "alpha": round(t["accepted"] / t["drafted"], 3) if t["drafted"] else None,
                "tau": round(t["tokens"] / t["calls"], 2),
                # greedy: every output must equal plain decoding's (sampled outputs agree only in law)
                "equal_to_plain": f"{t['exact']}/{len(texts)}" if temperature == 0 else None,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        report = {
            "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores",
            "command": "python scripts/bench_cross_tokenizer.py " + " ".join(sys.argv[1:]),
            "blas": os.environ.get("LD_PRELOAD", "MLX's own"),
            "cross_tokenizer": speculators["cross tokenizer"].cross_tokenizer,
            "rows": rows,
        }
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
