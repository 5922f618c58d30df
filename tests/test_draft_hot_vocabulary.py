"""A draft model's hot vocabulary (drafting/draft_model/hot_vocabulary.py): the output layer cut to the most
frequent tokens proposes only those, with the full layer's logits there, and the output stays exactly the target's,
greedy and sampled under both acceptance rules."""

import mlx.core as mx
import numpy as np
import pytest
from helpers import speculative_tokens
from stats import ALPHA, chi_square_pvalue
from test_engine_exactness import exact_joint
from tiny import make_tiny

import mlxspec
from mlxspec.decoding.sampling import SamplingConfig
from mlxspec.drafting.draft_model.hot_vocabulary import hot_token_ids, with_hot_vocabulary
from mlxspec.kernels import verify as verify_kernel

HOT = np.array([0, 2, 3, 5, 7], dtype=np.int32)  # 5 of the tiny models' 8 tokens


def test_the_hot_tokens_are_the_most_frequent_and_the_special_ones():
    shares = np.array([0.1, 0.3, 0.0, 0.3, 0.05, 0.2, 0.0, 0.05])
    # 1 and 3 tie at 0.3 (the lower id first), then 5; the special id 6 is kept although never counted.
    assert hot_token_ids(shares, [6], 4).tolist() == [1, 3, 5, 6]
    assert hot_token_ids(shares, [], 3).tolist() == [1, 3, 5]
    assert hot_token_ids(shares, [99, 6], 2).tolist() == [1, 6]  # an id outside the vocabulary is ignored


@pytest.mark.parametrize("tied", [False, True], ids=["lm_head", "tied"])
def test_a_cut_draft_scores_only_its_hot_tokens_with_the_full_layers_logits(tied):
    model = make_tiny("llama", seed=5, tie_word_embeddings=tied)
    cut = with_hot_vocabulary(model, HOT, 8)
    tokens = mx.array([[1, 2, 3, 4]])
    full, hot = model(tokens), cut(tokens)
    cold = np.setdiff1d(np.arange(8), HOT)
    assert np.all(np.isneginf(np.array(hot)[..., cold]))
    np.testing.assert_allclose(np.array(hot)[..., HOT], np.array(full)[..., HOT], rtol=1e-5, atol=1e-5)
    backend, _ = verify_kernel.resolve("auto")
    routed = verify_kernel.routed_view(cut, backend)  # as generation runs it: through the kernel where built
    np.testing.assert_allclose(np.array(routed(tokens)), np.array(hot), rtol=1e-5, atol=1e-5)
    assert model(tokens).tolist() == full.tolist()  # the model itself is unchanged


def test_greedy_with_a_cut_draft_equals_plain_decoding_and_its_drafts_are_accepted():
    spec = mlxspec.load(num_draft=4, draft_vocab=2000)
    assert spec.draft.variant == "vocab 2000"
    prompt = spec.encode("def fibonacci(n):\n")
    plain = spec.generate(prompt, max_tokens=32, use_draft=False, stop_at_eos=False)
    cut = spec.generate(prompt, max_tokens=32, stop_at_eos=False)
    assert cut.tokens == plain.tokens
    assert cut.stats.accepted > 0


@pytest.mark.slow  # 4,000 seeded runs for each rule: 50-100 s on 2 cores
@pytest.mark.parametrize("acceptance", ["coupled", "residual"])
def test_samples_with_a_cut_draft_follow_the_target_distribution(acceptance):
    """Chi-square of 4000 seeded runs (K=2, 3 tokens) against the processed target's enumerated law; false alarm
    1e-3. The cut draft never proposes tokens 1, 4 and 6, which must still come out at the target's rate. The same
    counts must reject the cut draft's own law (power check)."""
    sampling = SamplingConfig(1.0)
    target = make_tiny("llama", seed=0, logit_scale=3.0)
    draft = with_hot_vocabulary(make_tiny("llama", seed=5, logit_scale=3.0), HOT, 8)
    prompt, length = [1, 2], 3
    counts = np.zeros([8] * length)
    for seed in range(4000):
        out = speculative_tokens(
            target, draft, prompt, length, num_draft=2, sampling=sampling, seed=seed, acceptance=acceptance
        )
        counts[tuple(out)] += 1
    assert chi_square_pvalue(counts, exact_joint(target, prompt, sampling, length)) > ALPHA
    draft_law = exact_joint(draft, prompt, sampling, length)
    assert chi_square_pvalue(counts, np.maximum(draft_law, 1e-12)) < ALPHA
