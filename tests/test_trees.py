"""Tree verification: exact masks, per-family equality with plain decoding, and distribution tests."""

import mlx.core as mx
import numpy as np
import pytest
from helpers import assert_greedy_equal, mlx_lm_greedy, speculative_tokens
from mlx_lm.models.cache import make_prompt_cache
from stats import ALPHA, chi_square_pvalue
from test_engine_exactness import PROMPTS, exact_joint
from tiny import FAMILIES, make_tiny

from mlxspec.cache.rollback import make_speculative_cache
from mlxspec.decoding.sampling import SamplingConfig
from mlxspec.decoding.tree_attention import keep_tree_path, tree_verification
from mlxspec.decoding.trees import TreeShape, accept_tree, ancestor_mask, continuation_tree
from mlxspec.drafting.lookup.drafter import PromptLookupDrafter

# root; two children; a grandchild under each
SHAPE = TreeShape((-1, 0, 0, 1, 2))


def test_ancestor_mask_is_exact():
    expected = [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 0, 1, 0, 1],
    ]
    assert ancestor_mask(SHAPE).tolist() == [[bool(v) for v in row] for row in expected]
    assert SHAPE.depths == (0, 1, 1, 2, 2)
    assert SHAPE.path_to(4) == [2, 4] and SHAPE.path_to(0) == []


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tree_forward_equals_each_path_alone_and_compaction_equals_decoding(family):
    """Every node's logits equal a plain forward over its own path; the kept path leaves a plain cache."""
    model = make_tiny(family, seed=0, sliding_window=6)
    prompt, tokens = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3], [3, 4, 5, 6, 0]
    paths = {0: prompt, 1: prompt + [4], 2: prompt + [5], 3: prompt + [4, 6], 4: prompt + [5, 0]}

    def plain_last_logits(sequence):
        return model(mx.array(sequence)[None], cache=make_prompt_cache(model))[0, -1]

    cache = make_speculative_cache(model, max_rollback=8)
    model(mx.array(prompt[:-1])[None], cache=cache)
    with tree_verification(model, cache, SHAPE, len(prompt) - 1):
        logits = model(mx.array(tokens)[None], cache=cache)[0]
    for node, sequence in paths.items():
        assert mx.allclose(logits[node], plain_last_logits(sequence), atol=1e-4).item(), node
    keep_tree_path(cache, len(prompt) - 1, [0, 2, 4])
    after = model(mx.array([[3]]), cache=cache)[0, -1]
    assert mx.allclose(after, plain_last_logits(prompt + [5, 0, 3]), atol=1e-4).item()


def test_greedy_tree_acceptance_takes_the_longest_matching_path():
    vocab = 6
    tokens = mx.array([9, 4, 5, 1, 2], dtype=mx.int32)  # node tokens; root's token is irrelevant
    argmax = [5, 3, 2, 0, 4]  # target argmax after each node
    probs = mx.array(np.eye(vocab, dtype=np.float32)[argmax])
    parents = mx.array([0, 0, 0, 1, 2], dtype=mx.int32)
    deepest, nxt = accept_tree(tokens, parents, probs, mx.random.key(0), SHAPE.max_depth, greedy=True)
    assert (deepest.item(), nxt.item()) == (4, 4)  # root -> node 2 (token 5) -> node 4 (token 2), then argmax 4


def test_greedy_tree_with_quantized_kv_equals_plain_decoding_with_quantized_kv():
    kwargs = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
    target, draft = make_tiny("llama", seed=0, **kwargs), make_tiny("llama", seed=1, **kwargs)
    for prompt in PROMPTS:
        plain = speculative_tokens(target, None, prompt, 20, kv_bits=8)
        got = speculative_tokens(target, draft, prompt, 20, num_draft=3, kv_bits=8, tree_topk=2)
        assert_greedy_equal(target, prompt, got, plain)


def test_prompt_lookup_finds_the_latest_continuation():
    drafter = PromptLookupDrafter(max_ngram=2)
    drafter.prefill([5, 1, 2, 7, 1, 2, 3, 9, 1, 2])
    assert drafter.lookup(3) == [3, 9, 1]


def test_prompt_lookup_candidates_are_distinct_longest_match_first():
    drafter = PromptLookupDrafter(max_ngram=2, max_candidates=4)
    drafter.prefill([5, 1, 2, 7, 1, 2, 3, 9, 2, 8, 1, 2])
    # "1 2" matches at 4 (-> 3 9) and 1 (-> 7 1); then "2" adds 8 (-> 8 1); 3 9 from "2" at 5 is a repeat.
    assert drafter.candidates(2) == [[3, 9], [7, 1], [8, 1]]


def test_prompt_lookup_falls_back_on_the_successor_table_only_without_a_match():
    successors = np.array([1, 2, 3, -1, 0, 4, 6, 7], dtype=np.int32)
    drafter = PromptLookupDrafter(successors=successors, fallback_tokens=3)
    drafter.prefill([5, 6])  # 6 never occurred before: 6 -> 6 -> 6 from the table
    assert drafter.propose(8, None).tokens.tolist() == [6, 6, 6]
    drafter.prefill([4, 0])  # 0 -> 1 -> 2 (fallback_tokens caps it at 3; num_tokens at 2)
    assert drafter.propose(2, None).tokens.tolist() == [1, 2]
    drafter.prefill([0, 2])  # 2 -> 3, and 3 has no successor: the chain stops
    assert drafter.propose(8, None).tokens.tolist() == [3]
    drafter.prefill([2, 7, 2])  # "2" occurred before: lookup wins
    assert drafter.propose(8, None).tokens.tolist() == [7, 2]
    bare = PromptLookupDrafter()
    bare.prefill([5, 6])
    assert bare.propose(8, None) is None  # no table, no match: plain decoding


def test_continuation_tree_merges_shared_prefixes_in_bfs_order():
    tokens, parents = continuation_tree([[3, 9, 4], [3, 7], [8]])
    # nodes: 1=3, 2=8 (depth 1); 3=9, 4=7 (depth 2, both under 3); 5=4 (depth 3, under 9)
    assert tokens == [3, 8, 9, 7, 4]
    assert parents == [-1, 0, 0, 1, 1, 3]
    assert TreeShape(tuple(parents)).path_to(5) == [1, 3, 5]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_prompt_lookup_tree_equals_plain_greedy(family):
    target = make_tiny(family, seed=0)
    prompt = [1, 2, 3, 1, 4, 1, 2, 5, 1, 4, 6, 1]
    expected = mlx_lm_greedy(target, prompt, 24)
    got = speculative_tokens(target, None, prompt, 24, num_draft=4, drafter=PromptLookupDrafter(max_candidates=3))
    assert_greedy_equal(target, prompt, got, expected)


def test_tree_cache_equals_plain_decoding_cache():
    target, draft = make_tiny("llama", seed=0), make_tiny("llama", seed=1)
    engines = []
    tokens = speculative_tokens(
        target,
        draft,
        PROMPTS[1],
        15,
        num_draft=3,
        tree_topk=2,
        sampling=SamplingConfig(1.0),
        seed=2,
        engine_out=engines,
    )
    fed = PROMPTS[1] + tokens[:-1]
    plain = make_prompt_cache(target)
    target(mx.array(fed)[None], cache=plain)
    for spec_layer, plain_layer in zip(engines[0].cache, plain):
        assert spec_layer.offset == plain_layer.offset == len(fed)
        for a, b in zip(spec_layer.state[:2], plain_layer.state[:2]):
            assert mx.allclose(a[..., : len(fed), :], b[..., : len(fed), :], atol=1e-5).item()


def tree_sample_counts(target, draft, make_drafter, prompt, length, sampling, runs):
    """Counts of the first `length` tokens over seeded runs; make_drafter() returns a drafter, or None for a
    top-3 draft-model tree."""
    counts = np.zeros([8] * length)
    for seed in range(runs):
        drafter = make_drafter()
        out = speculative_tokens(
            target,
            draft if drafter is None else None,
            prompt,
            length,
            num_draft=2,
            sampling=sampling,
            seed=seed,
            tree_topk=3,
            drafter=drafter,
        )
        counts[tuple(out)] += 1
    return counts


# All eight in the whole suite (18-56 s each on 2 cores), which CI runs after the quick run.
TREE_SOURCES = ["draft-tree", "prompt-lookup", "prompt-lookup-tree", "corpus-fallback"]
TREE_LAWS = [(SamplingConfig(1.0), "T1"), (SamplingConfig(0.7, top_p=0.9), "T0.7-top-p")]


@pytest.mark.parametrize(
    "sampling, source",
    [
        pytest.param(
            sampling,
            source,
            id=f"{source}-{name}",
            marks=pytest.mark.slow,
        )
        for sampling, name in TREE_LAWS
        for source in TREE_SOURCES
    ],
)
def test_tree_samples_follow_the_target_distribution(sampling, source):
    """Chi-square of 3000 seeded runs (3 tokens, vocab 8) against the enumerated law; false alarm 1e-3. The
    lookup tree's prompt gives "1" two different continuations, so its first step verifies a 4-node tree; the
    corpus-fallback prompt ends in a token never seen before, so its first draft comes from a successor table."""
    target = make_tiny("llama", seed=0, logit_scale=3.0)
    draft = make_tiny("llama", seed=5, logit_scale=3.0)
    prompt = {"prompt-lookup-tree": [1, 2, 3, 1, 4, 1], "corpus-fallback": [1, 2, 3, 4, 5]}.get(source, [1, 2, 1, 2, 1])
    length = 3
    successors = np.array([(3 * t + 1) % 8 for t in range(8)], dtype=np.int32)
    make = {
        "prompt-lookup": lambda: PromptLookupDrafter(),
        "prompt-lookup-tree": lambda: PromptLookupDrafter(max_candidates=3),
        "corpus-fallback": lambda: PromptLookupDrafter(successors=successors, fallback_tokens=2),
    }.get(source, lambda: None)
    counts = tree_sample_counts(target, draft, make, prompt, length, sampling, runs=3000)
    assert chi_square_pvalue(counts, exact_joint(target, prompt, sampling, length)) > ALPHA
    assert chi_square_pvalue(counts, exact_joint(draft, prompt, sampling, length)) < ALPHA


# Every family in the whole suite (15-50 s each on 2 cores).
@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tree_and_medusa_samples_follow_the_target_on_every_family(family):
    """Per family, at T=1: 1500 seeded runs (2 tokens, vocab 8) of a draft-model tree and of a Medusa tree, each
    chi-square tested against the enumerated law (false alarm 1e-3 each). The llama tests above add power checks."""
    from test_medusa import random_heads

    from mlxspec.drafting.heads.medusa import MedusaDrafter

    target = make_tiny(family, seed=0, logit_scale=3.0)
    draft = make_tiny(family, seed=5, logit_scale=3.0)
    heads = random_heads(target)
    sampling, prompt, length = SamplingConfig(1.0), [1, 2, 1], 2
    expected = exact_joint(target, prompt, sampling, length)
    for make in (lambda: None, lambda: MedusaDrafter(heads, target, tree_nodes=6, tree_topk=2)):
        counts = tree_sample_counts(target, draft, make, prompt, length, sampling, runs=1500)
        assert chi_square_pvalue(counts, expected) > ALPHA


def test_tree_ropes_are_installed_once_and_pass_through_outside_a_tree_pass():
    """The per-token RoPE wrappers are installed on the first tree pass and kept (not re-wrapped per pass); outside
    a pass they pass through, so a plain forward gives the same logits as the model mlx-lm built; the tree masks
    exist only during the pass."""
    from mlxspec.decoding.tree_attention import PerTokenRoPE

    model = make_tiny("llama")
    tokens = mx.array([[1, 2, 3, 4, 5]])
    plain_logits = model(tokens)

    def ropes():
        return [m["rope"] for _, m in model.named_modules() if isinstance(m, dict) and "rope" in m]

    shape = TreeShape((-1, 0, 0, 1))
    installed = None
    for _ in range(2):
        cache = make_speculative_cache(model, max_rollback=8)
        model(mx.array([[1, 2, 3]]), cache=cache)
        with tree_verification(model, cache, shape, 3):
            inside = ropes()
            assert inside and all(isinstance(r, PerTokenRoPE) for r in inside)
            model(mx.array([[4, 5, 6, 7]]), cache=cache)
        assert all("make_mask" not in vars(c) for c in cache)
        assert installed is None or [id(r) for r in ropes()] == installed  # the same wrappers: installed once
        installed = [id(r) for r in ropes()]
        assert not any(isinstance(r.inner, PerTokenRoPE) for r in ropes())  # never wrapped twice
    assert mx.array_equal(model(tokens), plain_logits).item()  # outside a pass they pass through


def test_a_tree_shape_refuses_parents_that_do_not_precede_their_children():
    with pytest.raises(AssertionError):
        TreeShape((-1, 2, 0))
    with pytest.raises(AssertionError):
        TreeShape((0, 0))


def test_chains_are_recognised_as_chains_and_trees_are_not():
    """Deterministic chains skip the tree machinery (a plain causal pass and a trim), so is_chain must be exact."""
    assert TreeShape.chain(4).is_chain and TreeShape((-1,)).is_chain
    assert not TreeShape((-1, 0, 0)).is_chain and not TreeShape((-1, 0, 1, 1)).is_chain


def test_rank_paths_get_their_prefixes_as_parents():
    from mlxspec.decoding.trees import caterpillar_parents, rank_paths_parents

    paths = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    assert rank_paths_parents(paths) == (-1, 0, 0, 1, 1, 2, 3)
    assert caterpillar_parents(3, 2) == (-1, 0, 0, 1, 1, 3, 3)
