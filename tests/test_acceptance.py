"""The acceptance math against its analytic distribution."""

import mlx.core as mx
import numpy as np
import pytest
from stats import ALPHA, chi_square_pvalue

from mlxspec.decoding.acceptance import accept_chain, accept_deterministic_chain, residual_distribution
from mlxspec.decoding.sampling import SamplingConfig, to_probs
from mlxspec.decoding.trees import TreeShape, accept_tree_samples


def random_dist(rng, vocab, zeros=0):
    p = rng.dirichlet(np.ones(vocab) * 0.7)
    if zeros:
        p[rng.choice(vocab, zeros, replace=False)] = 0
        p /= p.sum()
    return p.astype(np.float32)


def test_residual_matches_formula_and_falls_back_to_p():
    p = mx.array([[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25]])
    q = mx.array([[0.2, 0.6, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]])
    res = np.array(residual_distribution(p, q))
    np.testing.assert_allclose(res[0], [0.3 / 0.4, 0.0, 0.1 / 0.4, 0.0], atol=1e-6)
    np.testing.assert_allclose(res[1], [0.25] * 4, atol=1e-6)  # p == q: residual is zero, so sample from p


def draw_and_accept(target_probs, draft_probs, trials, seed):
    """Per trial: draw x ~ q_1 (K=1), run accept_chain. Returns numpy (num_accepted, next_token, x)."""
    p_mx, q_mx = mx.array(target_probs), mx.array(draft_probs)

    def one(key):
        draft_key, accept_key = mx.random.split(key)
        x = mx.random.categorical(mx.log(q_mx[0]), key=draft_key).astype(mx.int32)[None]
        n, nxt = accept_chain(x, q_mx, p_mx, accept_key)
        return n, nxt, x[0]

    return [np.array(a) for a in mx.vmap(one)(mx.random.split(mx.random.key(seed), trials))]


def run_chain(p, q, trials, seed):
    """The first emitted token of each trial: the draft if accepted, else the resample."""
    n, nxt, x = draw_and_accept(p, q, trials, seed)
    return np.where(n > 0, x, nxt)


@pytest.mark.parametrize("case", ["dense", "zeros_in_p", "zeros_in_q", "top_p"])
def test_first_token_is_distributed_as_target(case):
    """P(out = y) = q(y) min(1, p/q) + P(reject) residual(y) must equal p(y) exactly; checked by chi-square."""
    rng = np.random.default_rng({"dense": 0, "zeros_in_p": 1, "zeros_in_q": 2, "top_p": 3}[case])
    vocab = 6
    p = random_dist(rng, vocab, zeros=2 if case == "zeros_in_p" else 0)
    q = random_dist(rng, vocab, zeros=2 if case == "zeros_in_q" else 0)
    if case == "top_p":
        config = SamplingConfig(temperature=0.8, top_p=0.7)
        p = np.array(to_probs(mx.log(mx.array(p)), config))
        q = np.array(to_probs(mx.log(mx.array(q)), config))
        assert (p == 0).any() and (q == 0).any()
    bonus = random_dist(rng, vocab)
    target = np.stack([p, bonus])
    samples = run_chain(target, q[None], trials=20000, seed=10)
    counts = np.bincount(samples, minlength=vocab)
    assert counts[p == 0].sum() == 0
    assert chi_square_pvalue(counts, p) > ALPHA


def test_bonus_token_follows_last_target_row_when_all_accepted():
    # q == p everywhere: every draft is accepted, so the next token is the bonus, drawn from p_{K+1}.
    rng = np.random.default_rng(5)
    p1, bonus = random_dist(rng, 5), random_dist(rng, 5)
    n, nxt, _ = draw_and_accept(np.stack([p1, bonus]), p1[None], 20000, seed=1)
    assert np.all(n == 1)
    assert chi_square_pvalue(np.bincount(nxt, minlength=5), bonus) > ALPHA


def test_acceptance_probability_is_min_one_ratio():
    """P(accept) = sum_x q(x) min(1, p(x)/q(x)) = 1 - TV(p, q)."""
    rng = np.random.default_rng(7)
    p, q = random_dist(rng, 6), random_dist(rng, 6)
    trials = 20000
    accepted = draw_and_accept(np.stack([p, p]), q[None], trials, seed=2)[0].sum()
    expected = np.minimum(p, q).sum()
    # Binomial test, two-sided at ~4.4 sigma (false alarm about 1e-5).
    sigma = np.sqrt(trials * expected * (1 - expected))
    assert abs(accepted - trials * expected) < 4.4 * sigma


def test_greedy_accepts_the_longest_argmax_prefix():
    vocab = 5
    target_tokens = [3, 1, 4, 0]  # argmax of p_1..p_4
    p = mx.array(np.eye(vocab, dtype=np.float32)[target_tokens])
    for drafted, expected_n, expected_next in [([3, 1, 4], 3, 0), ([3, 2, 4], 1, 1), ([0, 1, 4], 0, 3)]:
        q = mx.array(np.eye(vocab, dtype=np.float32)[drafted])
        n, nxt = accept_chain(mx.array(drafted, mx.int32), q, p, mx.random.key(0), greedy=True)
        assert (n.item(), nxt.item()) == (expected_n, expected_next)


def test_chain_rejects_after_first_rejection_even_if_later_tokens_match():
    vocab = 4
    p = mx.array(np.eye(vocab, dtype=np.float32)[[1, 2, 3]])
    drafted = [0, 2]  # first mismatches, second would match
    q = mx.array(np.eye(vocab, dtype=np.float32)[drafted])
    n, nxt = accept_chain(mx.array(drafted, mx.int32), q, p, mx.random.key(0), greedy=True)
    assert (n.item(), nxt.item()) == (0, 1)


def test_deterministic_chain_agrees_with_one_hot_leviathan_and_with_the_tree_verifier():
    """Greedy: the same (accepted, next) as accept_chain with one-hot q and p; any draws: the same as accept_tree
    on a chain shape. 300 random cases over K = 1..6 and a vocab of 4 (so prefixes often match)."""
    rng = np.random.default_rng(0)
    vocab = 4
    for _ in range(300):
        k = int(rng.integers(1, 7))
        drafted = rng.integers(0, vocab, k).astype(np.int32)
        samples = rng.integers(0, vocab, k + 1).astype(np.int32)
        n, nxt = accept_deterministic_chain(mx.array(drafted), mx.array(samples))
        one_hot_q = mx.array(np.eye(vocab, dtype=np.float32)[drafted])
        one_hot_p = mx.array(np.eye(vocab, dtype=np.float32)[samples])
        ref_n, ref_next = accept_chain(mx.array(drafted), one_hot_q, one_hot_p, mx.random.key(0), greedy=True)
        shape = TreeShape.chain(k)
        parents = mx.array([0, *shape.parents[1:]], dtype=mx.int32)
        nodes = mx.array([9, *drafted.tolist()], dtype=mx.int32)  # node 0 is the root; its token is never compared
        tree_n, tree_next = accept_tree_samples(nodes, parents, mx.array(samples), shape.max_depth)
        assert (n.item(), nxt.item()) == (ref_n.item(), ref_next.item()) == (tree_n.item(), tree_next.item())


def test_a_token_the_target_gives_zero_probability_is_never_accepted_even_when_u_is_zero(monkeypatch):
    """Acceptance is u * q(x) < p(x), strictly: with p(x) = 0 even the smallest uniform (0.0, which float uniforms
    can draw) rejects. `<=` would emit a token the target never samples."""
    from mlxspec.decoding import acceptance

    monkeypatch.setattr(mx.random, "uniform", lambda shape, key: mx.zeros(shape))
    draft = mx.array([[0.5, 0.5, 0.0]])
    target = mx.array([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    num_accepted, next_token = acceptance._accept_chain(mx.array([0]), draft, target, mx.random.key(0), False)
    assert num_accepted.item() == 0 and next_token.item() == 1  # the residual is all on token 1
