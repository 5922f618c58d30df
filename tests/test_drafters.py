"""The compiled draft chain proposes what the eager draft model proposes, step after step, on every family."""

import mlx.core as mx
import pytest
from tiny import FAMILIES, make_tiny

from mlxspec.decoding.sampling import SamplingConfig
from mlxspec.drafting.draft_model.compiled import StaticKVCache, supports_compiled_draft
from mlxspec.drafting.draft_model.drafter import DraftModelDrafter

PROMPT = [1, 2, 3, 4, 5, 6, 0, 1, 2]


def drive(drafter: DraftModelDrafter, sampling: SamplingConfig, steps: int = 5, num_draft: int = 3):
    """Propose, then commit a varying number of the drafted tokens plus one new token, as the engine would (the
    history is the engine's: the drafter reads it)."""
    history = list(PROMPT)
    drafter.prefill(history)
    key = mx.random.key(7)
    proposals = []
    for step in range(steps):
        key, draft_key = mx.random.split(key)
        # a drafter gets one key per depth (the engine's: its output positions' keys, decoding/keys.py)
        draft = drafter.propose(num_draft, None if sampling.greedy else mx.random.split(draft_key, num_draft))
        tokens = draft.tokens.tolist()
        proposals.append((tokens, None if draft.probs is None else draft.probs))
        keep = step % (num_draft + 1)  # 0, 1, 2, 3 (all) accepted, then again
        chain = [tokens[i - 1] for i in drafter._chain_nodes]
        # The engine's next token never repeats a rejected draft token (the residual excludes it).
        new_token = (chain[keep] + 1) % 8 if keep < len(chain) else step % 8
        history.extend(chain[:keep] + [new_token])
        drafter.accept(chain[:keep] + [new_token], tokens)
    return proposals


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize(
    "sampling, topk", [(SamplingConfig(), 1), (SamplingConfig(), 2), (SamplingConfig(0.8, top_p=0.9), 1)]
)
def test_compiled_chain_matches_the_eager_draft(family, sampling, topk):
    draft = make_tiny(family, seed=1, sliding_window=4) if family == "gemma3_text" else make_tiny(family, seed=1)
    assert supports_compiled_draft(draft)
    compiled = DraftModelDrafter(draft, sampling, 3, tree_topk=topk)
    eager = DraftModelDrafter(draft, sampling, 3, tree_topk=topk, compiled=False)
    assert compiled.compiled is not None and eager.compiled is None
    for (got, got_q), (want, want_q) in zip(drive(compiled, sampling), drive(eager, sampling)):
        assert got == want
        if want_q is not None:  # sampled chains also hand over the distributions they drew from
            assert mx.allclose(got_q, want_q, atol=1e-5).item()


def test_windowed_or_quantized_draft_caches_run_eagerly():
    draft = make_tiny("llama", seed=1, hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
    assert DraftModelDrafter(draft, SamplingConfig(), 3, kv_window=8).compiled is None
    assert DraftModelDrafter(draft, SamplingConfig(), 3, kv_bits=8).compiled is None


def test_static_cache_mask_is_exact():
    keys = mx.zeros((1, 1, 6, 2))
    cache = StaticKVCache(keys, keys, mx.array(2, dtype=mx.int32))
    expected = [
        [True, True, True, False, False, False],
        [True, True, True, True, False, False],
    ]
    assert cache.make_mask(2).tolist() == expected
    windowed = [
        [False, True, True, False, False, False],
        [False, False, True, True, False, False],
    ]
    assert cache.make_mask(2, window_size=2).tolist() == windowed


def test_compiled_draft_grows_past_its_first_capacity():
    """A long history crosses a 256-position capacity step; proposals still equal the eager draft's."""
    draft = make_tiny("llama", seed=1, max_position_embeddings=1024)
    prompt = [i % 7 for i in range(300)]
    compiled, eager = (DraftModelDrafter(draft, SamplingConfig(), 4, compiled=c) for c in (True, False))
    histories = {id(d): list(prompt[:250]) for d in (compiled, eager)}
    for drafter in (compiled, eager):
        drafter.prefill(histories[id(drafter)])
    for start in range(250, 290, 5):
        outs = []
        for drafter in (compiled, eager):
            tokens = drafter.propose(4, None).tokens.tolist()
            histories[id(drafter)].extend(prompt[start : start + 5])
            drafter.accept(prompt[start : start + 5], tokens)
            outs.append(tokens)
        assert outs[0] == outs[1]
    assert compiled.compiled.capacity == 512


def test_drafters_of_one_model_share_traces_and_new_weights_trace_anew():
    """A compiled chain holds the weights it was traced with: drafters on the same model share it, and after
    `update` the next drafter drafts with the new weights, as a fresh model with those weights does."""
    draft, other = make_tiny("llama", seed=1), make_tiny("llama", seed=2)
    first = DraftModelDrafter(draft, SamplingConfig(), 3)
    assert DraftModelDrafter(draft, SamplingConfig(), 3).compiled._chain is first.compiled._chain
    before = drive(first, SamplingConfig())
    draft.update(other.parameters())
    after = drive(DraftModelDrafter(draft, SamplingConfig(), 3), SamplingConfig())
    assert [t for t, _ in after] == [
        t for t, _ in drive(DraftModelDrafter(other, SamplingConfig(), 3), SamplingConfig())
    ]
    assert [t for t, _ in after] != [t for t, _ in before]


def test_the_compiled_chain_cache_is_bounded_and_keeps_the_recent_settings():
    """A server whose requests vary temperature or top-p must not keep one compiled chain per setting forever: the
    cache keeps the MAX_CHAINS most recently used, and a setting that was dropped traces anew and drafts the same."""
    from mlxspec.drafting.draft_model.compiled import MAX_CHAINS

    draft = make_tiny("llama", seed=1)
    settings = [SamplingConfig(0.5 + 0.05 * i, top_p=0.9) for i in range(MAX_CHAINS + 5)]
    first = drive(DraftModelDrafter(draft, settings[0], 3), settings[0], steps=2)
    for sampling in settings[1:]:
        DraftModelDrafter(draft, sampling, 3)
    chains = draft.__dict__["_mlxspec_compiled_chains"]
    assert len(chains) == MAX_CHAINS
    kept = {key[0] for key in chains}
    assert kept == set(settings[-MAX_CHAINS:])  # the least recently used went first
    again = drive(DraftModelDrafter(draft, settings[0], 3), settings[0], steps=2)  # traced anew
    assert [t for t, _ in again] == [t for t, _ in first]
    assert all(mx.allclose(a, b).item() for (_, a), (_, b) in zip(again, first))
    # Using a kept setting moves it to the most recent end instead of tracing it again.
    oldest_kept = next(iter(chains))
    DraftModelDrafter(draft, oldest_kept[0], 3)
    assert next(reversed(chains)) == oldest_kept and len(chains) == MAX_CHAINS


def test_every_drafters_adaptive_length_pauses_where_drafting_cannot_pay(tiny_dirs):
    """-k auto decodes plainly (with a probe every few steps) wherever no draft length pays, for a draft model as for
    block drafters: a draft token a step that is rarely accepted cost the embedded default 5-13% against plain."""
    import mlxspec

    speculator = mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["target"])
    assert speculator.drafting.draft_length_controller(4).pause
    assert speculator.drafting.draft_length_controller(4, with_draft=False).pause
