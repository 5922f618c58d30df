"""An agent-loop workload for the shared suffix cache: files edited turn after turn, each turn resending the file
so far and asking for what comes next.

Each turn's prompt is the opening of a held-out stdlib file, a few lines longer than the turn before (the agent
accepted some lines and resends the file); the model continues it greedily. What it writes mostly repeats what it
wrote the turn before, one turn further on: text that is in no prompt, so prompt lookup cannot see it, while the
suffix cache (earlier outputs, shared across requests) can. Several files' loops are interleaved, as agents share a
server. Every configuration runs the same turns in one process, one after the other, each with a fresh Speculator
(an empty suffix cache), and must write the same text as plain decoding (greedy: exact).

  python scripts/agent_loop_bench.py                                  # the embedded models
  python scripts/agent_loop_bench.py --model /tmp/target-24x768 --out docs/results/agent-loop-widened.json

Run it with OpenBLAS preloaded as mlxspec's CLI does (LD_PRELOAD=.../libblas.so.3 OPENBLAS_THREAD_TIMEOUT=4).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import sysconfig
import time
from pathlib import Path

import mlxspec
from mlxspec import DecodeOptions

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = {  # name -> DecodeOptions changes (greedy, no EOS stop, so every configuration writes the same tokens)
    "no draft": dict(use_draft=False),
    "lookup": dict(use_draft=False, lookup=True),
    "lookup + suffix cache": dict(use_draft=False, lookup=True, suffix=True),
    "draft model": dict(),
    "draft model + lookup + suffix cache": dict(lookup=True, suffix=True),
}


def file_openings(count: int, min_lines: int) -> list[list[str]]:
    """The lines of `count` held-out stdlib files with at least `min_lines` lines."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for name in (ROOT / "models" / "heldout_files.txt").read_text().split():
        path = stdlib / name
        if path.exists():
            lines = path.read_text(errors="replace").splitlines(keepends=True)
            if len(lines) >= min_lines:
                out.append(lines)
        if len(out) == count:
            break
    return out


def turns(files: int, rounds: int, first: int, step: int) -> list[str]:
    """The loops' prompts in the order they reach the server: round by round, file by file."""
    openings = file_openings(files, first + step * rounds)
    return ["".join(lines[: first + step * r]) for r in range(rounds) for lines in openings]


def run(
    model: str | None, draft: str | None, name: str, changes: dict, prompts: list[str], max_tokens: int
) -> tuple[dict, list[str]]:
    spec = mlxspec.load(model, draft=draft) if model else mlxspec.load()
    options = DecodeOptions(max_tokens=max_tokens, temperature=0.0, stop_at_eos=False, **changes)
    spec.generate("import os\n", options.updated(max_tokens=8, suffix=False))  # warm-up; kept out of the index
    texts, tokens, seconds, drafted, accepted, calls = [], 0, 0.0, 0, 0, 0
    wall = time.perf_counter()
    for prompt in prompts:
        result = spec.generate(prompt, options)
        texts.append(result.text)
        tokens += result.stats.generated_tokens
        seconds += result.stats.generation_seconds
        drafted, accepted = drafted + result.stats.drafted, accepted + result.stats.accepted
        calls += result.stats.target_calls
    wall = time.perf_counter() - wall
    row = {
        "config": name,
        "options": changes,
        "tokens": tokens,
        "decode_tok_s": round(tokens / seconds, 1),
        "wall_tok_s": round(tokens / wall, 1),
        "alpha": round(accepted / drafted, 3) if drafted else 0.0,
        "tau": round(tokens / calls, 2),
        "drafted": drafted,
        "accepted": accepted,
    }
    return row, texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="[default: the embedded target]")
    parser.add_argument("--draft", default=None, help="[default: the embedded draft]")
    parser.add_argument("--files", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--first-lines", type=int, default=12)
    parser.add_argument("--lines-per-turn", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    prompts = turns(args.files, args.rounds, args.first_lines, args.lines_per_turn)
    draft = args.draft or ("models/draft" if args.model else None)
    report = {
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores",
        "command": "python scripts/agent_loop_bench.py " + " ".join(sys.argv[1:]),
        "blas": os.environ.get("LD_PRELOAD", "MLX's own"),
        "requests": len(prompts),
        "rows": [],
    }
    reference = None
    for name, changes in CONFIGS.items():
        row, texts = run(args.model, draft, name, changes, prompts, args.max_tokens)
        reference = reference or texts
        row["exact"] = texts == reference  # greedy: every configuration writes plain decoding's text
        report["rows"].append(row)
        print(
            f"{name:38s} {row['decode_tok_s']:7.1f} tok/s decoding ({row['wall_tok_s']:6.1f} with prefill)  "
            f"alpha {row['alpha']:.2f}  tau {row['tau']:.2f}  exact {row['exact']}",
            flush=True,
        )
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
