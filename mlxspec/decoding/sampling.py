"""Turning logits into the processed distributions that both drafting and verification sample from.

The filters follow mlx-lm's `make_sampler` exactly (top-p, then min-p, then top-k on the model's log-probabilities,
then temperature), so `--no-draft` samples the same distribution as mlx-lm, and speculative output is distributed as
that processed target distribution.
"""

from __future__ import annotations

import math

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from mlxspec.decoding.keys import draw, inverse_cdf, sums_in_index_order
from mlxspec.kernels import verify as verify_kernel
from mlxspec.options import SamplingConfig

# Tokens ranked per row for top-p/top-k. At 128k-262k vocabularies a full sort per row costs more than a small
# target's forward; the filters only ever keep the best few hundred tokens of a trained model.
CANDIDATES = 1024
INVERSE_CDF_MIN_VOCAB = 32768  # sample() by inverse CDF at and above this many tokens (CPU)
# The smallest normal float32. A top-p below it is 0 once MLX compares it with float32 masses, which would keep no
# token at all (mlx-lm's apply_top_p then drops every one); any p this small keeps just the best token (and its
# ties), as a top-p of 1e-40 does.
FLOAT32_TINY = 1.1754943508222875e-38


def float32_top_p(top_p: float) -> float:
    return max(top_p, FLOAT32_TINY)


def to_probs(logits: mx.array, config: SamplingConfig) -> mx.array:
    """Processed next-token distributions, in float32: logits [..., V] -> probabilities [..., V], one-hot on the
    argmax when greedy. Rows flagged by `to_probs_checked` may be truncated more than the filters ask; drafters may
    use them (any q is exact under rejection sampling), the target's law must come from `to_probs_checked`."""
    return to_probs_checked(logits, config)[0]


def to_probs_checked(logits: mx.array, config: SamplingConfig) -> tuple[mx.array, mx.array]:
    """(probs [..., V], short [...] bool). Top-p/top-k rank only each row's CANDIDATES best tokens; a row is `short`
    when a token outside them could survive the filters (the top-p set reaches past them), and is exact only from
    `to_probs_sorted`, which ranks the whole vocabulary. Callers recompute such rows (rare for trained models)."""
    logits = logits.astype(mx.float32)
    vocab = logits.shape[-1]
    not_short = mx.zeros(logits.shape[:-1], dtype=mx.bool_)
    if config.greedy:
        return to_probs_sorted(logits, config), not_short  # one-hot on the argmax: nothing to rank
    count = ranked_candidates(config, vocab)
    if not (0 < config.top_p < 1 or 0 < config.top_k < vocab) and config.min_p == 0.0:
        # temperature alone: no normalization needed before the softmax
        return mx.softmax(logits * (1.0 / config.temperature), axis=-1), not_short
    if not count:
        return to_probs_sorted(logits, config), not_short
    rows = logits.reshape(-1, vocab)
    probs, short = _candidate_probs(rows, config, count)
    return probs.reshape(logits.shape), short.reshape(logits.shape[:-1])


def ranked_candidates(config: SamplingConfig, vocab: int) -> int:
    """How many of a row's best tokens the filters rank (top-p or top-k on; CANDIDATES, or top_k if larger), or 0
    where none ranks the row or the ranking would span the whole vocabulary (then the whole row is sorted)."""
    count = min(vocab, max(CANDIDATES, config.top_k))
    ranks = 0 < config.top_p < 1 or 0 < config.top_k < vocab
    return count if ranks and count < vocab else 0


def _candidate_probs(rows: mx.array, config: SamplingConfig, count: int) -> tuple[mx.array, mx.array]:
    """mlx-lm's filters (top-p, then min-p, then top-k) on each row's `count` best tokens. rows: [R, V] float32.
    Returns (probs [R, V], short [R])."""
    values, indices, keep, short = _candidate_keep(rows, config, count)
    weights = mx.softmax(mx.where(keep, values * (1.0 / config.temperature), -mx.inf), axis=-1)
    probs = mx.put_along_axis(mx.zeros(rows.shape, dtype=mx.float32), indices, weights, axis=-1)
    return probs, short


def scaled_logprobs(
    logits: mx.array, config: SamplingConfig, ranked: bool = False, coin_keys: mx.array | None = None
) -> tuple[mx.array, mx.array]:
    """scaled_logprobs_kept without the candidates."""
    scaled, short, _ = scaled_logprobs_kept(logits, config, ranked, coin_keys)
    return scaled, short


def scaled_logprobs_kept(
    logits: mx.array, config: SamplingConfig, ranked: bool = False, coin_keys: mx.array | None = None
) -> tuple[mx.array, mx.array, mx.array | None]:
    """(rows [N, V] as mlx-lm's sampler hands them to `categorical`: log-probabilities, -inf where the filters drop
    a token, times 1/T; short [N] bool as in to_probs_checked). mlx-lm's own ops in its order, in the logits' dtype,
    so that a draw with key_t is mlx-lm's draw (keys.draw); `ranked`: the whole vocabulary ranked. With XTC and
    `coin_keys` [N, 2] (the rows' coins, keys.PositionKeys.coin_span) XTC runs between min-p and top-k, as in
    mlx-lm's sampler; without them (a drafter's rows) it is left out. Not for greedy configs. Third: [N, C] the
    ranked candidates outside which every token is -inf (None when the filters ran over the whole row), for
    keys.draw_kept."""
    logprobs = logits - mlx_logsumexp(logits)
    vocab = logits.shape[-1]
    short = mx.zeros(logits.shape[:-1], dtype=mx.bool_)
    candidates = None
    if config.xtc and coin_keys is not None:
        return _with_xtc(logprobs, config, coin_keys) * (1.0 / config.temperature), short, candidates
    if 0 < config.top_p < 1 or 0 < config.top_k < vocab or config.min_p != 0.0:
        count = ranked_candidates(config, vocab)
        if ranked or not count:
            logprobs = _sorted_filters(logprobs, config)
        else:
            rows = logits.reshape(-1, vocab).astype(mx.float32)
            _, indices, keep, short = _candidate_keep(rows, config, count)
            kept = mx.put_along_axis(mx.zeros(rows.shape, dtype=mx.bool_), indices, keep, axis=-1)
            logprobs = mx.where(kept.reshape(logits.shape), logprobs, -mx.inf)
            short = short.reshape(logits.shape[:-1])
            candidates = indices
    return logprobs * (1.0 / config.temperature), short, candidates


def _with_xtc(logprobs: mx.array, config: SamplingConfig, coin_keys: mx.array) -> mx.array:
    """mlx-lm's filters with XTC over the whole vocabulary, a [1, V] row at a time (its shapes), row i's coin
    drawn with coin_keys[i] as mlx-lm's apply_xtc draws it."""
    rows = [_sorted_filters(logprobs[i : i + 1], config, coin_keys[i]) for i in range(logprobs.shape[0])]
    return mx.concatenate(rows)


def _sorted_filters(logprobs: mx.array, config: SamplingConfig, xtc_coin: mx.array | None = None) -> mx.array:
    """mlx-lm's filters over the whole sorted vocabulary, in its order; with `xtc_coin` (a [1, V] row's coin key)
    XTC between min-p and top-k."""
    if 0 < config.top_p < 1.0:
        logprobs = apply_top_p(logprobs, float32_top_p(config.top_p))
    if config.min_p != 0.0:
        logprobs = apply_min_p(logprobs, config.min_p)
    if xtc_coin is not None:
        probs = mx.softmax(logprobs, -1)
        mask = probs > mx.where(probs > config.xtc_threshold, probs, mx.inf).min(axis=-1, keepdims=True)
        if config.xtc_special_tokens:
            mask[..., list(config.xtc_special_tokens)] = False
        coin = mx.random.uniform(0, 1, key=xtc_coin)
        logprobs = mx.where(coin > config.xtc_probability, logprobs, mx.where(mask, -mx.inf, logprobs))
    if 0 < config.top_k < logprobs.shape[-1]:
        logprobs = apply_top_k(logprobs, config.top_k)
    return logprobs


def _candidate_keep(rows: mx.array, config: SamplingConfig, count: int) -> tuple[mx.array, ...]:
    """(values [R, C] best first, their indices, keep [R, C] bool, short [R] bool): which of each row's `count`
    best tokens mlx-lm's filters keep, and whether one ranked below them could survive too."""
    values, indices = top_candidates(rows, count)  # [R, C], best first
    last = values[:, -1:]
    keep = mx.ones(values.shape, dtype=mx.bool_)
    outside_survives = mx.ones(last.shape, dtype=mx.bool_)  # could a token ranked below the candidates pass?
    if 0 < config.top_p < 1:
        probs = mx.exp(values - row_logsumexp(rows))
        mass_before = mx.cumsum(probs, axis=-1, inclusive=False)
        kept = (mass_before < float32_top_p(config.top_p)).sum(axis=-1, keepdims=True)
        kept = mx.maximum(kept, 1)  # the best token is always kept
        threshold = mx.take_along_axis(values, kept - 1, axis=-1)
        keep = values >= threshold  # ties with the threshold stay, as in mlx-lm
        outside_survives = outside_survives & (threshold <= last)
    if config.min_p != 0.0:
        floor = values[:, :1] + math.log(config.min_p)
        keep = keep & (values >= floor)
        outside_survives = outside_survives & (floor <= last)
    if 0 < config.top_k < rows.shape[-1]:
        keep = keep & (mx.arange(values.shape[-1]) < config.top_k)  # exactly k: the first k of the ranking
        outside_survives = mx.zeros(last.shape, dtype=mx.bool_)
    return values, indices, keep, outside_survives[:, 0]


def to_probs_sorted(logits: mx.array, config: SamplingConfig) -> mx.array:
    """The same distributions with every filter applied over the whole sorted vocabulary (mlx-lm's own code)."""
    logits = logits.astype(mx.float32)
    if config.greedy:
        return (mx.arange(logits.shape[-1]) == mx.argmax(logits, axis=-1, keepdims=True)).astype(mx.float32)
    logprobs = _sorted_filters(logits - mlx_logsumexp(logits), config)
    return mx.softmax(logprobs * (1.0 / config.temperature), axis=-1)


def top_candidates(rows: mx.array, count: int) -> tuple[mx.array, mx.array]:
    """Each row's `count` largest logits, best first, and their indices: rows [R, V] -> ([R, C], [R, C] int32)."""
    ops = verify_kernel.row_ops()
    if ops is not None:
        return ops.top_candidates(rows, count)
    indices = mx.argpartition(-rows, kth=count - 1, axis=-1)[:, :count]
    values = mx.take_along_axis(rows, indices, axis=-1)
    order = mx.argsort(-values, axis=-1)
    return mx.take_along_axis(values, order, axis=-1), mx.take_along_axis(indices, order, axis=-1)


def mlx_logsumexp(logits: mx.array) -> mx.array:
    """mx.logsumexp(logits, axis=-1, keepdims=True), bit for bit (its bits decide every draw). On x86 CPUs through
    the kernel's copy of MLX's loop: the exps vectorized, the sum still one term at a time in index order (0.4 ms a
    152k row against MLX's 1.8-2.6)."""
    ops = verify_kernel.row_ops()
    if ops is not None and logits.ndim == 2 and logits.dtype == mx.float32 and sums_in_index_order():
        exact = ops.exact_logsumexp(logits)
        if exact is not None:
            return exact
    return mx.logsumexp(logits, axis=-1, keepdims=True)


def row_logsumexp(rows: mx.array) -> mx.array:
    """[R, V] -> [R, 1]."""
    ops = verify_kernel.row_ops()
    return ops.logsumexp(rows) if ops is not None else mx.logsumexp(rows, axis=-1, keepdims=True)


def sample(probs: mx.array, key: mx.array, greedy: bool) -> mx.array:
    """One token per row of probs [..., V] -> [...] int32. Greedy rows are one-hot, so argmax is exact.

    On the CPU at real vocabularies by inverse CDF in float64 with a 48-bit uniform (one cumulative sum: ~0.5 ms for
    152k tokens, where Gumbel-max costs ~5 ms of MLX's CPU log and random ops); below INVERSE_CDF_MIN_VOCAB tokens
    (fewer ops for dispatch-bound models) and elsewhere (no float64 on Apple GPUs) by Gumbel-max."""
    if greedy:
        return mx.argmax(probs, axis=-1).astype(mx.int32)
    if mx.default_device() != mx.cpu or probs.shape[-1] < INVERSE_CDF_MIN_VOCAB:
        return mx.random.categorical(mx.log(probs), key=key).astype(mx.int32)
    cdf = mx.cumsum(probs.astype(mx.float64), axis=-1)
    high, low = mx.random.uniform(shape=(2, *probs.shape[:-1], 1), key=key).astype(mx.float64)
    u = (high + low * 2.0**-24) * cdf[..., -1:]  # in [0, total): zero-probability tokens are never drawn
    return (cdf <= u).sum(axis=-1).astype(mx.int32)


def pick_draft_token(
    logits: mx.array, sampling: SamplingConfig, tree_topk: int, key: mx.array | None
) -> tuple[mx.array, mx.array, mx.array | None]:
    """One draft position from its logits [V]: (token fed onward [], tokens proposed [1] or [topk], q [V] or None).

    Top-k (ties broken as argsort does) for trees, whose first continues the chain (sampled: the coupled draw,
    then the best others); the argmax for greedy chains,
    which need no distribution; otherwise a sample from the processed draft distribution q, kept for verification.
    """
    if tree_topk > 1:
        if sampling.greedy or key is None:
            top = mx.argsort(-logits.astype(mx.float32))[:tree_topk].astype(mx.int32)
            return top[0], top, None
        # Sampled: the first child (the one the chain continues from) is the coupled draw with this depth's key
        children = coupled_candidates(logits[None], sampling, key[None], tree_topk)[0]
        return children[0], children, None
    if sampling.greedy:
        token = mx.argmax(logits).astype(mx.int32)
        return token, token[None], None
    # Drawn as the target draws, with the target's key for this position: coupled to the target's own draw
    token, q = draft_draw(logits, sampling, key)
    return token, token[None], q


def draft_draw(logits: mx.array, sampling: SamplingConfig, key: mx.array) -> tuple[mx.array, mx.array]:
    """(token [] int32, q [V] float32, the law it was drawn from) for one sampled draft row, logits [V].

    The target's draw (keys.draw) is MLX's inverse CDF over the processed row: tokens in id order, one uniform
    from the key. A draft's draw never decides the output, so with a ranking filter (top-p, top-k) over a
    vocabulary wider than the candidates it makes the same draw over the row's kept candidates alone, equal to
    the target-style draw up to rounding at the interval edges, for the cost of ranking them instead of three
    passes over the vocabulary (log-sum-exp, the draw's exp, q's softmax). q is what it drew from: the kept
    candidates renormalized, as Leviathan/Chen needs it."""
    vocab = logits.shape[-1]
    count = ranked_candidates(sampling, vocab)
    if not count:
        scaled = scaled_logprobs(logits[None], sampling)[0]
        return draw(scaled, key[None])[0], mx.softmax(scaled[0].astype(mx.float32), axis=-1)
    values, indices, keep, _ = _candidate_keep(logits[None].astype(mx.float32), sampling, count)
    order = mx.argsort(indices[0])  # id order, as the inverse CDF walks the vocabulary
    ids = indices[0][order]
    relative = (values[0] - values[0, :1]) * (1.0 / sampling.temperature)
    weights = mx.where(keep[0], mx.exp(relative), 0.0)[order]
    q = mx.zeros((vocab,), dtype=mx.float32).at[ids].add(weights / weights.sum())
    return ids[inverse_cdf(weights, key)[0]].astype(mx.int32), q


def coupled_candidates(logits: mx.array, sampling: SamplingConfig, keys: mx.array, width: int) -> mx.array:
    """[N, width] candidate tokens for rows of draft logits [N, V] (sampled configs): first the coupled draw with
    the row's key (keys [N, 2]; it is the target's own draw wherever draft and target agree, keys.py), then the
    row's best other tokens, so a tree of them holds the target's draw more often than the draft's top-k alone."""
    top = mx.argsort(-logits.astype(mx.float32), axis=-1)[:, : width + 1].astype(mx.int32)
    first = mx.stack([draft_draw(logits[i], sampling, keys[i])[0] for i in range(logits.shape[0])])  # [N]
    ranks = mx.arange(top.shape[1])  # width + 1, or the whole vocabulary when it is smaller
    others = mx.where(top == first[:, None], top.shape[1] + ranks, ranks)  # the coupled draw sorts last
    rest = mx.take_along_axis(top, mx.argsort(others, axis=-1)[:, : width - 1], axis=-1)
    return mx.concatenate([first[:, None], rest], axis=1)


def first_token_allowed(logits: mx.array, allowed: mx.array) -> mx.array:
    """Token healing's constraint: logits [N, V] with every token outside `allowed` [V'] (bool) at -inf; ids past
    V' (a wider output than the tokenizer's vocabulary) are not allowed."""
    vocab = min(logits.shape[-1], allowed.shape[0])
    mask = mx.concatenate([allowed[:vocab], mx.zeros(logits.shape[-1] - vocab, dtype=mx.bool_)])
    return mx.where(mask, logits, -mx.inf)
