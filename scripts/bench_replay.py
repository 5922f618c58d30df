"""The cost of deferred replay on a tiny hybrid target (a gated-DeltaNet layer then an attention layer, repeated):
tau, alpha, the distribution of verify-forward widths, and tokens/s against plain decoding, for replay merged into
the next verify pass (the default bound and unbounded) and replay always fed as a forward of its own, next to an
attention-only target of the same shape (nothing to replay).

The drafter is a stand-in that costs nothing: the target's own greedy continuation with each drafted token
replaced by a wrong one with probability --corrupt. So the figures isolate verification and replay; a real draft
model adds its own cost. Drafters never change the output (checked: every mode's tokens equal plain decoding's).

Usage: python scripts/bench_replay.py [--tokens 200] [--num-draft 4] [--repeats 3] [--corrupt 0.2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from tiny import make_tiny  # noqa: E402

from mlxspec.decoding.assembly import build_engine  # noqa: E402
from mlxspec.decoding.draft import Draft, Drafter
from mlxspec.kernels import verify as verify_kernel  # noqa: E402
from mlxspec.options import DecodeOptions  # noqa: E402

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]


class CorruptedOracle(Drafter):
    """Proposes the reference continuation, each token wrong with probability `corrupt` (fixed seed)."""

    def __init__(self, reference: list[int], corrupt: float, vocab: int, seed: int = 0):
        self.reference, self.corrupt, self.vocab = reference, corrupt, vocab
        self.rng = np.random.default_rng(seed)
        self.emitted, self.calls = 0, 0

    def prefill(self, prompt: list[int]) -> None:
        self.emitted = 0

    def propose(self, num_tokens: int, key) -> Draft | None:
        tokens = list(self.reference[self.emitted : self.emitted + num_tokens])
        if not tokens:
            return None
        wrong = self.rng.random(len(tokens)) < self.corrupt
        tokens = [(t + 1) % self.vocab if w else t for t, w in zip(tokens, wrong)]
        self.calls += 1
        return Draft(mx.array(tokens, dtype=mx.int32))

    def accept(self, emitted: list[int], drafted: list[int]) -> None:
        self.emitted += len(emitted)


def run(target, drafter, tokens: int, num_draft: int, max_merged_replay: int | None) -> dict:
    routed = verify_kernel.routed_view(target, verify_kernel.resolve("auto")[0])
    engine = build_engine(routed, drafter, DecodeOptions(num_draft=num_draft), max_merged_replay=max_merged_replay)
    out, drafted, accepted, steps = [], 0, 0, 0
    if True:  # (the routed view is built once; no block to enter)
        engine.prefill(PROMPT)
        start = time.perf_counter()
        while len(out) < tokens:
            step = engine.step(tokens - len(out))
            out, drafted, accepted, steps = (
                out + step.tokens,
                drafted + step.drafted,
                accepted + step.accepted,
                steps + 1,
            )
        seconds = time.perf_counter() - start
    widths = engine.forward_widths
    forwards = sum(widths.values())
    return {
        "tokens": out,
        "tok_s": len(out) / seconds,
        "alpha": accepted / drafted if drafted else 0.0,
        "tau": len(out) / steps,
        "forwards": forwards,
        "mean_width": sum(w * n for w, n in widths.items()) / forwards,
        "widths": dict(sorted(widths.items())),
        "replayed": engine.deferred.replayed,
        "catch_up": engine.deferred.catch_up_forwards,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--num-draft", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--corrupt", type=float, default=0.2)
    args = parser.parse_args()
    shape = dict(
        hidden_size=256,
        num_hidden_layers=8,
        intermediate_size=512,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=512,
        head_dim=32,
    )
    linear = dict(
        linear_num_value_heads=4,
        linear_num_key_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        full_attention_interval=2,
    )
    k = args.num_draft
    print(
        f"targets: 8 layers x 256, vocab 512, float32 (qwen3_5: 4 gated-DeltaNet + 4 attention layers; llama: 8 "
        f"attention layers); greedy, k={k}, {args.tokens} tokens, median of {args.repeats}; drafter: the target's "
        f"own continuation, each token wrong with probability {args.corrupt} (drafting costs nothing)"
    )
    print(
        f"{'target, mode':44} {'tok/s':>7} {'vs plain':>8} {'alpha':>6} {'tau':>5} {'mean width':>10} "
        f"{'replayed':>8} {'alone':>5}  widths"
    )
    for family, extra in (("qwen3_5", linear), ("llama", {})):
        target = make_tiny(family, seed=0, logit_scale=2.0, **shape, **extra)
        plain = run(target, None, args.tokens, k, None)
        reference = plain["tokens"]
        modes = {"plain": None, f"replay merged up to {k + 1} (default)": None}
        if family == "qwen3_5":
            modes.update({"replay merged, unbounded": 10**9, "replay fed alone": 0})
        plain_rate = None
        for name, bound in modes.items():
            results = []
            for seed in range(args.repeats):
                drafter = None if name == "plain" else CorruptedOracle(reference, args.corrupt, 512, seed)
                results.append(run(target, drafter, args.tokens, k, bound))
            result = sorted(results, key=lambda r: r["tok_s"])[len(results) // 2]
            assert all(r["tokens"] == reference for r in results), f"{name}: output differs from plain decoding"
            plain_rate = plain_rate or result["tok_s"]
            label = f"{family}, {name if family == 'qwen3_5' or name == 'plain' else 'speculative (no replay)'}"
            widths = dict(list(result["widths"].items())[:12])
            print(
                f"{label:44} {result['tok_s']:7.1f} {result['tok_s'] / plain_rate:7.2f}x {result['alpha']:6.2f} "
                f"{result['tau']:5.2f} {result['mean_width']:10.2f} {result['replayed']:8d} {result['catch_up']:5d}"
                f"  {widths}{' ...' if len(result['widths']) > 12 else ''}"
            )
    mx.clear_cache()


if __name__ == "__main__":
    main()
