"""Every drafter, on a case built to accept, really gets drafts accepted, and stays exact.

Exactness tests alone cannot catch a verifier that never accepts (its output is still the target's), so each test
here also asserts accepted > 0 and fewer target calls than tokens. A mutated verifier that always rejects, or
accepts one token fewer, fails them (see scripts/mutate_verifier.py).
"""

import math

import pytest
from helpers import mlx_lm_greedy

import mlxspec
from mlxspec.decoding.assembly import build_engine
from mlxspec.drafting.lookup.drafter import PromptLookupDrafter
from mlxspec.loading import MODELS_DIR
from mlxspec.options import DecodeOptions

# Repetitive code: the embedded target (trained on the stdlib) continues it, and every drafter has a chance.
CODE = (
    "def area(width, height):\n    return width * height\n\n\n"
    "def perimeter(width, height):\n    return 2 * (width + height)\n\n\n"
)
TOKENS = 48


@pytest.fixture(scope="module")
def embedded():
    spec = mlxspec.load()
    prompt = spec.encode(CODE * 3 + "def area(width, height):\n")
    return spec, prompt, mlx_lm_greedy(spec.target.model, prompt, TOKENS)


@pytest.fixture(scope="module")
def medusa(embedded):
    return mlxspec.load(medusa=MODELS_DIR / "medusa")


def assert_accepted_and_exact(result, expected):
    stats = result.stats
    assert result.tokens == expected
    assert stats.accepted > 0, f"{stats.mode}: no draft accepted"
    assert stats.target_calls < len(result.tokens), f"{stats.mode}: {stats.target_calls} calls for {len(result.tokens)}"


@pytest.mark.parametrize(
    "options, mode",
    [
        (dict(num_draft=4), "draft"),
        (dict(num_draft=4, tree_topk=2), "draft-tree-4x2"),
        (dict(use_draft=False, lookup=True, num_draft=8), "lookup"),
        (dict(use_draft=False, lookup=True, num_draft=8, lookup_candidates=3), "lookup-tree-3"),
        (dict(lookup=True, num_draft=4), "lookup+draft"),
    ],
)
def test_draft_model_and_lookup_drafts_are_accepted(embedded, options, mode):
    spec, prompt, expected = embedded
    result = spec.generate(prompt, max_tokens=TOKENS, stop_at_eos=False, **options)
    assert result.stats.mode == mode
    assert_accepted_and_exact(result, expected)


@pytest.mark.parametrize(
    "options, mode",
    [
        (dict(tree_topk=1), "medusa"),
        (dict(tree_topk=2), "medusa-tree-4x2"),
        (dict(lookup=True, num_draft=4), "lookup+medusa"),
    ],
)
def test_medusa_drafts_are_accepted(embedded, medusa, options, mode):
    _, prompt, expected = embedded
    result = medusa.generate(prompt, max_tokens=TOKENS, stop_at_eos=False, **options)
    assert result.stats.mode == mode
    assert_accepted_and_exact(result, expected)


def test_the_corpus_fallback_alone_gets_drafts_accepted(embedded):
    """Lookup that can never match (n-grams of 100 tokens) drafts only from the corpus bigram table."""
    spec, prompt, expected = embedded
    drafter = PromptLookupDrafter(min_ngram=100, max_ngram=100, successors=spec.drafting.corpus_successors())
    engine = build_engine(spec.target.model, drafter, DecodeOptions(num_draft=4))
    engine.prefill(prompt)
    tokens, accepted, drafted = [], 0, 0
    while len(tokens) < TOKENS:
        step = engine.step(TOKENS - len(tokens))
        tokens += step.tokens
        accepted, drafted = accepted + step.accepted, drafted + step.drafted
    assert tokens == expected
    assert drafted > 0 and accepted > 0 and engine.target_calls < TOKENS


@pytest.fixture(scope="module")
def self_draft(tiny_dirs):
    """The tiny target drafting for itself: its q equals the target's p, so every draft must be accepted."""
    return mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["target"])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("num_draft", [1, 3])
def test_a_self_drafted_chain_is_accepted_whole(self_draft, temperature, num_draft):
    result = self_draft.generate(
        "abc", max_tokens=20, temperature=temperature, seed=2, num_draft=num_draft, stop_at_eos=False
    )
    stats = result.stats
    assert len(result.tokens) == 20 and stats.accepted == stats.drafted > 0
    assert stats.target_calls == math.ceil(20 / (num_draft + 1))


def test_a_self_drafted_tree_accepts_its_whole_greedy_chain(self_draft):
    """A 3-deep 2-wide caterpillar: the greedy chain (3 nodes) is accepted every step, its 3 leaves never."""
    result = self_draft.generate("abc", max_tokens=20, num_draft=3, tree_topk=2, stop_at_eos=False)
    stats = result.stats
    assert stats.target_calls == 5 and stats.accepted == 3 * 5  # 4 tokens a step, 20 tokens
    assert stats.drafted == 6 * 5
    assert result.tokens == mlx_lm_greedy(self_draft.target.model, self_draft.encode("abc"), 20)


def test_self_draft_acceptance_holds_under_top_p_and_top_k(self_draft):
    result = self_draft.generate(
        "cab", max_tokens=16, temperature=0.8, top_p=0.9, top_k=4, seed=5, num_draft=3, stop_at_eos=False
    )
    assert len(result.tokens) == 16 and result.stats.accepted == result.stats.drafted > 0


@pytest.mark.slow  # 15-60 s on 2 cores: in the whole suite, not the quick run
def test_the_shipped_dflash_drafter_is_accepted_and_exact_on_held_out_code():
    """models/dflash on the embedded target, T=0, on held-out stdlib code it never trained on: drafts accepted and
    fewer target calls than tokens, every token the target's own greedy one, chains and a DDTree. (The issue's bar,
    more accepted than rejected, is not met: about 0.3 of drafts are accepted at k=3; see models/dflash/README.md.)"""
    from mlxspec.bench.runner import heldout_prompts

    spec = mlxspec.load(dflash=MODELS_DIR / "dflash")
    for prompt in heldout_prompts(spec.tokenizer, num_prompts=2, prompt_tokens=128):
        result = spec.generate(prompt, max_tokens=TOKENS, stop_at_eos=False, num_draft=3)
        assert result.stats.mode == "dflash"
        assert_accepted_and_exact(result, mlx_lm_greedy(spec.target.model, prompt, TOKENS))
        tree = spec.generate(prompt, max_tokens=TOKENS, stop_at_eos=False, num_draft=7, tree_topk=2, tree_nodes=12)
        assert tree.stats.mode == "dflash-tree-12n-beam2"
        assert_accepted_and_exact(tree, result.tokens)
