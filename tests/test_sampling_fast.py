"""Sampling at real vocabularies: top-p/top-k on ranked candidates instead of a full sort, the row ops the kernel
provides, the inverse-CDF sampler, and the engine's redo of a row whose top-p set reaches past its candidates."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from helpers import speculative_tokens
from stats import ALPHA, chi_square_pvalue
from tiny import make_tiny

from mlxspec.decoding import sampling
from mlxspec.decoding.sampling import SamplingConfig, sample, to_probs_checked, to_probs_sorted
from mlxspec.kernels import verify as verify_kernel

CONFIGS = {
    "top-p": SamplingConfig(0.7, top_p=0.9),
    "top-k": SamplingConfig(1.0, top_k=40),
    "top-p+min-p+top-k": SamplingConfig(0.8, top_p=0.95, min_p=0.02, top_k=300),
    "min-p": SamplingConfig(0.7, min_p=0.05),
    "temperature": SamplingConfig(0.7),
}


def peaked_logits(rows: int, vocab: int, seed: int) -> mx.array:
    """Trained-model-like rows: log-probabilities falling as -1.2 log(rank), shuffled."""
    mx.random.seed(seed)
    base = -1.2 * mx.log(mx.arange(1, vocab + 1).astype(mx.float32)) * 6
    return mx.stack([base[mx.random.permutation(vocab)] for _ in range(rows)])


@pytest.mark.parametrize("name", CONFIGS)
def test_ranked_candidates_give_the_sorted_distribution(name):
    """Where no row is flagged short, the candidate path equals mlx-lm's filters over the whole sorted vocabulary."""
    config = CONFIGS[name]
    logits = peaked_logits(3, 5000, seed=1)
    probs, short = to_probs_checked(logits, config)
    assert not short.any().item()
    expected = to_probs_sorted(logits, config)
    assert mx.allclose(probs, expected, atol=1e-6).item()
    assert mx.array_equal(probs > 0, expected > 0).item()  # the same tokens survive the filters


def test_a_flat_row_is_flagged_short_and_a_peaked_one_is_not():
    flat = mx.zeros((1, 5000))  # top-p 0.9 keeps 4500 tokens: far past the 1024 candidates
    peaked = peaked_logits(1, 5000, seed=2)
    _, short = to_probs_checked(mx.concatenate([flat, peaked]), SamplingConfig(0.7, top_p=0.9))
    assert short.tolist() == [True, False]
    # top-k keeps only ranked tokens, so even a flat row is exact
    assert not to_probs_checked(flat, SamplingConfig(0.7, top_k=10))[1].any().item()


def test_candidate_ranking_without_the_kernel_matches_the_kernel(monkeypatch):
    logits = peaked_logits(2, 3000, seed=3)
    with_kernel = sampling.top_candidates(logits, 256)
    monkeypatch.setattr(verify_kernel, "row_ops", lambda: None)
    without = sampling.top_candidates(logits, 256)
    assert mx.array_equal(with_kernel[0], without[0]).item()
    for config in CONFIGS.values():
        assert mx.allclose(to_probs_checked(logits, config)[0], to_probs_sorted(logits, config), atol=1e-6).item()


@pytest.mark.skipif(verify_kernel.row_ops() is None, reason="the verify kernel is not built here")
def test_kernel_row_ops_equal_their_definitions():
    ops = verify_kernel.row_ops()
    x = mx.random.normal((3, 20000)) * 4
    exact = np.log(np.exp(np.array(x, dtype=np.float64)).sum(-1))
    assert np.abs(np.array(ops.logsumexp(x))[:, 0] - exact).max() < 1e-4
    values, indices = ops.top_candidates(x, 500)
    assert mx.array_equal(values, mx.sort(x, axis=-1)[:, ::-1][:, :500]).item()
    assert mx.array_equal(mx.take_along_axis(x, indices, axis=-1), values).item()
    ties = ops.top_candidates(mx.array([[1.0, 3.0, 3.0, 2.0, 3.0]]), 3)
    assert ties[1].tolist() == [[1, 2, 4]]  # ties by lower index


@pytest.mark.parametrize("inverse_cdf", [True, False], ids=["inverse-cdf", "gumbel"])
def test_sampler_follows_the_distribution_and_never_draws_zero_mass(inverse_cdf, monkeypatch):
    """20,000 draws from one row (one call, independent uniforms per row); chi-square false alarm 1e-3. Both of
    sample()'s paths: inverse CDF (real vocabularies on the CPU) and Gumbel-max (small vocabularies, GPUs)."""
    monkeypatch.setattr(sampling, "INVERSE_CDF_MIN_VOCAB", 0 if inverse_cdf else 10**9)
    probs = mx.array([0.0, 0.3, 0.0, 0.05, 0.15, 0.0, 0.25, 0.001, 0.249, 0.0])
    draws = np.array(sample(mx.broadcast_to(probs, (20000, 10)), mx.random.key(4), False))
    counts = np.bincount(draws, minlength=10)
    assert counts[np.array(probs) == 0].sum() == 0
    assert chi_square_pvalue(counts, np.array(probs)) > ALPHA


def test_plain_decoding_redoes_short_rows_with_the_whole_vocabulary(monkeypatch):
    """With 16 candidates of a 64-token vocabulary and near-flat rows, top-p sets often reach past the candidates.
    Those steps are redrawn with the same key, so every token equals a run that always ranks the whole vocabulary."""
    target = make_tiny("llama", seed=0, vocab_size=64, logit_scale=0.6)
    config = SamplingConfig(1.0, top_p=0.9)
    monkeypatch.setattr(sampling, "CANDIDATES", 16)
    for seed in range(3):
        engines = []
        fast = speculative_tokens(target, None, [1, 2, 3], 20, sampling=config, seed=seed, engine_out=engines)
        assert engines[0].sorted_fallbacks > 0
        with monkeypatch.context() as m:
            m.setattr(sampling, "CANDIDATES", 64)  # every row ranks the whole vocabulary: never short
            assert fast == speculative_tokens(target, None, [1, 2, 3], 20, sampling=config, seed=seed)


def test_speculation_with_short_rows_samples_the_target_distribution(monkeypatch):
    """First tokens of 1,000 seeded K=2 runs where target and draft rows are often short (16 candidates of 64):
    chi-square against the target's law over the whole sorted vocabulary, false alarm 1e-3."""
    target = make_tiny("llama", seed=0, vocab_size=64, logit_scale=0.6)
    draft = make_tiny("llama", seed=4, vocab_size=64, logit_scale=0.6)
    config = SamplingConfig(1.0, top_p=0.9)
    prompt = [1, 2, 3]
    monkeypatch.setattr(sampling, "CANDIDATES", 16)
    counts, fallbacks = np.zeros(64), 0
    for seed in range(1000):
        engines = []
        counts[speculative_tokens(target, draft, prompt, 3, 2, config, seed=seed, engine_out=engines)[0]] += 1
        fallbacks += engines[0].sorted_fallbacks
    assert fallbacks > 50  # the redo path really ran
    law = np.array(to_probs_sorted(target(mx.array(prompt)[None])[0, -1], config))
    assert chi_square_pvalue(counts, law) > ALPHA


@pytest.mark.parametrize("name", CONFIGS)
def test_a_draft_row_draws_the_targets_coupled_token_from_its_candidates(name):
    """draft_draw weighs only a ranked row's kept candidates (the whole row without a ranking filter), yet draws
    what the target's own keyed draw of the processed row would (keys.draw: MLX's inverse CDF over the vocabulary,
    tokens in id order), so coupled drafts keep matching; its q is the filters' distribution."""
    from mlxspec.decoding.keys import draw

    config = CONFIGS[name]
    logits = peaked_logits(60, 5000, seed=4)
    for i in range(logits.shape[0]):
        key = mx.random.key(1000 + i)
        token, q = sampling.draft_draw(logits[i], config, key)
        assert token.item() == draw(sampling.scaled_logprobs(logits[i : i + 1], config)[0], key[None])[0].item(), i
        assert np.abs(np.array(q) - np.array(to_probs_sorted(logits[i : i + 1], config)[0])).max() < 1e-6


def test_a_draft_rows_draws_follow_the_q_it_reports():
    """Leviathan/Chen is exact only if the draft token is a sample of the q handed to it: 6000 keyed draws of one
    5000-token row at T=0.7, top-p 0.9 against the returned q (chi-square, false alarm 1e-3); the power check: the same
    counts against the row's distribution at T=0.85 instead of 0.7 fail it."""
    config = CONFIGS["top-p"]
    mx.random.seed(7)  # a Zipf row with exponent 1.5: top-p keeps 49 tokens (simulated power 200 of 200)
    row = (-1.5 * mx.log(mx.arange(1, 5001).astype(mx.float32)))[mx.random.permutation(5000)]
    keys = mx.random.split(mx.random.key(3), 6000)
    draws = [sampling.draft_draw(row, config, keys[i]) for i in range(keys.shape[0])]
    tokens = mx.stack([token for token, _ in draws])
    counts = np.bincount(np.array(tokens), minlength=row.shape[0])
    q = np.array(draws[0][1])
    assert chi_square_pvalue(counts, q) > ALPHA
    hotter = np.array(to_probs_sorted(row[None], SamplingConfig(0.85, top_p=0.9))[0])
    assert chi_square_pvalue(counts, hotter) < ALPHA


def test_a_draft_that_is_the_target_keeps_nearly_every_coupled_draft_through_its_candidates():
    """A compiled draft chain identical to a 3000-token target at T=0.7, top-p 0.9: its candidate draws
    (draft_draw) are the target's own keyed draws, so nearly every draft is kept (23 of 24 here), and the text is
    plain decoding's."""
    target = make_tiny("llama", seed=0, vocab_size=3000, logit_scale=3.0)
    draft = make_tiny("llama", seed=0, vocab_size=3000, logit_scale=3.0)
    config = SamplingConfig(0.7, top_p=0.9)
    plain = speculative_tokens(target, None, [1, 2, 3, 4], 30, num_draft=0, sampling=config, seed=3)
    totals, engines = {}, []
    got = speculative_tokens(target, draft, [1, 2, 3, 4], 30, 4, config, seed=3, totals=totals, engine_out=engines)
    assert got[:30] == plain[:30]
    assert engines[0].drafter.compiled is not None  # the compiled chain drew them
    assert totals["accepted"] >= 0.9 * totals["drafted"], totals


@pytest.mark.parametrize("compact", [True, False], ids=["candidate-sums", "zero-filled-row"])
@pytest.mark.parametrize("vocab", [5000, 151936])
def test_the_targets_draw_over_its_candidates_is_mlxs_draw_bit_for_bit(vocab, compact, monkeypatch):
    """keys.draw_kept takes MLX's inverse CDF's exp at the ranked candidates alone; every token it draws equals
    mx.random.categorical's over the whole processed row (keys.draw), with each filter setting, on rows flat enough
    that top-p 0.9 keeps hundreds of tokens (273 of 5000, 697 of 151936) within its candidates. Both ways of
    summing run: over the candidates alone (where MLX sums in index order) and over a zero-filled row (elsewhere)."""
    from mlxspec.decoding import keys as keys_module
    from mlxspec.decoding.keys import draw, draw_kept

    if compact and not keys_module.sums_in_index_order():
        pytest.skip("MLX does not sum in index order here: draw_kept keeps the zero-filled row")
    monkeypatch.setattr(keys_module, "sums_in_index_order", lambda: compact)

    logits = peaked_logits(30, vocab, seed=6) * 0.18  # flatter rows: large kept sets, many weights in each sum
    keys = mx.random.split(mx.random.key(9), logits.shape[0])
    for name, config in CONFIGS.items():
        scaled, short, candidates = sampling.scaled_logprobs_kept(logits, config)
        if candidates is None:  # min-p alone and temperature alone filter the whole row: draw() itself runs
            continue
        assert not short.any().item()  # no row reaches past its candidates (those are redrawn over the whole row)
        assert draw_kept(scaled, candidates, keys).tolist() == draw(scaled, keys).tolist(), name


@pytest.mark.parametrize("vocab", [5000, 151936])
def test_the_draw_over_candidates_alone_sums_as_the_whole_row_bit_for_bit(vocab):
    """Where MLX sums in index order (its CPU backend on x86), draw_kept's sum and cumulative sum run over the
    candidates alone, in id order. Checked at the bits, not by the tokens (a differing last bit moves a draw only
    when the uniform lands within it of an interval's edge): the total and the cumulative weights at the candidates
    equal MLX's over the zero-filled row, and so does the drawn index, for every key, and where the threshold
    reaches the total, the row's last index, as MLX's own inverse CDF gives."""
    from mlxspec.decoding import keys as keys_module

    if not keys_module.sums_in_index_order():
        pytest.skip("MLX does not sum in index order here (arm CPU or a GPU): draw_kept keeps the zero-filled row")
    logits = peaked_logits(12, vocab, seed=11) * 0.18
    keys = mx.random.split(mx.random.key(3), logits.shape[0])
    scaled, _, candidates = sampling.scaled_logprobs_kept(logits, CONFIGS["top-p"])
    for i in range(logits.shape[0]):
        values = scaled[i][candidates[i]]
        weights = mx.exp(values - values.max())
        order = mx.argsort(candidates[i])
        ids, sorted_weights = candidates[i][order], weights[order]
        row = mx.put_along_axis(mx.zeros((vocab,), dtype=mx.float32), ids, sorted_weights, axis=0)
        assert mx.array_equal(sorted_weights.sum(), row.sum()).item()
        compact_cdf = mx.cumsum(sorted_weights, inclusive=False)
        assert mx.array_equal(compact_cdf, mx.cumsum(row, inclusive=False)[ids]).item()
        for key in mx.random.split(keys[i], 20):
            assert keys_module.inverse_cdf_at(sorted_weights, ids, vocab, key).item() == (
                keys_module.inverse_cdf(row, key).item()
            )
    # a threshold at the total (a uniform that rounds up to 1) lands past the last candidate, on the row's last id
    weights, ids = mx.array([0.5, 0.25, 0.25]), mx.array([2, 7, 9])
    row = mx.zeros((vocab,)).at[ids].add(weights)
    total_key = mx.random.key(0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mx.random, "uniform", lambda shape, key: mx.ones(shape))
        assert keys_module.inverse_cdf_at(weights, ids, vocab, total_key).item() == vocab - 1
        assert keys_module.inverse_cdf(row, total_key).item() == vocab - 1


@pytest.mark.parametrize("vocab", [7, 32000, 151936, 262144])
def test_the_kernels_logsumexp_is_mlxs_bit_for_bit(vocab):
    """sampling.mlx_logsumexp (every sampled row's normalizer: its bits decide each draw) equals mx.logsumexp bit
    for bit: on x86 CPUs through the kernel's copy of MLX's loop, on rows narrow and wide, peaked and flat, with
    -inf entries (a bias, a mask) and a row that is all -inf."""
    from mlxspec.decoding.keys import sums_in_index_order
    from mlxspec.kernels import verify as verify_kernel

    ops = verify_kernel.row_ops()
    if ops is None or not sums_in_index_order():
        pytest.skip("no kernel here, or MLX does not sum in index order: mx.logsumexp itself runs")
    for seed, scale in enumerate([0.05, 1.0, 6.0, 40.0]):
        mx.random.seed(seed)
        rows = mx.random.normal((6, vocab)) * scale
        rows = mx.where(mx.random.uniform(shape=rows.shape) < 0.2 * (seed % 2), -mx.inf, rows)
        rows = mx.concatenate([rows[:5], mx.full((1, vocab), -mx.inf)])
        exact = ops.exact_logsumexp(rows)
        assert exact is not None and exact.shape == (6, 1)
        assert mx.array_equal(sampling.mlx_logsumexp(rows), mx.logsumexp(rows, axis=-1, keepdims=True)).item(), seed
