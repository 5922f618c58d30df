"""Random keys by output position: what makes a seed give one text whatever drafted.

mlx-lm's seeded sampling (`mx.random.seed(s)`, then one `mx.random.categorical` per token) draws token t with the
t-th key of the global sequence: starting from `mx.random.key(s)`, each draw splits the key and uses the second half.
`PositionKeys` derives the same keys, by absolute output position (the first generated token is position 0), never
by step, draft length or batch. The target's token at position t is categorical(its processed logits, key_t), as
plain decoding draws it; a drafter that samples position t with the same key over the same vocabulary width makes
the coupled draw (MLX draws one row by inverse CDF: both invert their CDFs at the same uniform), so verification keeps a
draft exactly when it equals the target's own draw, and the text is a function of the seed and the target alone
(Daliri, Musco and Suresh, arXiv 2408.07978).
"""

from __future__ import annotations

import platform

import mlx.core as mx

KEYS_PER_BATCH = 32  # derived ahead in batches of this many positions


class PositionKeys:
    """key_t for output positions t = 0, 1, ... of one run seeded with `seed`. With XTC (`draws` 2) mlx-lm draws
    the token's XTC coin first, then the token: two keys a position, the coin's and then the token's."""

    def __init__(self, seed: int, draws: int = 1):
        self.state = mx.random.key(seed)
        self.draws = draws
        self.keys: list[mx.array] = []

    def _extend(self, positions: int) -> None:
        while len(self.keys) < positions * self.draws:
            for _ in range(KEYS_PER_BATCH):  # lazy: computed within the step that first uses them (no extra sync)
                self.state, key = mx.random.split(self.state)
                self.keys.append(key)

    def at(self, position: int) -> mx.array:
        """The token's key at `position`: [2] uint32."""
        self._extend(position + 1)
        return self.keys[position * self.draws + self.draws - 1]

    def span(self, start: int, count: int) -> mx.array:
        """[count, 2]: the token keys of positions start .. start + count - 1."""
        self._extend(start + count)
        return mx.stack([self.keys[p * self.draws + self.draws - 1] for p in range(start, start + count)])

    def coin_span(self, start: int, count: int) -> mx.array:
        """[count, 2]: the XTC coins' keys of those positions (draws 2 only)."""
        self._extend(start + count)
        return mx.stack([self.keys[p * self.draws] for p in range(start, start + count)])

    def draft_keys(
        self, greedy: bool, coupled: bool, generated: int, budget: int, draft_key: mx.array | None
    ) -> mx.array | None:
        """[budget, 2] keys for a drafter's draws at depths 0..budget-1 (None when greedy): the positions' own keys
        (coupled), or a split of the step's draft key (residual)."""
        if greedy:
            return None
        if coupled:
            return self.span(generated, budget)
        return mx.random.split(draft_key, budget)

    def row_keys(self, sampling, generated: int, depths, coins: bool = False) -> mx.array | None:
        """[N, 2]: the key of each target row, by the output position it decides (the row after a node of depth
        d decides position generated + d); `coins`: their XTC coins' keys (None without XTC). `sampling`: a
        SamplingConfig."""
        if sampling.greedy or (coins and not sampling.xtc):
            return None
        span = self.coin_span if coins else self.span
        return span(generated, max(depths) + 1)[mx.array(depths, dtype=mx.int32)]


def draw(scaled_logits: mx.array, keys: mx.array) -> mx.array:
    """One token per row: rows [N, V] of processed, temperature-scaled log-probabilities (sampling.scaled_logprobs),
    row i drawn with keys[i] exactly as mlx-lm draws it (`categorical` of a [1, V] row; MLX's noise depends on the
    shape, so every caller draws [1, V] rows). -> [N] int32."""
    rows = [mx.random.categorical(scaled_logits[i : i + 1], key=keys[i]) for i in range(scaled_logits.shape[0])]
    return mx.concatenate(rows).astype(mx.int32)


def draw_kept(scaled_logits: mx.array, candidates: mx.array, keys: mx.array) -> mx.array:
    """draw()'s tokens, bit for bit, for rows [N, V] that are -inf outside their candidates [N, C], with the exp of
    MLX's inverse CDF (mlx/random.cpp, categorical_inverse_cdf) taken at the candidates alone. A token at -inf
    weighs exactly 0 there (MLX's exp returns 0 below -88). Where MLX sums in index order (sums_in_index_order),
    the sum and cumulative sum run over the candidates alone, in id order: adding a 0 changes no bits. Elsewhere
    the weights go into a zero row before MLX's own sum and cumsum, so each adds the same values in the same
    order. -> [N] int32."""
    vocab, rows = scaled_logits.shape[-1], []
    compact = sums_in_index_order()
    for i in range(scaled_logits.shape[0]):
        ids = candidates[i]
        values = scaled_logits[i][ids].astype(mx.float32)  # categorical promotes to float32 first
        top = values.max()  # the row's max: every other token is -inf
        weights = mx.where(mx.isinf(top), (values == top).astype(mx.float32), mx.exp(values - top))
        if compact:
            order = mx.argsort(ids)
            rows.append(inverse_cdf_at(weights[order], ids[order], vocab, keys[i]))
        else:
            row = mx.put_along_axis(mx.zeros((vocab,), dtype=mx.float32), ids, weights, axis=0)
            rows.append(inverse_cdf(row, keys[i]))
    return mx.concatenate(rows).astype(mx.int32)


def sums_in_index_order() -> bool:
    """Whether MLX adds a reduction's elements one at a time in index order, as its scans do everywhere: its CPU
    backend on x86 (mlx/backend/cpu/simd/base_simd.h: max_size 1). Arm CPUs add NEON lanes apart, GPUs in trees."""
    return mx.default_device() == mx.cpu and platform.machine().lower() in ("x86_64", "amd64")


def inverse_cdf_at(weights: mx.array, ids: mx.array, vocab: int, key: mx.array) -> mx.array:
    """inverse_cdf over a [vocab] row that is 0 except `weights` [C] at `ids` (ascending), from those alone: equal
    bits where sums run in index order (inverse_cdf itself is this with every id). Past a candidate the row's
    cumulative weight holds until the next one, so the last index at or under the threshold is the last candidate
    whose cumulative weight is, or the row's last index where the threshold reaches the total (a uniform within a
    rounding of 1). -> [1]"""
    cdf = mx.cumsum(weights, axis=0, inclusive=False)
    total = weights.sum()
    threshold = mx.random.uniform(shape=(1,), key=key) * total
    last = ids[(cdf <= threshold).sum(keepdims=True) - 1]
    return mx.where(total <= threshold, vocab - 1, last)


def inverse_cdf(weights: mx.array, key: mx.array) -> mx.array:
    """MLX's categorical_inverse_cdf on unnormalized weights [n]: the first index whose cumulative weight passes
    uniform(key) times their sum (searchsorted(cdf, u, "right") - 1). -> [1]"""
    return inverse_cdf_at(weights, mx.arange(weights.shape[0]), weights.shape[0], key)
