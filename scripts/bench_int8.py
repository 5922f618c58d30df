"""`--kernel int8` against the default float32 activations on one model: decoding speed and how far greedy text
stays the same, from one interleaved run (every mode once per round, medians kept with their spread).

    python scripts/bench_int8.py MODEL [--draft DRAFT --draft-bits 4 --draft-vocab 32768 -k 2]
                                       [--prompts 3] [--tokens 192] [--rounds 3]

MODEL: a converted GGUF folder (scripts/fetch_real_model.py) or any model mlxspec loads. Prompts: prefixes of
held-out stdlib files (bench's own). Greedy agreement: per prompt, the first position where int8's text leaves
the float path's, and the share of positions equal before the shorter ends. With --draft, each kernel also runs
the draft at -k, and its text is checked equal to that kernel's plain decoding.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402
from mlxspec.bench.runner import heldout_prompts  # noqa: E402

KERNELS = ("on", "int8")


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--draft")
    parser.add_argument("--draft-bits", type=int)
    parser.add_argument("--draft-vocab", type=int)
    parser.add_argument("-k", "--num-draft", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=192)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    spec = mlxspec.load(args.model, draft=args.draft, draft_bits=args.draft_bits, draft_vocab=args.draft_vocab)
    prompts = heldout_prompts(spec.tokenizer, args.prompts, 96)
    modes = [(kernel, False) for kernel in KERNELS] + ([(kernel, True) for kernel in KERNELS] if args.draft else [])
    common = dict(max_tokens=args.tokens, stop_at_eos=False)
    spec.generate(prompts[0][:16], max_tokens=4, kernel="int8", use_draft=False)  # warm both kernels' views
    speeds: dict[tuple[str, bool], list[float]] = {mode: [] for mode in modes}
    texts: dict[tuple[str, bool], list[list[int]]] = {}
    for _ in range(args.rounds):
        for mode in modes:
            kernel, drafted = mode
            extra = dict(num_draft=args.num_draft) if drafted else dict(use_draft=False)
            tokens, seconds, outputs = 0, 0.0, []
            for prompt in prompts:
                result = spec.generate(prompt, kernel=kernel, **common, **extra)
                tokens += result.stats.generated_tokens
                seconds += result.stats.generation_seconds
                outputs.append(result.tokens)
            speeds[mode].append(tokens / seconds)
            texts[mode] = outputs
    print(f"{args.model}: {len(prompts)} held-out prompts x {args.tokens} tokens, {args.rounds} interleaved rounds")
    for mode in modes:
        kernel, drafted = mode
        runs = speeds[mode]
        name = f"{'draft k=' + str(args.num_draft) if drafted else 'plain'}, --kernel {kernel}"
        spread = (max(runs) - min(runs)) / statistics.median(runs)
        line = f"  {name:24s} {statistics.median(runs):6.2f} tok/s (spread {spread:.0%})"
        if drafted:
            same = texts[mode] == texts[(kernel, False)]
            line += f"  text {'equal to' if same else 'DIFFERENT from'} its kernel's plain decoding"
        print(line)
    plain, int8 = texts[("on", False)], texts[("int8", False)]
    firsts = [first_difference(a, b) for a, b in zip(plain, int8)]
    equal = sum(sum(x == y for x, y in zip(a, b)) for a, b in zip(plain, int8))
    total = sum(min(len(a), len(b)) for a, b in zip(plain, int8))
    print(f"  greedy int8 vs float32: first difference at {firsts} of {args.tokens}; {equal}/{total} positions equal")


if __name__ == "__main__":
    main()
