"""Prompt-cache reuse (mlxspec/prompt_cache.py): a conversation resent turn after turn prefills only what the kept
caches lack, and every turn's output is the one a cold run gives, with the kept target cache equal to plain
decoding's and the kept drafter still drafting what the target accepts."""

import mlx.core as mx
import pytest
from helpers import assert_greedy_equal, mlx_lm_greedy
from mlx_lm.models.cache import make_prompt_cache
from test_feature_heads import copying_head
from tiny import save_tiny_model_dir

import mlxspec
from mlxspec.api import Speculator
from mlxspec.cache.recurrent import is_recurrent, leaf_caches
from mlxspec.decoding.prompt_cache import target_points
from mlxspec.loading import load_model

FIRST = [1, 2, 3, 4, 5, 0, 5]


def test_target_points_for_attention_caches_reach_any_prefix():
    held = [1, 2, 3, 4, 5, 6]
    # The common prefix of held[:5] and the prompt is 3 tokens; an attention cache trims to it.
    assert target_points(held, 5, [1, 2, 3, 9, 9], None, recurrent=False) == [3, 0]
    # At most len(prompt) - 1: the last prompt token is fed with the first draft.
    assert target_points(held, 5, [1, 2, 3], None, recurrent=False) == [2, 0]
    assert target_points(held, 5, [7, 2], None, recurrent=False) == [0, 0]
    # A drafter reading the target's features keeps 2 rows: the target keeps as many.
    assert target_points(held, 5, [1, 2, 3, 9, 9], None, recurrent=False, limit=2) == [2, 0]


def test_target_points_for_recurrent_caches_are_the_whole_state_or_the_prompt_snapshot():
    held = [1, 2, 3, 4, 5, 6]
    # The new prompt extends all 5 held tokens: the live state is reused whole.
    assert target_points(held, 5, [1, 2, 3, 4, 5, 6, 7], 2, recurrent=True) == [5, 2, 0]
    # It diverges after token 4: only the snapshot after the last prompt's prefill (2 tokens) is reachable.
    assert target_points(held, 5, [1, 2, 3, 4, 9, 9], 2, recurrent=True) == [2, 0]
    # It diverges before the snapshot: recompute.
    assert target_points(held, 5, [1, 9, 3, 4, 5, 6, 7], 2, recurrent=True) == [0]
    assert target_points(held, 5, [1, 2, 3, 4, 5, 6, 7], 2, recurrent=True, limit=4) == [2, 0]


def conversation(spec, turns=3, **options):
    """Turn after turn, prompt = last prompt + its answer + two new tokens; yields (prompt, result)."""
    prompt = list(FIRST)
    for turn in range(turns):
        result = spec.generate(prompt, **options)
        yield prompt, result
        prompt = prompt + result.tokens + [turn % 7, (turn + 3) % 7]


def assert_cache_equals_plain(spec):
    """The kept target cache (settled) against mlx-lm feeding the same tokens in one forward."""
    engine = spec.prompt_cache.latest  # kept settled: the cache holds history[:position]
    fed = engine.history[: engine.position]
    model = spec.target.model
    plain = make_prompt_cache(model)
    model(mx.array(fed)[None], cache=plain)
    for kept, reference in zip(leaf_caches(engine.cache), leaf_caches(plain), strict=True):
        if is_recurrent(kept):
            for a, b in zip(kept.cache, reference.cache):
                assert mx.allclose(a, b, atol=1e-4).item()
        else:
            assert kept.offset == len(fed)
            stored = kept.offset - getattr(kept, "start", 0)  # a window cache stores its last entries only
            for a, b in zip(kept.state[:2], reference.state[:2]):
                assert mx.allclose(a[..., :stored, :], b[..., len(fed) - stored : len(fed), :], atol=1e-4).item()


@pytest.fixture(scope="module", params=["llama", "qwen3_5", "gemma3_text"])
def family_dirs(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    family = request.param
    return family, save_tiny_model_dir(root / "target", family), save_tiny_model_dir(root / "draft", family, seed=1)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_each_turn_equals_a_cold_run_and_reuses_the_conversation(family_dirs, temperature):
    family, target_dir, draft_dir = family_dirs
    warm = mlxspec.load(target_dir, draft=draft_dir, num_draft=3, prompt_cache=1)
    cold = mlxspec.load(target_dir, draft=draft_dir, num_draft=3)
    hows, accepted = [], 0
    for turn, (prompt, result) in enumerate(
        conversation(warm, max_tokens=12, temperature=temperature, seed=5, stop_at_eos=False)
    ):
        reference = cold.generate(prompt, max_tokens=12, temperature=temperature, seed=5, stop_at_eos=False)
        if temperature == 0:
            assert_greedy_equal(warm.target.model, prompt, result.tokens, mlx_lm_greedy(warm.target.model, prompt, 12))
        assert result.tokens == reference.tokens
        hows.append(result.stats.prompt_cache)
        accepted += result.stats.accepted
        if turn > 0:  # the last prompt and its answer, but the answer's last token: it was pending, never fed
            assert result.stats.reused_tokens == len(prompt) - 3 or result.stats.prompt_cache == "recomputed"
            assert result.stats.prompt_tokens == len(prompt)
        assert_cache_equals_plain(warm)
    assert hows[0] == "cold"
    assert hows[1:] == ["prefix", "prefix"]
    assert accepted > 0  # the kept draft model still drafts what the target accepts


def test_a_recurrent_target_restores_the_prompt_snapshot_or_recomputes(tmp_path):
    target_dir = save_tiny_model_dir(tmp_path / "target", "qwen3_5")
    draft_dir = save_tiny_model_dir(tmp_path / "draft", "qwen3_5", seed=1)
    spec = mlxspec.load(target_dir, draft=draft_dir, num_draft=3, prompt_cache=1)
    first = spec.generate(FIRST, max_tokens=10, stop_at_eos=False)
    again = spec.generate(FIRST, max_tokens=10, stop_at_eos=False)  # regenerate: shares the prompt, not the answer
    assert (again.stats.prompt_cache, again.stats.reused_tokens) == ("snapshot", len(FIRST) - 1)
    assert again.tokens == first.tokens
    assert_cache_equals_plain(spec)
    edited = [FIRST[0], 6, *FIRST[2:]]
    result = spec.generate(edited, max_tokens=10, stop_at_eos=False)
    assert (result.stats.prompt_cache, result.stats.reused_tokens) == ("cold", 0)
    assert_greedy_equal(spec.target.model, edited, result.tokens, mlx_lm_greedy(spec.target.model, edited, 10))


def test_an_edited_turn_trims_to_the_common_prefix(tiny_dirs):
    spec = mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["draft"], num_draft=3, prompt_cache=1)
    spec.generate(FIRST, max_tokens=8)
    edited = FIRST[:3] + [6, 6]
    result = spec.generate(edited, max_tokens=8)
    assert (result.stats.prompt_cache, result.stats.reused_tokens) == ("prefix", 3)
    assert (
        result.tokens
        == mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["draft"]).generate(edited, max_tokens=8).tokens
    )
    assert_cache_equals_plain(spec)


def test_other_drafting_options_keep_the_target_cache_and_other_cache_shapes_start_cold(tiny_dirs):
    spec = mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["draft"], num_draft=3, prompt_cache=1)
    prompt = FIRST
    for changes, how in [({}, "cold"), ({"temperature": 0.5}, "prefix"), ({"num_draft": 5}, "cold"), ({}, "cold")]:
        result = spec.generate(prompt, max_tokens=6, seed=1, **changes)
        assert result.stats.prompt_cache == how, changes
        prompt = prompt + result.tokens + [2]


def test_a_run_that_fails_mid_step_leaves_nothing_to_reuse(tiny_dirs, monkeypatch):
    spec = mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["draft"], num_draft=3, prompt_cache=1)
    first = spec.generate(FIRST, max_tokens=6)
    drafter = spec.prompt_cache.latest.drafter
    monkeypatch.setattr(drafter, "propose", lambda *a: (_ for _ in ()).throw(MemoryError("out of memory")))
    prompt = FIRST + first.tokens + [1]
    with pytest.raises(MemoryError):
        spec.generate(prompt, max_tokens=6)
    monkeypatch.undo()
    result = spec.generate(prompt, max_tokens=6)
    assert result.stats.prompt_cache == "cold"
    assert (
        result.tokens
        == mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["draft"]).generate(prompt, max_tokens=6).tokens
    )


def test_a_feature_head_keeps_its_rows_aligned_across_turns(tmp_path):
    """The copying head drafts right only if its rows, tokens and positions line up with the target's; after reuse
    it resumes from the kept rows and the target recomputes the features past them."""
    target = load_model(save_tiny_model_dir(tmp_path / "one_layer", num_hidden_layers=1))
    target.model.config = target.config
    spec = Speculator(target, feature_head=copying_head(target.model), prompt_cache=1)
    cold = Speculator(target, feature_head=copying_head(target.model))
    for turn, (prompt, result) in enumerate(conversation(spec, turns=3, max_tokens=16, num_draft=3)):
        reference = cold.generate(prompt, max_tokens=16, num_draft=3)
        assert result.tokens == reference.tokens
        # The same drafts as a cold run's, so the same acceptance: a row out of line would change what it drafts.
        assert (result.stats.drafted, result.stats.accepted) == (reference.stats.drafted, reference.stats.accepted)
        assert result.stats.accepted >= 0.5 * result.stats.drafted > 0
        if turn > 0:
            assert result.stats.prompt_cache == "prefix" and result.stats.reused_tokens > len(prompt) // 2


def test_a_feature_head_drafts_from_the_first_step_after_a_cache_hit(tmp_path):
    """A regenerated turn reuses all of its prompt the cache holds but one row, which the target recomputes so the
    head has the features to draft from at once: the same drafts and acceptance as a cold run (a head given no
    features decodes its first step plainly, drafting fewer)."""
    target = load_model(save_tiny_model_dir(tmp_path / "one_layer", num_hidden_layers=1))
    target.model.config = target.config
    spec = Speculator(target, feature_head=copying_head(target.model), prompt_cache=1)
    cold = Speculator(target, feature_head=copying_head(target.model))
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1]
    spec.generate(prompt, max_tokens=12, num_draft=3)
    again = spec.generate(prompt, max_tokens=12, num_draft=3)
    reference = cold.generate(prompt, max_tokens=12, num_draft=3)
    assert (again.stats.prompt_cache, again.stats.reused_tokens) == ("prefix", len(prompt) - 2)
    assert again.tokens == reference.tokens
    assert (again.stats.drafted, again.stats.accepted) == (reference.stats.drafted, reference.stats.accepted) > (0, 0)


def test_a_sliding_window_that_dropped_the_prefix_recomputes(tmp_path):
    """gemma3's window cache keeps window + slack entries, dropping older ones in chunks of 256: past that, an
    earlier cut cannot be trimmed back to, so the prompt is prefilled again (and the output stays exact)."""
    target_dir = save_tiny_model_dir(tmp_path / "gemma3", "gemma3_text")
    spec = mlxspec.load(target_dir, draft=target_dir, num_draft=3, prompt_cache=1)
    long_prompt = [(i * 5 + i // 7) % 7 for i in range(300)]
    spec.generate(long_prompt, max_tokens=4)
    kept = [c for c in leaf_caches(spec.prompt_cache.latest.cache) if getattr(c, "start", 0) > 0]
    assert kept, "the window cache has dropped entries"
    edited = long_prompt[:100] + [6, 6, 6]
    result = spec.generate(edited, max_tokens=8, stop_at_eos=False)
    assert (result.stats.prompt_cache, result.stats.reused_tokens) == ("recomputed", 0)
    assert_greedy_equal(spec.target.model, edited, result.tokens, mlx_lm_greedy(spec.target.model, edited, 8))
    assert_cache_equals_plain(spec)


def test_interleaved_conversations_each_continue_their_own_cache(tiny_dirs):
    """Two clients take turns; with room for both, each second turn reuses its own conversation's cache."""
    a, b = FIRST, [6, 5, 4, 3, 2, 1, 0]
    for capacity, how in ((2, "prefix"), (1, "cold")):
        spec = mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["draft"], num_draft=3, prompt_cache=capacity)
        first_a = spec.generate(a, max_tokens=6, stop_at_eos=False)
        spec.generate(b, max_tokens=6, stop_at_eos=False)
        again = a + first_a.tokens + [3]
        result = spec.generate(again, max_tokens=6, stop_at_eos=False)
        assert result.stats.prompt_cache == how
        assert result.stats.reused_tokens == (len(again) - 2 if how == "prefix" else 0)
        cold = mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["draft"], num_draft=3)
        assert result.tokens == cold.generate(again, max_tokens=6, stop_at_eos=False).tokens
    with pytest.raises(mlxspec.UserError, match="prompt_cache -1"):
        mlxspec.load(tiny_dirs["target"], prompt_cache=-1)


def test_conversations_sharing_only_a_template_prefix_do_not_evict_each_other(tiny_dirs):
    """x and y share only a chat template's first tokens. With room for four, y starts from a copy of that prefix
    and x's entry stays whole, so x's and then y's next turns each reuse all their conversation holds; every turn
    equals a cold run, and every kept cache equals plain decoding's."""
    template = [1, 2, 3]
    x, y = template + [4, 5, 0], template + [6, 6, 5]
    spec = mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["draft"], num_draft=3, prompt_cache=4)
    cold = mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["draft"], num_draft=3)
    first_x = spec.generate(x, max_tokens=6, stop_at_eos=False)
    first_y = spec.generate(y, max_tokens=6, stop_at_eos=False)
    assert (first_y.stats.prompt_cache, first_y.stats.reused_tokens) == ("prefix", len(template))
    assert first_y.tokens == cold.generate(y, max_tokens=6, stop_at_eos=False).tokens
    assert_cache_equals_plain(spec)
    for prompt, first in ((x, first_x), (y, first_y)):
        again = prompt + first.tokens + [3]
        result = spec.generate(again, max_tokens=6, stop_at_eos=False)
        assert (result.stats.prompt_cache, result.stats.reused_tokens) == ("prefix", len(again) - 2)
        assert result.tokens == cold.generate(again, max_tokens=6, stop_at_eos=False).tokens
        assert_cache_equals_plain(spec)
    assert len(spec.prompt_cache.entries) == 2  # each conversation's latest turn; the copies' sources moved on


def test_interleaved_streams_with_a_prompt_cache_stay_exact():
    """A second stream started while the first still steps must not take the first's live caches: each stream holds
    its caches alone until it ends (the second starts cold), and both give what a cold run gives."""
    spec = mlxspec.load(prompt_cache=2)  # the embedded target and draft
    cold = mlxspec.load()
    prompt = "def fibonacci(n):"
    options = dict(max_tokens=24, stop_at_eos=False)
    expected = cold.generate(prompt, **options).tokens
    first = spec.stream(prompt, **options)
    opened = next(first)  # A has prefilled and stepped
    second = spec.generate(prompt, **options)  # B shares A's whole prompt: the old cache handed it A's live one
    assert second.stats.prompt_cache == "cold"
    assert second.tokens == expected
    assert opened.tokens + [t for chunk in first for t in chunk.tokens] == expected
    # Both kept their caches when they ended: the next run continues one and is still exact.
    third = spec.generate(prompt, **options)
    assert third.stats.prompt_cache == "prefix" and third.stats.reused_tokens > 0
    assert third.tokens == expected
    assert len(spec.prompt_cache.entries) == 2


def test_a_stream_closed_early_keeps_its_caches_for_the_next_run():
    """A client that stops reading (the stream closed between steps) leaves its state, settled, for the next run."""
    spec = mlxspec.load(prompt_cache=1)
    prompt = "import os\n"
    stream = spec.stream(prompt, max_tokens=24, stop_at_eos=False)
    produced = next(stream).tokens
    stream.close()
    state = spec.prompt_cache.latest
    assert state is not None and state.history[len(state.history) - len(produced) :] == produced
    result = spec.generate(prompt, max_tokens=12, stop_at_eos=False)
    assert result.stats.prompt_cache == "prefix"
    assert result.tokens == mlxspec.load().generate(prompt, max_tokens=12, stop_at_eos=False).tokens
