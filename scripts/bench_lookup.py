"""Per-step cost of prompt lookup at a long history: propose, then commit the step's tokens, as the engine does.

The history is held-out stdlib text tokenized by the embedded tokenizer; each step proposes up to k tokens and then
commits the text's true next tokens (as many as a step emits: the accepted prefix of the draft plus one).

Usage: python scripts/bench_lookup.py [--history 4096] [--steps 300] [-k 8] [--candidates 1]
"""

from __future__ import annotations

import argparse
import statistics
import time


def heldout_tokens(count: int) -> list[int]:
    from mlxspec.drafting.lookup.corpus import read_text, split_files
    from mlxspec.loading import DEFAULT_TARGET, load_model

    tokenizer = load_model(DEFAULT_TARGET).tokenizer
    tokens: list[int] = []
    for path in split_files()[1]:
        tokens += tokenizer.encode(read_text(path) or "")
        if len(tokens) >= count:
            return tokens[:count]
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--history", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("-k", type=int, default=8)
    parser.add_argument("--candidates", type=int, default=1)
    args = parser.parse_args()
    from mlxspec.drafting.lookup.drafter import PromptLookupDrafter

    text = heldout_tokens(args.history + args.steps * (args.k + 1))
    drafter = PromptLookupDrafter(max_candidates=args.candidates)
    history = list(text[: args.history])  # the engine's committed tokens; the drafter reads them
    drafter.prefill(history)
    import mlx.core as mx

    mx.array([1, 2]).tolist()  # MLX's first-call setup is not lookup's cost
    times = []
    position = args.history
    for _ in range(args.steps):
        start = time.perf_counter()
        draft = drafter.propose(args.k, None)
        proposed = draft.tokens.tolist() if draft is not None else []
        truth = text[position : position + args.k + 1]
        accepted = 0
        while accepted < len(proposed) and accepted < len(truth) - 1 and proposed[accepted] == truth[accepted]:
            accepted += 1
        emitted = truth[: accepted + 1]
        history.extend(emitted)
        drafter.accept(emitted, proposed)
        times.append(time.perf_counter() - start)
        position += len(emitted)
    print(
        f"history {args.history} -> {len(history)} tokens, k={args.k}, candidates {args.candidates}: "
        f"first step (indexes the history) {1e3 * times[0]:.3f} ms; "
        f"later steps median {1e3 * statistics.median(times[1:]):.3f} ms, "
        f"mean {1e3 * statistics.mean(times[1:]):.3f} ms, max {1e3 * max(times[1:]):.3f} ms"
    )


if __name__ == "__main__":
    main()
