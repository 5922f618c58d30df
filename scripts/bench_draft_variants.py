"""One interleaved run: a target's plain decoding against its draft model as stored, re-quantized (--draft-bits)
and with its output layer cut to its hot tokens (--draft-vocab), at several draft lengths; lookup beside them.

    python scripts/bench_draft_variants.py --model .real/qwen2.5-coder-1.5b-instruct \
        --draft .real/qwen2.5-coder-0.5b-instruct --variants full,vocab32768,bits4,bits4+vocab32768 -k 2 -k 4

Prints one row per mode: median tok/s over the repeats (and its spread), the ratio to plain decoding, alpha, tau
and c, the draft's cost per token over a target step (time per drafted token / time per plain token). Every mode's
greedy text is checked against plain decoding's (exactness); sampled rows report counts only, and the acceptance
rule they ran (`--unseeded` adds each draft row without a seed, where the default rule is Leviathan/Chen's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import mlxspec
from mlxspec.api import Drafters, load_draft, speculator_with
from mlxspec.loading import load_model
from mlxspec.options import DecodeOptions


def variant_settings(name: str) -> tuple[int | None, int | None]:
    bits = vocab = None
    for part in name.split("+"):
        if part.startswith("bits"):
            bits = int(part[4:])
        elif part.startswith("vocab"):
            vocab = int(part[5:])
        elif part != "full":
            raise SystemExit(f"unknown variant part '{part}' (full, bitsN, vocabN, joined by +)")
    return bits, vocab


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--variants", default="full,vocab32768")
    ap.add_argument("-k", type=int, action="append")
    ap.add_argument("--prompts", default="docs/results/code-prompts-2.jsonl")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--lookup", action="store_true", help="also lookup k=4 and lookup + draft")
    ap.add_argument("--auto", action="store_true", help="also -k auto for each variant")
    ap.add_argument(
        "--unseeded",
        action="store_true",
        help="also each draft row with no seed (the default rule then: Leviathan/Chen) beside its seeded (coupled) row",
    )
    ap.add_argument("--json")
    args = ap.parse_args()
    lengths = args.k or [2, 4]
    prompts = [json.loads(line)["prompt"] for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    target = load_model(args.model)
    speculators = {"plain": speculator_with(target, Drafters())}
    for variant in args.variants.split(","):
        bits, vocab = variant_settings(variant)
        t0 = time.perf_counter()
        draft = load_draft(args.draft, bits, vocab)
        print(
            f"loaded draft {variant} ({draft.variant or 'as stored'}) in {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
        )
        speculators[variant] = speculator_with(target, Drafters(draft=draft))
    modes = [("plain", "plain", dict(use_draft=False))]
    for variant in args.variants.split(","):
        modes += [(f"draft {variant} k={k}", variant, dict(num_draft=k)) for k in lengths]
        if args.auto:  # measures a cost curve per variant first (about 3 minutes each on 2 cores)
            modes.append((f"draft {variant} k=auto", variant, dict(num_draft="auto")))
        if args.lookup:
            modes.append((f"lookup+draft {variant} k=4", variant, dict(num_draft=4, lookup=True)))
    if args.lookup:
        modes.append(("lookup k=4", "plain", dict(num_draft=4, lookup=True, use_draft=False)))
    if args.unseeded and args.temp > 0:
        modes += [(f"{name} no-seed", key, dict(change, seed=None)) for name, key, change in modes if key != "plain"]
    base = DecodeOptions(max_tokens=args.max_tokens, stop_at_eos=False, temperature=args.temp, seed=0)
    encoded = [speculators["plain"].encode(p) for p in prompts]
    for spec in speculators.values():  # warm-up: curves measured, chains traced
        for name, key, change in modes:
            if speculators[key] is spec:
                spec.generate(encoded[0], base.updated(max_tokens=8, **change))
    times = {name: [] for name, _, _ in modes}
    counts = {name: [0, 0, 0, 0] for name, _, _ in modes}  # drafted, accepted, target calls, tokens
    rules = {name: "" for name, _, _ in modes}  # the acceptance rule each sampled row ran
    texts: dict[str, list] = {}
    for repeat in range(args.repeats):
        for name, key, change in modes if repeat % 2 == 0 else modes[::-1]:
            total, tokens = 0.0, 0
            for i, prompt in enumerate(encoded):
                result = speculators[key].generate(prompt, base.updated(**change))
                total += result.stats.generation_seconds
                tokens += len(result.tokens)
                if repeat == 0:
                    s = result.stats
                    counts[name] = [
                        a + b for a, b in zip(counts[name], [s.drafted, s.accepted, s.target_calls, len(result.tokens)])
                    ]
                    texts.setdefault(name, []).append(result.tokens)
                    rules[name] = s.acceptance
            times[name].append(tokens / total)
    plain_rate = statistics.median(times["plain"])
    rows = []
    print(f"{'mode':34} {'tok/s':>7} {'spread':>7} {'vs plain':>8} {'alpha':>6} {'tau':>5} {'c':>5}  exact")
    for name, _, _ in modes:
        rate = statistics.median(times[name])
        drafted, accepted, calls, tokens = counts[name]
        alpha = accepted / drafted if drafted else None
        tau = tokens / calls if calls else None
        # c from the time model: time/token = (v + k c) / tau per target step; with v ~ measured by plain, take the
        # extra time per drafted token over one plain token as c (an upper bound: it includes wider verification).
        c = ((tokens / rate) - calls / plain_rate) / drafted * plain_rate if drafted else None
        exact = texts[name] == texts["plain"] if args.temp == 0 else None
        spread = (max(times[name]) - min(times[name])) / rate
        rows.append(
            dict(
                mode=name,
                acceptance=rules[name],
                tok_s=rate,
                spread=spread,
                ratio=rate / plain_rate,
                alpha=alpha,
                tau=tau,
                c=c,
                exact=exact,
            )
        )
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        print(
            f"{name:34} {rate:7.2f} {spread:7.0%} {rate / plain_rate:8.2f} {fmt(alpha, '6.2f')} "
            f"{fmt(tau, '5.2f')} {fmt(c, '5.2f')}  {exact} {rules[name]}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(dict(args=vars(args), rows=rows), indent=1))
    print(f"mlxspec {mlxspec.__version__}", file=sys.stderr)


if __name__ == "__main__":
    main()
