"""Where a batched round's time goes: plain against drafting rows, in one process.

For each batch size and draft length it decodes the same held-out prompts with `Speculator.generate_batch` (greedy,
fixed `num_draft`, so every row drafts every step) and reports tokens per second with the prompts' prefill
(`tok_s`), the decoding rate alone (`decode_tok_s`: the tokens and seconds a run of --max-tokens adds over one of
--short-tokens, so the prefill cancels) and τ. With `--time-drafts` a
second pass forces each row's draft to compute as soon as it is proposed and sums that time: the share of a round
spent drafting, row after row (the rest is the batched target forward, acceptance and Python). Outputs are
checked against plain decoding's (greedy: exact).

  python scripts/profile_batch.py --model /tmp/target-24x768 --rows 1 8 --draft-lengths 0 1 2 3 --time-drafts

Run it with OpenBLAS preloaded as mlxspec's CLI does (LD_PRELOAD=.../libblas.so.3 OPENBLAS_THREAD_TIMEOUT=4).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import mlx.core as mx

import mlxspec
from mlxspec import DecodeOptions
from mlxspec.drafting.draft_model.drafter import DraftModelDrafter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_loop_bench import file_openings  # noqa: E402


class DraftTimer:
    """While entered, DraftModelDrafter.propose evaluates its draft at once and adds the seconds it took."""

    def __init__(self) -> None:
        self.seconds, self.calls = 0.0, 0
        self._original = DraftModelDrafter.propose

    def __enter__(self) -> DraftTimer:
        original, timer = self._original, self

        def timed(drafter, num_tokens, key):
            start = time.perf_counter()
            draft = original(drafter, num_tokens, key)
            mx.eval(draft.tokens, *([] if draft.probs is None else [draft.probs]))
            timer.seconds += time.perf_counter() - start
            timer.calls += 1
            return draft

        DraftModelDrafter.propose = timed
        return self

    def __exit__(self, *exc) -> None:
        DraftModelDrafter.propose = self._original


def run(spec, prompts: list[str], k: int, max_tokens: int) -> tuple[float, list, float]:
    options = DecodeOptions(max_tokens=max_tokens, stop_at_eos=False, use_draft=k > 0, num_draft=max(k, 1))
    start = time.perf_counter()
    results = spec.generate_batch(prompts, options)
    seconds = time.perf_counter() - start
    tau = sum(r.stats.generated_tokens for r in results) / max(1, sum(r.stats.target_calls for r in results))
    return sum(len(r.tokens) for r in results) / seconds, [r.tokens for r in results], tau


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/target")
    parser.add_argument("--draft", default="models/draft")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--draft-lengths", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--short-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--time-drafts", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    spec = mlxspec.load(args.model, draft=args.draft)
    openings = file_openings(max(args.rows), 12)
    table = []
    for rows in args.rows:
        prompts = ["".join(lines[:12]) for lines in openings[:rows]]
        run(spec, prompts, 2, 8)  # warm up: compile the chains, build the kernels
        plain = None
        for k in args.draft_lengths:
            rates, decode_rates, taus = [], [], []
            for _ in range(args.repeats):
                short_rate, short_tokens, _ = run(spec, prompts, k, args.short_tokens)
                rate, tokens, tau = run(spec, prompts, k, args.max_tokens)
                rates.append(rate)
                taus.append(tau)
                added = sum(map(len, tokens)) - sum(map(len, short_tokens))
                seconds = sum(map(len, tokens)) / rate - sum(map(len, short_tokens)) / short_rate
                decode_rates.append(added / seconds)
                plain = tokens if plain is None else plain
                assert tokens == plain, f"rows={rows} k={k}: output differs from plain decoding's"
            entry = {"rows": rows, "num_draft": k, "tok_s": round(max(rates), 1)}
            entry |= {"decode_tok_s": round(max(decode_rates), 1), "tau": round(taus[-1], 2)}
            if args.time_drafts and k > 0:
                with DraftTimer() as timer:
                    start = time.perf_counter()
                    run(spec, prompts, k, args.max_tokens)
                    total = time.perf_counter() - start
                entry["draft_share"] = round(timer.seconds / total, 3)
                entry["draft_ms_per_call"] = round(1000 * timer.seconds / max(timer.calls, 1), 2)
            print(json.dumps(entry), flush=True)
            table.append(entry)
    if args.out:
        machine = f"{platform.machine()}, {platform.processor() or 'cpu'}, MLX {mx.__version__}"
        args.out.write_text(json.dumps({"command": " ".join(sys.argv), "machine": machine, "rows": table}, indent=1))


if __name__ == "__main__":
    main()
