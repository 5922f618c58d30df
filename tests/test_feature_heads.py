"""EAGLE-style feature heads: exact output on every family (chains and dynamic trees, greedy and sampled), drafts
that are really accepted, the training-time-test mask, training, and the base-model check."""

import mlx.core as mx
import numpy as np
import pytest
from helpers import assert_greedy_equal, mlx_lm_greedy, speculative_tokens
from mlx.utils import tree_flatten, tree_map
from stats import ALPHA, chi_square_pvalue
from test_engine_exactness import PROMPTS, exact_joint
from tiny import make_tiny

from mlxspec import UserError
from mlxspec.decoding.sampling import SamplingConfig
from mlxspec.drafting.heads.feature_drafter import FeatureDrafter
from mlxspec.drafting.heads.feature_head import FeatureHead, FeatureHeadConfig, HeadOnTarget, load_head
from mlxspec.loading import load_model
from mlxspec.train.eagle import EagleTrainConfig, train_eagle, unrolled_logits, unrolled_mask

SAMPLINGS = [SamplingConfig(1.0), SamplingConfig(0.7, top_p=0.9)]


def random_head(target, seed=3) -> FeatureHead:
    head = FeatureHead(FeatureHeadConfig(block_config=target.config, fc_bias=True))
    mx.random.seed(seed)
    head.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.5, head.parameters()))
    mx.eval(head.parameters())
    return head


def copying_head(target) -> FeatureHead:
    """For a one-layer target: fc passes the embedding through and the block is the target's own layer, so the head
    recomputes the target's next position (without the first token in its context): its drafts are nearly always
    right, and any misalignment of tokens, features, positions or cache rows would make them wrong."""
    head = FeatureHead(FeatureHeadConfig(block_config=target.config))
    head.block.update(target.layers[0].parameters())
    dims = target.config["hidden_size"]
    head.fc.weight = mx.concatenate([mx.eye(dims), mx.zeros((dims, dims))], axis=1)
    mx.eval(head.parameters())
    return head


def drafter_for(head, target, sampling=SamplingConfig(), beam=1, nodes=0):
    return FeatureDrafter(HeadOnTarget(head, target), sampling, beam=beam, max_nodes=nodes)


def test_greedy_eagle_on_a_hybrid_target_equals_plain_greedy():
    """Qwen3.5-style target (gated DeltaNet + attention): its recurrent layers roll back by deferred replay."""
    target = make_tiny("qwen3_5", seed=0)
    head = random_head(make_tiny("llama", seed=0))  # an attention block of the same width

    engines, totals = [], {}
    for prompt in PROMPTS:
        got = speculative_tokens(
            target, None, prompt, 20, num_draft=3, drafter=drafter_for(head, target), engine_out=engines, totals=totals
        )
        assert_greedy_equal(target, prompt, got, mlx_lm_greedy(target, prompt, 20))
    assert totals["drafted"] > totals["accepted"] and sum(e.deferred.replayed for e in engines) > 0


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("beam", [1, 3])
def test_a_copying_head_has_its_drafts_accepted(family, beam):
    target = make_tiny(family, seed=0, num_hidden_layers=1, vocab_size=8)
    head = copying_head(target)
    totals, engines = {}, []
    prompt = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6]
    drafter = drafter_for(head, target, beam=beam, nodes=12)
    got = speculative_tokens(
        target, None, prompt, 40, num_draft=4, drafter=drafter, tree_topk=beam, totals=totals, engine_out=engines
    )
    assert_greedy_equal(target, prompt, got, mlx_lm_greedy(target, prompt, 40))
    # 4 drafts deep: a head that is right 70% of the time keeps well over 2 drafts a step on average.
    assert totals["accepted"] / engines[0].target_calls >= 2.5, totals


def test_a_sampled_tree_holds_the_coupled_chain_so_a_copying_heads_draws_are_kept():
    """At T=1 the dynamic tree's spine is each depth's coupled draw (its position's key): a head that recomputes the
    target draws the target's own tokens there, so nearly every draft is kept, as under greedy decoding. The draft's
    top 3 alone (of 8 tokens at T=1) hold the target's draw less often (3.0 kept a call here, against 4.0 of 4).
    The text is plain decoding's."""
    sampling = SamplingConfig(1.0)
    target = make_tiny("llama", seed=0, num_hidden_layers=1, vocab_size=8)
    prompt = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6]
    plain = speculative_tokens(target, None, prompt, 40, num_draft=0, sampling=sampling, seed=4)
    totals, engines = {}, []
    drafter = drafter_for(copying_head(target), target, sampling, beam=3, nodes=12)
    got = speculative_tokens(
        target, None, prompt, 40, 4, sampling, seed=4, drafter=drafter, tree_topk=3, totals=totals, engine_out=engines
    )
    assert got[:40] == plain[:40]
    assert totals["accepted"] / engines[0].target_calls >= 3.5, totals


def test_lookup_in_front_of_an_eagle_head_stays_exact_and_both_draft():
    """Steps drafted by lookup still hand the head the rows they kept; its next proposal catches up on all of them."""
    from mlxspec.drafting.lookup.drafter import LookupThenModelDrafter, PromptLookupDrafter

    target = make_tiny("llama", seed=0, num_hidden_layers=1)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]
    inner = drafter_for(copying_head(target), target)
    drafter = LookupThenModelDrafter(PromptLookupDrafter(), inner)
    totals = {}
    got = speculative_tokens(target, None, prompt, 30, num_draft=4, drafter=drafter, totals=totals)
    assert_greedy_equal(target, prompt, got, mlx_lm_greedy(target, prompt, 30))
    assert inner.calls > 0 and totals["accepted"] > 0.5 * totals["drafted"]


@pytest.mark.parametrize(
    "sampling, beam",
    [
        pytest.param(SAMPLINGS[0], 1, id="chain-T1", marks=pytest.mark.slow),
        pytest.param(SAMPLINGS[1], 1, id="chain-T0.7-top-p", marks=pytest.mark.slow),  # 44 s here
        pytest.param(SAMPLINGS[0], 2, id="tree-T1", marks=pytest.mark.slow),  # 52 s here
    ],
)
def test_eagle_samples_follow_the_target_distribution(sampling, beam):
    """Chi-square of 3000 seeded runs (3 tokens, vocab 8) against the enumerated law; false alarm 1e-3. The chain is
    sampled from the head's q (Leviathan/Chen); the tree is verified by sampling the target at its nodes, the same
    sample-and-match code as every deterministic tree (whose top-p case test_medusa covers)."""
    target = make_tiny("llama", seed=0, logit_scale=3.0)
    head = random_head(target)
    prompt, length = [1, 2, 1], 3
    counts = np.zeros([8] * length)
    totals = {}
    for seed in range(3000):
        drafter = drafter_for(head, target, sampling, beam=beam, nodes=5)
        out = speculative_tokens(
            target,
            None,
            prompt,
            length,
            num_draft=3,
            sampling=sampling,
            seed=seed,
            drafter=drafter,
            tree_topk=beam,
            totals=totals,
        )
        counts[tuple(out)] += 1
    assert totals["accepted"] > 300  # the acceptance rule was really exercised
    assert chi_square_pvalue(counts, exact_joint(target, prompt, sampling, length)) > ALPHA


def test_unrolled_mask_extends_the_true_context_with_the_heads_own_chain():
    got = np.array(unrolled_mask(3, 2)).astype(int)
    expected = np.array(
        [
            # depth-1 keys | depth-2 keys
            [1, 0, 0, 0, 0, 0],  # depth 1, row 0: the true context up to 0
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [0, 0, 0, 1, 0, 0],  # depth 2, row 0: true context up to -1, then itself
            [1, 0, 0, 0, 1, 0],  # depth 2, row 1: true context up to 0, then itself
            [1, 1, 0, 0, 0, 1],
        ]
    )
    assert (got == expected).all()


def test_unrolled_depths_equal_drafting_step_by_step():
    """The training pass's depth 2 at row t equals the drafter feeding depth 1's output at row t-1 through a cache
    that holds the true context up to t-1: training-time test trains what inference runs."""
    from mlx_lm.models.cache import KVCache

    target = make_tiny("llama", seed=0)
    wired = HeadOnTarget(random_head(target), target)
    tokens = mx.array([[3, 1, 4, 1, 5, 2]])
    features = mx.random.normal((1, 6, target.config["hidden_size"]))
    unrolled, _ = unrolled_logits(wired, tokens, features, 2)
    t = 4
    cache = KVCache()
    depth1, fed_on = wired.step(
        tokens[:, :t], features[:, :t], mx.tril(mx.ones((t, t), dtype=mx.bool_)), cache
    )  # the true rows 0..t-1
    depth2, _ = wired.step(tokens[:, t : t + 1], fed_on[:, t - 1 : t], None, cache)
    assert mx.allclose(depth1[0], unrolled[0, 0, :t], atol=1e-4).item()
    assert mx.allclose(depth2[0, 0], unrolled[1, 0, t], atol=1e-4).item()


def test_ranked_tree_keeps_the_most_probable_candidates_with_their_ancestors():
    target = make_tiny("llama", seed=0)
    drafter = drafter_for(random_head(target), target, beam=2, nodes=3)
    # candidates 0,1 at depth 1; 2,3 children of 0; 4,5 children of 1
    tokens, parents = [5, 6, 1, 2, 3, 4], [-1, -1, 0, 0, 1, 1]
    scores = np.log(np.array([0.5, 0.3, 0.4, 0.05, 0.25, 0.01]))
    draft = drafter._ranked_tree(tokens, parents, scores)
    assert draft.shape.parents == (-1, 0, 0, 1) and draft.tokens.tolist() == [5, 6, 1]
    drafter.max_nodes = 4
    draft = drafter._ranked_tree(tokens, parents, scores)
    assert draft.shape.parents == (-1, 0, 0, 1, 2) and draft.tokens.tolist() == [5, 6, 1, 3]


@pytest.mark.slow  # 15-60 s on 2 cores: in the whole suite, not the quick run
def test_train_save_load_resume_and_refuse_other_base_models(tiny_dirs, tmp_path):
    target = load_model(tiny_dirs["target"])
    out = tmp_path / "eagle"
    config = EagleTrainConfig(steps=3, batch_size=2, seq_len=80, unroll=2, distill_sequences=4, eval_windows=2)
    lines = []
    trained = train_eagle(target, out, config, log=lines.append)
    assert (out / "eagle.safetensors").exists() and len(trained.config.acceptance) == 6
    # each stream's progress counts its own sequences, and the held-out acceptance is measured and printed once
    assert "self-distilling the training data: 4/4 sequences" in lines
    assert "self-distilling the held-out data: 2/2 sequences" in lines
    assert [line for line in lines if "acceptance" in line] == [
        "held-out greedy acceptance by depth 1..6 at step 3: " + " ".join(f"{a:.3f}" for a in trained.config.acceptance)
    ]
    loaded = load_head(out, tiny_dirs["target"])
    want = dict(tree_flatten(trained.parameters()))
    got = dict(tree_flatten(loaded.parameters()))
    assert want.keys() == got.keys() and all(mx.allclose(want[k], got[k], atol=2e-2).item() for k in want)
    with pytest.raises(UserError, match="trained on base model"):
        load_head(out, tiny_dirs["draft"])
    again = train_eagle(target, out, config, log=lambda s: None)  # a finished run resumes without training
    assert all(mx.array_equal(v, dict(tree_flatten(again.parameters()))[k]).item() for k, v in want.items())
