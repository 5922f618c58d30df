"""Turning logits into the processed distributions that both drafting and verification sample from.

The filters follow mlx-lm's `make_sampler` exactly (top-p, then min-p, then top-k on the model's log-probabilities,
then temperature), so `--no-draft` samples the same distribution as mlx-lm, and speculative output is distributed as
that processed target distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from .errors import UserError


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def validate(self) -> None:
        if self.temperature < 0:
            raise UserError(f"temperature {self.temperature} is negative; use 0 for greedy or a value > 0")
        if not 0 < self.top_p <= 1:
            raise UserError(f"top_p {self.top_p} is outside (0, 1]; use 1.0 to disable it")
        if self.top_k < 0:
            raise UserError(f"top_k {self.top_k} is negative; use 0 to disable it")
        if not 0 <= self.min_p <= 1:
            raise UserError(f"min_p {self.min_p} is outside [0, 1]; use 0 to disable it")


def to_probs(logits: mx.array, config: SamplingConfig) -> mx.array:
    """Processed next-token distributions, in float32.

    logits: [..., V] raw model outputs.
    Returns [..., V] probabilities; one-hot on the argmax when greedy.
    """
    logits = logits.astype(mx.float32)
    if config.greedy:
        vocab = logits.shape[-1]
        return (mx.arange(vocab) == mx.argmax(logits, axis=-1, keepdims=True)).astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    if 0 < config.top_p < 1.0:
        logprobs = apply_top_p(logprobs, config.top_p)
    if config.min_p != 0.0:
        logprobs = apply_min_p(logprobs, config.min_p)
    if 0 < config.top_k < logprobs.shape[-1]:
        logprobs = apply_top_k(logprobs, config.top_k)
    return mx.softmax(logprobs * (1.0 / config.temperature), axis=-1)


def sample(probs: mx.array, key: mx.array, greedy: bool) -> mx.array:
    """One token per row of probs [..., V] -> [...] int32. Greedy rows are one-hot, so argmax is exact."""
    if greedy:
        return mx.argmax(probs, axis=-1).astype(mx.int32)
    return mx.random.categorical(mx.log(probs), key=key).astype(mx.int32)
