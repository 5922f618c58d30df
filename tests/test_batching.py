"""Continuous batching (batching.py, decoding/batch.py): every row exact on its own while others decode beside it.

- a batched forward gives each row the logits its forward alone gives, over rows of different lengths and inputs
  (the per-row mask and positions), and leaves each row's cache as a forward alone does;
- greedy rows equal their solo runs token for token, across prompt lengths, K, drafters and stop points;
- a sampled row's first tokens follow the target's law while other rows decode beside it (chi-square, with a
  power check against a wrong law);
- the caches a finished row leaves equal plain decoding's; a row whose drafter raises fails alone.
"""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache
from stats import ALPHA, chi_square_pvalue
from test_engine_exactness import exact_joint
from test_prompt_cache import assert_cache_equals_plain
from tiny import make_tiny

import mlxspec
from mlxspec import DecodeOptions
from mlxspec.batching import BatchRows
from mlxspec.decoding.batch import run_all
from mlxspec.decoding.forward import ForwardRequest, run_alone
from mlxspec.results import Stats


def test_a_batched_forward_gives_each_row_its_own_logits_and_cache():
    model = make_tiny("llama", seed=0, logit_scale=3.0)
    prompts, inputs = [[1, 2, 3], [4, 5, 6, 7, 1, 2], [3]], [[1, 2], [3], [4, 5, 6, 0]]
    batched_caches, alone_caches = (
        [make_prompt_cache(model) for _ in prompts],
        [make_prompt_cache(model) for _ in prompts],
    )
    for prompt, a, b in zip(prompts, batched_caches, alone_caches):
        model(mx.array(prompt)[None], cache=a)
        model(mx.array(prompt)[None], cache=b)
    replies = run_all([ForwardRequest(model, mx.array(x), c) for x, c in zip(inputs, batched_caches)])
    for x, a, b, (logits, _) in zip(inputs, batched_caches, alone_caches, replies):
        alone, _ = run_alone(ForwardRequest(model, mx.array(x), b))
        assert logits.shape == alone.shape and mx.allclose(logits, alone, atol=1e-5).item()
        assert a[0].offset == b[0].offset
        for la, lb in zip(a, b):  # the positions each holds (past them: padding a later write overwrites)
            for held, reference in ((la.keys, lb.keys), (la.values, lb.values)):
                assert mx.allclose(held[..., : la.offset, :], reference[..., : lb.offset, :], atol=1e-5).item()
    # Power: the same forward with one shared position and no per-row mask (what a batch without them computes).
    padded = mx.array([[1, 2, 0, 0], [3, 0, 0, 0], [4, 5, 6, 0]])
    shared = [make_prompt_cache(model) for _ in range(1)]
    model(mx.array([[1, 2, 3, 4, 5, 6]]), cache=shared[0])
    assert not mx.allclose(model(padded[:1], cache=shared[0])[0, :2], replies[0][0], atol=1e-3).item()


@pytest.fixture(scope="module")
def embedded():
    return mlxspec.load(prompt_cache=8)


PROMPTS = [
    "import os\n",
    "def main(argv):\n    parser = argparse.ArgumentParser(",
    "class Point:\n    def __init__(self, x, y):\n",
    "for i in range(10):\n",
    '"""Utilities for reading configuration files."""\n\nimport json\n',
]


@pytest.mark.slow  # 10-15 s on 2 cores: in the whole suite, not the quick run
def test_greedy_rows_equal_their_solo_runs(embedded):
    spec = embedded
    options = [
        DecodeOptions(max_tokens=40, num_draft=1, stop_at_eos=False),
        DecodeOptions(max_tokens=33, num_draft=4, stop_at_eos=False),
        DecodeOptions(max_tokens=40, use_draft=False, lookup=True, num_draft=6, stop_at_eos=False),
        DecodeOptions(max_tokens=40, stop=["\n\n"], stop_at_eos=False),  # adaptive k, a stop string
        DecodeOptions(max_tokens=40, num_draft=3, tree_topk=2, stop_at_eos=False),  # a tree: its forward alone
    ]
    # The solo runs on the same load: whether a draft can pay is decided from this load's timings (the compiled
    # chain is timed once per load), so a fresh load on a noisy machine may decide otherwise and decode plainly.
    solo = [spec.generate(p, o) for p, o in zip(PROMPTS, options)]
    spec.prompt_cache.clear()  # the batch starts cold, as the solo runs did
    batch = spec.generate_batch(PROMPTS, options)
    for got, want in zip(batch, solo):
        assert got.tokens == want.tokens and got.text == want.text and got.finish_reason == want.finish_reason
        assert got.stats.mode == want.stats.mode
    assert sum(r.stats.accepted for r in batch) > 0
    assert batch[3].finish_reason == solo[3].finish_reason


def test_the_caches_a_finished_row_leaves_equal_plain_decodings(embedded):
    spec = embedded
    spec.prompt_cache.clear()
    spec.generate_batch(PROMPTS[:3], DecodeOptions(max_tokens=20, num_draft=3, stop_at_eos=False))
    assert len(spec.prompt_cache.entries) == 3
    for entry in list(spec.prompt_cache.entries):
        spec.prompt_cache.entries = [entry]
        assert_cache_equals_plain(spec)


@pytest.mark.slow  # 70 s; the whole suite runs it
def test_a_sampled_row_follows_the_target_law_beside_other_rows(tiny_dirs):
    """2000 batches, each a sampled row (T=1, 3 tokens, vocab 8) beside a greedy row and a sampled row with
    another seed: the first row's counts against the enumerated law (false alarm 1e-3), and against the law of
    another prompt (power: must be rejected)."""
    spec = mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["draft"], num_draft=2)
    prompt, other, length = [1, 2, 1], [3, 3, 0, 1], 3
    counts = np.zeros([8] * length)
    for seed in range(2000):
        rows = [
            DecodeOptions(max_tokens=length, temperature=1.0, seed=seed, num_draft=2, stop_at_eos=False),
            DecodeOptions(max_tokens=5, temperature=0.0, num_draft=3, stop_at_eos=False),
            DecodeOptions(max_tokens=4, temperature=1.0, seed=seed + 10**6, num_draft=1, stop_at_eos=False),
        ]
        out = spec.generate_batch([prompt, other, other], rows)[0].tokens
        counts[tuple(out)] += 1
    target = spec.target.model
    sampling = rows[0].sampling
    assert chi_square_pvalue(counts, exact_joint(target, prompt, sampling, length)) > ALPHA
    assert chi_square_pvalue(counts, exact_joint(target, other, sampling, length)) < ALPHA


def test_a_row_whose_drafter_raises_fails_alone(embedded, monkeypatch):
    """The second row's draft model runs out of memory mid-decode: that row ends with the error, and the rows
    beside it finish with the tokens they give alone."""
    from mlxspec.drafting.draft_model.drafter import DraftModelDrafter

    spec = embedded
    options = DecodeOptions(max_tokens=24, num_draft=3, stop_at_eos=False)
    want = [spec.generate(p, options).tokens for p in PROMPTS[:3]]
    doomed = spec.encode(PROMPTS[1])
    original = DraftModelDrafter.propose

    original_together = DraftModelDrafter.propose_together.__func__

    def is_doomed(drafter) -> bool:
        return list(drafter.history[: len(doomed)]) == doomed and len(drafter.history) > len(doomed) + 4

    def propose(self, *args):
        if is_doomed(self):
            raise MemoryError("out of memory")
        return original(self, *args)

    def propose_together(cls, drafters, num_tokens):  # the rows' greedy chains drafted together (batched_draft.py)
        if any(is_doomed(d) for d in drafters):
            raise MemoryError("out of memory")
        return original_together(cls, drafters, num_tokens)

    monkeypatch.setattr(DraftModelDrafter, "propose", propose)
    monkeypatch.setattr(DraftModelDrafter, "propose_together", classmethod(propose_together))
    rows = BatchRows()
    added = [rows.add(spec.events(p, options, Stats(), rows.count), Stats()) for p in PROMPTS[:3]]
    while rows.rows:
        rows.round()
    assert isinstance(added[1].error, MemoryError) and len(added[1].tokens) > 4
    assert added[0].tokens == want[0] and added[2].tokens == want[2]
    assert added[0].error is None and added[2].error is None
    with pytest.raises(MemoryError):
        spec.generate_batch(PROMPTS[:3], options)


def test_hybrid_target_rows_reject_at_different_depths_and_stay_exact(tmp_path):
    """A Qwen3.5-style hybrid (recurrent and attention layers): its rows roll back by their own snapshots and
    replay (their forwards run alone beside the batch); every row equals its solo run."""
    from tiny import save_tiny_model_dir

    target_dir = save_tiny_model_dir(tmp_path / "target", "qwen3_5")
    draft_dir = save_tiny_model_dir(tmp_path / "draft", "qwen3_5", seed=1)
    spec = mlxspec.load(target_dir, draft=draft_dir)
    prompts = [[1, 2, 3, 4], [5, 0, 5, 0, 5, 0, 2], [6, 1]]
    options = [DecodeOptions(max_tokens=14, num_draft=k, stop_at_eos=False) for k in (1, 3, 5)]
    solo = [spec.generate(p, o) for p, o in zip(prompts, options)]
    batch = spec.generate_batch(prompts, options)
    assert [r.tokens for r in batch] == [r.tokens for r in solo]
    assert len({r.stats.accepted for r in batch}) > 1  # the rows kept different numbers of drafts


def _knee_curve(knee: int = 8):
    """Verification flat up to `knee` tokens, then linear: one row verifies that many tokens for the price of one,
    while `knee` rows already fill the flat part with one token each."""
    from mlxspec.decoding.costs import CostCurve

    return CostCurve({n: 0.010 * max(1, n / knee) for n in (1, 2, 4, 8, 16, 32, 64)}, 0.0002, 256, "test")


def test_the_draft_length_shrinks_as_the_batch_fills_and_stops_where_it_cannot_pay():
    from mlxspec.decoding.costs import best_draft_length
    from mlxspec.decoding.draft_length import DraftLengthController

    curve = _knee_curve()
    lengths = [best_draft_length(curve, 0.8, 7, rows) for rows in (1, 2, 4, 8)]
    assert lengths[0] == 7 and lengths[-1] == 0
    assert all(a >= b for a, b in zip(lengths, lengths[1:])) and len(set(lengths)) > 2
    controller = DraftLengthController(curve, 7, prior_alpha=0.8, pause=True)
    assert controller.next_length(1) == 7 and 0 < controller.next_length(2) < 7
    at_eight = [controller.next_length(8) for _ in range(16)]
    assert at_eight.count(0) >= 14 and max(at_eight) <= 1  # paused at 8 rows, a one-token probe now and then
    assert controller.next_length(1) == 7  # alone again: drafting resumes at once


def test_a_full_batch_drafts_less_and_stays_exact(embedded, monkeypatch):
    """Adaptive rows on a curve flat to 4 tokens, where 5 rows leave no room for drafts: the batched rows mostly
    decode plainly (only the pause's probes draft), their stats say how many rows they shared, and every row
    equals its solo run; the same rows alone draft every step."""
    from mlxspec.decoding.draft_length import DraftLengthController

    spec = embedded
    monkeypatch.setattr(
        type(spec.drafting),
        "draft_length_controller",
        lambda self, max_draft, **kwargs: DraftLengthController(_knee_curve(4), max_draft, prior_alpha=0.8, pause=True),
    )
    options = DecodeOptions(max_tokens=32, stop_at_eos=False)  # adaptive k
    solo = [spec.generate(p, options) for p in PROMPTS]
    batch = spec.generate_batch(PROMPTS, options)
    assert [r.tokens for r in batch] == [r.tokens for r in solo]
    assert all(r.stats.batch_rows == 1.0 for r in solo) and all(r.stats.batch_rows > 3 for r in batch)
    assert sum(r.stats.drafted for r in solo) > 3 * sum(r.stats.drafted for r in batch)
    assert sum(r.stats.target_calls for r in batch) > sum(r.stats.target_calls for r in solo)


def test_through_the_kernels_attention_each_row_attends_alone_without_the_stacked_copy(monkeypatch):
    """With the target routed through the verify kernel, the batched view's rows attend row by row to their own
    keys (kernels/attention.py, per_row): every row's logits equal its forward alone bit for bit, and the padded,
    stacked keys are never what attends."""
    from mlxspec.kernels import attention
    from mlxspec.kernels import verify as verify_kernel

    backend, status = verify_kernel.resolve("on")
    if backend is None:
        pytest.skip(f"the verify kernel is {status}")
    model = verify_kernel.routed_view(make_tiny("llama", seed=0, logit_scale=3.0), backend)
    calls = []
    original = attention.KernelAttention.per_row
    monkeypatch.setattr(attention.KernelAttention, "per_row", lambda self, *a: calls.append(1) or original(self, *a))
    prompts, inputs = [[1, 2, 3], [4, 5, 6, 7, 1, 2], [3]], [[1, 2], [3], [4, 5, 6, 0]]
    batched, alone = [make_prompt_cache(model) for _ in prompts], [make_prompt_cache(model) for _ in prompts]
    for prompt, a, b in zip(prompts, batched, alone):
        model(mx.array(prompt)[None], cache=a)
        model(mx.array(prompt)[None], cache=b)
    replies = run_all([ForwardRequest(model, mx.array(x), c) for x, c in zip(inputs, batched)])
    assert len(calls) == len(model.layers)  # one per layer: every layer attended row by row
    for x, b, (logits, _) in zip(inputs, alone, replies):
        single, _ = run_alone(ForwardRequest(model, mx.array(x), b))
        assert mx.array_equal(logits, single).item()


def test_the_governor_runs_the_faster_mode_for_a_batch_and_keeps_probing_the_other():
    """Windows of rounds timed by batch size: drafting is tried first, then plain; the faster runs, with a probe of
    the other every few windows; one row alone is never governed; a window's first round is not timed."""
    from mlxspec.batching import PROBE_EVERY_WINDOWS, WINDOW_ROUNDS, DraftingGovernor

    governor = DraftingGovernor()
    speed = {True: 10.0, False: 25.0}  # tokens per second of drafting and plain rounds
    modes = []
    for _ in range(WINDOW_ROUNDS * PROBE_EVERY_WINDOWS * 3):
        mode = governor.allows(8)
        modes.append(mode)
        governor.observe(int(speed[mode] * 10), 10.0 if governor.round_in_window > 1 else 1000.0)
    windows = modes[::WINDOW_ROUNDS]
    assert windows[:2] == [True, False]  # drafting measured first, then plain
    assert windows[2:].count(False) > windows[2:].count(True) and True in windows[2:]  # plain wins, probes draft
    assert governor.rates[(8, False)] == pytest.approx(25.0) and governor.rates[(8, True)] == pytest.approx(10.0)
    assert all(governor.allows(1) for _ in range(20))  # alone: its own controller decides
