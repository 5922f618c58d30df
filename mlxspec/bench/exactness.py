"""The exactness probe (`generate --check-exact`, and `tune`): greedy speculative output against plain decoding on
this machine, bit for bit, and where they part, whether the target stood at a near-tie.

On the CPU with the verify kernel every row of a verify pass is computed as it is alone, so the two are equal. On
Apple GPUs MLX's `qmv` and `qmv_wide` kernels sum in different orders, so a token whose two best logits differ in
the last bits can come out differently (mlxcel's startup probe reports the same). That is a near-tie, reported with
its gap; anything else is a bug.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

NEAR_TIE = 1e-3  # a logit gap below this, relative to the top logit's magnitude (at least 1), is a near-tie
PROBE_PROMPTS = ("def fibonacci(n):\n    ", "The capital of France is", "import json\n\nwith open(")


@dataclass
class ProbeResult:
    verdict: str  # "equal", "near-tie" or "mismatch"
    tokens: int  # tokens compared
    position: int | None = None  # the first differing token, if any
    gap: float | None = None  # the plain run's top-two logit gap there

    @property
    def line(self) -> str:
        if self.verdict == "equal":
            return (
                f"exactness probe: greedy speculative output equals plain decoding bit for bit ({self.tokens} tokens)"
            )
        where = f"token {self.position}, where the target's two best logits differ by {self.gap:.3g}"
        if self.verdict == "near-tie":
            return f"exactness probe: speculative and plain decoding part at a near-tie ({where}); expected on GPUs"
        return f"exactness probe: speculative and plain decoding differ at {where}: not a near-tie, please report it"


def top_two_gap(model: Any, tokens: list[int]) -> tuple[float, float]:
    """(gap between the two best logits, the best logit) of the target's next-token logits after `tokens`."""
    logits = model(mx.array([tokens]))[0, -1].astype(mx.float32)
    top = mx.topk(logits, 2)
    best, second = sorted(top.tolist(), reverse=True)
    return best - second, best


def probe(speculator: Any, tokens: int = 32, prompts: tuple[str, ...] = PROBE_PROMPTS, **drafting: Any) -> ProbeResult:
    """Greedy plain vs speculative (with `drafting` as generate() options) on each prompt; the first difference is
    judged by the plain run's logit gap there."""
    compared = 0
    for prompt in prompts:
        ids = speculator.tokenizer.encode(prompt)
        plain_options = speculator.options.plain(max_tokens=tokens, temperature=0.0, stop_at_eos=False)
        plain = speculator.generate(ids, plain_options).tokens
        spec = speculator.generate(ids, max_tokens=tokens, temperature=0.0, stop_at_eos=False, **drafting).tokens
        same = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), None)
        if same is None:
            compared += min(len(plain), len(spec))
            continue
        gap, best = top_two_gap(speculator.target.model, ids + plain[:same])
        verdict = "near-tie" if gap <= NEAR_TIE * max(1.0, abs(best)) else "mismatch"
        return ProbeResult(verdict, compared + same, same, gap)
    return ProbeResult("equal", compared)
