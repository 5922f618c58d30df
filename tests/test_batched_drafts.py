"""Batched rows draft together: the greedy draft-model chains of a round's rows run as one compiled graph over their
stacked KV buffers (drafting/draft_model/batched.py). Each row's drafts equal its chain alone's, its draft cache is left
as its chain alone leaves it, and batched rows still decode exactly their solo runs with their drafts accepted."""

import mlx.core as mx
import pytest
from test_batching import PROMPTS

import mlxspec
from mlxspec import DecodeOptions
from mlxspec.decoding.sampling import SamplingConfig
from mlxspec.drafting.draft_model.batched import propose_rows
from mlxspec.drafting.draft_model.compiled import CompiledDraftChain
from mlxspec.drafting.draft_model.drafter import DraftModelDrafter


@pytest.fixture(scope="module")
def embedded():
    return mlxspec.load()


def test_rows_drafted_together_equal_each_chain_alone(embedded):
    """Rows of different histories (so different offsets and capacities) and 1-3 pending tokens each: the batched
    graph proposes what each chain proposes alone and leaves the same keys and values at the same offset."""
    model = embedded.draft.model
    histories = [embedded.encode(p) for p in PROMPTS[:3]]
    histories[2] = histories[2] * 20  # past the first capacity step: buffers of different capacities
    pending = [[11], [12, 13], [14, 15, 16]]

    def chains() -> list[CompiledDraftChain]:
        made = [CompiledDraftChain(model, SamplingConfig()) for _ in histories]
        for chain, history in zip(made, histories):
            chain.prefill(history)
        return made

    alone, together = chains(), chains()
    want = [chain.propose(p, 4, None)[0] for chain, p in zip(alone, pending)]
    got = propose_rows(model, together, pending, 4)
    assert got.shape == (3, 4)
    for b, (a, t) in enumerate(zip(alone, together)):
        assert got[b].tolist() == want[b].tolist()
        assert t.offset == a.offset and t.capacity == a.capacity
        for k_t, k_a in zip(t.keys + t.values, a.keys + a.values):
            assert mx.allclose(k_t[:, :, : t.offset], k_a[:, :, : a.offset], atol=1e-5).item()


def test_batched_greedy_rows_draft_together_decode_exactly_and_are_accepted(embedded, monkeypatch):
    """Four greedy rows at a fixed k: their drafts come from batched calls of several rows, every row equals its
    solo run token for token, and the batched drafts are accepted as well as the solo ones (within 10%)."""
    calls: list[int] = []
    original = DraftModelDrafter.propose_together.__func__

    def spy(cls, drafters, num_tokens):
        calls.append(len(drafters))
        return original(cls, drafters, num_tokens)

    monkeypatch.setattr(DraftModelDrafter, "propose_together", classmethod(spy))
    options = DecodeOptions(max_tokens=40, num_draft=3, stop_at_eos=False)
    solo = [embedded.generate(p, options) for p in PROMPTS[:4]]
    assert not calls  # alone, a row drafts by itself
    batch = embedded.generate_batch(PROMPTS[:4], options)
    assert [r.tokens for r in batch] == [r.tokens for r in solo]
    assert calls and max(calls) >= 3
    accepted = sum(r.stats.accepted for r in batch)
    assert accepted >= 0.9 * sum(r.stats.accepted for r in solo) and accepted > 0


def test_sampled_rows_draft_alone(embedded, monkeypatch):
    """A sampled draft's distribution enters the rejection step, so sampled rows keep drafting alone: a seeded
    sampled row then repeats its solo run token for token."""
    monkeypatch.setattr(DraftModelDrafter, "propose_together", None)  # must not be reached
    options = DecodeOptions(max_tokens=24, num_draft=3, stop_at_eos=False, temperature=0.8, seed=5)
    solo = [embedded.generate(p, options).tokens for p in PROMPTS[:3]]
    assert [r.tokens for r in embedded.generate_batch(PROMPTS[:3], options)] == solo
