"""The suffix cache shared across requests (drafting/lookup/suffix_index.py): a request repeating an earlier
answer drafts from it (drafts accepted, output exact), and the index stays within its budget."""

import pytest
from helpers import mlx_lm_greedy

import mlxspec
from mlxspec.drafting.lookup.suffix_index import SuffixIndex
from mlxspec.serve.openai_request import parse_request


def test_the_longest_match_drafts_the_most_frequent_continuation():
    index = SuffixIndex(budget_tokens=1000, max_ngram=4, min_ngram=2, min_share=0.5, depth_per_match=3)
    index.add([1, 2, 3, 4, 5, 6, 7])
    index.add([9, 3, 4, 5, 6, 8])
    index.add([0, 3, 4, 5, 6, 8])
    # "3 4 5" occurs three times; 6 follows all of them, then 8 in two of three (>= half) and 7 in one.
    assert index.continuation([7, 3, 4, 5], 10) == [6, 8]
    # The 4-gram "2 3 4 5" occurs once: it is the longest match, so its own continuation wins.
    index = SuffixIndex(budget_tokens=1000, max_ngram=4, min_ngram=2, min_share=0.5, depth_per_match=3)
    index.add([1, 2, 3, 4, 5, 6, 7])
    index.add([9, 3, 4, 5, 6, 8])
    assert index.continuation([1, 2, 3, 4], 10) == [5, 6, 7]
    # A short match drafts shallow: 2 matched tokens allow depth_per_match * 2 = 6 at most; 3 asked, 3 given.
    assert index.continuation([7, 7, 5, 6], 3) == [7]  # only "5 6" matches, and its continuations disagree
    assert index.continuation([8, 8, 8], 5) == []


def test_the_index_stays_within_its_budget_and_forgets_the_oldest():
    index = SuffixIndex(budget_tokens=100, max_ngram=3, min_ngram=2)
    for doc in range(50):
        index.add([1000 + doc, *range(doc, doc + 30)])
        assert index.tokens_kept <= 100
        assert index.entries <= 2 * index.live_entries_bound() + 2 * 31
    assert [1049, 49] not in [d[:2] for _, d in list(index.documents)[:-1]]
    assert index.continuation([1000, 0], 3) == []  # the first document is gone
    assert index.continuation([1049, 49, 50], 3) == [51, 52, 53]


@pytest.fixture(scope="module")
def embedded():
    return mlxspec.load()


def test_a_request_repeating_an_earlier_answer_drafts_from_it(embedded):
    """The same prompt twice, no prompt cache: the second answer repeats the first, which is in no prompt. Lookup
    alone finds little to copy; with the suffix cache it drafts the earlier answer, accepted, and stays exact. The draft
    length is fixed: with -k auto a measured cost curve decides how often to draft, which is not what this guards."""
    spec = embedded
    prompt = spec.encode("class Point:\n    def __init__(self, x, y):\n")
    expected = mlx_lm_greedy(spec.target.model, prompt, 40)
    options = dict(max_tokens=40, stop_at_eos=False, use_draft=False, lookup=True, corpus_fallback=False, num_draft=8)
    first = spec.generate(prompt, suffix=True, **options)
    alone = spec.generate(prompt, **options)
    again = spec.generate(prompt, suffix=True, **options)
    assert first.tokens == alone.tokens == again.tokens == expected
    assert again.stats.accepted >= 30 > alone.stats.accepted
    assert again.stats.target_calls < alone.stats.target_calls
    assert spec.suffix_index.tokens_kept <= spec.suffix_cache_tokens


def test_suffix_needs_lookup_and_a_request_may_ask_for_it():
    with pytest.raises(mlxspec.UserError, match="--lookup --suffix"):
        mlxspec.DecodeOptions(suffix=True).validate()
    body = {"messages": [{"role": "user", "content": "x"}], "speculative": {"suffix": True}}
    assert parse_request(body, "chat").changes == {"suffix": True, "lookup": True}
