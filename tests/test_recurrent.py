"""Targets and drafts whose layers keep recurrent state: mamba (every layer an SSM) and qwen3_5 (a gated-DeltaNet
layer, then a full-attention one, like Qwen3.5/3.6). They roll back by snapshot and deferred replay
(mlxspec/recurrent.py); the output must be the target's own, token for token and in distribution, with drafts really
accepted and rejected, and the target cache must end where plain decoding's does."""

import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest
from helpers import mlx_lm_greedy, speculative_tokens
from mlx_lm.models.cache import make_prompt_cache
from stats import ALPHA, chi_square_pvalue
from test_engine_exactness import exact_joint
from tiny import make_tiny, save_tiny_model_dir

import mlxspec
import mlxspec.decoding.engine as engine_module
from mlxspec.cache.recurrent import leaf_caches
from mlxspec.decoding.assembly import build_engine
from mlxspec.decoding.sampling import SamplingConfig
from mlxspec.drafting.draft_model.drafter import DraftModelDrafter
from mlxspec.options import DecodeOptions

HYBRID = "qwen3_5"
PROMPTS = [[1, 2, 3, 4], [5, 0, 5, 0, 5, 0, 2], [7, 3]]


@pytest.fixture(scope="module")
def mamba_dir(tmp_path_factory):
    return save_tiny_model_dir(tmp_path_factory.mktemp("mamba") / "mamba", family="mamba")


@pytest.fixture(scope="module")
def hybrid_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid")
    return save_tiny_model_dir(root / "target", family=HYBRID), save_tiny_model_dir(root / "draft", HYBRID, seed=1)


@pytest.mark.parametrize(
    "target_family,draft_family", [(HYBRID, HYBRID), ("mamba", "mamba"), (HYBRID, "llama"), ("llama", HYBRID)]
)
@pytest.mark.parametrize("num_draft", [1, 3, 6])
def test_greedy_equals_mlx_lm_greedy_with_drafts_accepted_and_rejected(target_family, draft_family, num_draft):
    target, draft = make_tiny(target_family, seed=0), make_tiny(draft_family, seed=1)
    totals, replayed = {}, 0
    for prompt in PROMPTS:
        engines = []
        got = speculative_tokens(target, draft, prompt, 24, num_draft=num_draft, engine_out=engines, totals=totals)
        assert got == mlx_lm_greedy(target, prompt, 24)
        replayed += engines[0].deferred.replayed
    assert 0 < totals["accepted"] < totals["drafted"]  # drafts were really accepted, and really rejected
    if target_family != "llama":
        assert replayed > 0  # rejections rewound the recurrent layers and replayed the accepted tokens


def test_target_cache_after_rejections_equals_plain_decoding_cache():
    """Sampled, so rejections land anywhere; after settling the replay, every layer (the DeltaNet's conv and
    recurrent state, the attention KV) is allclose to mlx-lm feeding the same tokens one at a time."""
    target, draft = make_tiny(HYBRID, seed=0), make_tiny(HYBRID, seed=1)
    prompt, engines = PROMPTS[1], []
    tokens = speculative_tokens(
        target, draft, prompt, 17, num_draft=3, sampling=SamplingConfig(1.0), seed=4, engine_out=engines
    )
    engine = engines[0]
    assert engine.deferred.replayed > 0
    engine.settle()
    fed = prompt + tokens[:-1]
    assert engine.position == len(fed) and engine.deferred.tokens == []
    plain = make_prompt_cache(target)
    for token in fed:
        target(mx.array([[token]]), cache=plain)
    spec_leaves, plain_leaves = leaf_caches(engine.cache), leaf_caches(plain)
    assert (
        [type(c).__name__ for c in spec_leaves]
        == [type(c).__name__ for c in plain_leaves]
        == ["ArraysCache", "KVCache"]
    )
    conv, state = spec_leaves[0].cache
    assert mx.allclose(conv, plain_leaves[0].cache[0], atol=1e-5).item()
    assert mx.allclose(state, plain_leaves[0].cache[1], atol=1e-5).item()
    assert spec_leaves[1].offset == plain_leaves[1].offset == len(fed)
    for spec_kv, plain_kv in zip(spec_leaves[1].state[:2], plain_leaves[1].state[:2]):
        assert mx.allclose(spec_kv[..., : len(fed), :], plain_kv[..., : len(fed), :], atol=1e-5).item()


def test_one_host_sync_per_step_with_replay_fed_alone(monkeypatch):
    """max_merged_replay=0 feeds every replay as its own forward: still queued in the same step, one sync."""
    target, draft = make_tiny(HYBRID, seed=0), make_tiny(HYBRID, seed=1)
    sampling = SamplingConfig(0.8, top_p=0.9)
    drafter = DraftModelDrafter(draft, sampling, 4)
    engine = build_engine(target, drafter, DecodeOptions.sampling_as(sampling, num_draft=4), max_merged_replay=0)
    engine.prefill(PROMPTS[0])
    syncs = []
    original_to_host = engine_module.to_host
    monkeypatch.setattr(engine_module, "to_host", lambda a: syncs.append("to_host") or original_to_host(a))
    monkeypatch.setattr(mx, "eval", lambda *a: syncs.append("eval"))
    for _ in range(8):
        engine.step(100)
    assert engine.deferred.catch_up_forwards > 0
    assert syncs == ["to_host"] * 8


@pytest.mark.parametrize("max_merged_replay", [0, 2, 100])
def test_replay_is_exact_fed_alone_or_merged_and_widths_stay_bounded(max_merged_replay):
    target, draft = make_tiny(HYBRID, seed=0), make_tiny(HYBRID, seed=1)
    for prompt in PROMPTS:
        drafter = DraftModelDrafter(draft, SamplingConfig(), 4)
        engine = build_engine(target, drafter, DecodeOptions(num_draft=4), max_merged_replay=max_merged_replay)
        engine.prefill(prompt)
        out = []
        while len(out) < 30:
            out += engine.step(30 - len(out)).tokens
        assert out == mlx_lm_greedy(target, prompt, 30)
        if max_merged_replay < 100:
            assert max(engine.forward_widths) <= max_merged_replay + 1 + 4


def test_prompt_lookup_on_a_recurrent_target_equals_mlx_lm(mamba_dir):
    spec = mlxspec.load(mamba_dir)  # a target of one's own: prompt lookup by default
    result = spec.generate("abc", max_tokens=40, num_draft=4, stop_at_eos=False)
    assert result.stats.mode == "lookup" and result.stats.note == ""
    assert result.tokens == mlx_lm_greedy(spec.target.model, spec.encode("abc"), 40)
    assert 0 < result.stats.accepted < result.stats.drafted  # the tiny model falls into cycles that lookup copies


def test_plain_decoding_on_a_recurrent_model_equals_mlx_lm(mamba_dir):
    spec = mlxspec.load(mamba_dir, draft=None)
    result = spec.generate("abc", max_tokens=12, stop_at_eos=False, lookup=False)
    assert result.tokens == mlx_lm_greedy(spec.target.model, spec.encode("abc"), 12)
    assert result.stats.mode == "plain" and result.stats.target_calls == 12


def test_sampled_plain_decoding_on_a_recurrent_model_repeats_with_its_seed(mamba_dir):
    spec = mlxspec.load(mamba_dir, draft=None)
    first = spec.generate("abc", max_tokens=10, temperature=1.0, seed=4, stop_at_eos=False)
    assert first.tokens == spec.generate("abc", max_tokens=10, temperature=1.0, seed=4, stop_at_eos=False).tokens


def test_a_tree_on_a_recurrent_target_drafts_a_chain_with_a_note(hybrid_dirs, monkeypatch):
    from helpers import stored_curve

    target_dir, draft_dir = hybrid_dirs
    # on a device where drafting pays (whether this machine's timings say so belongs in benchmarks)
    monkeypatch.setattr("mlxspec.drafting.provider.model_curve", lambda *args, **kwargs: stored_curve(0.001, 0.1))
    spec = mlxspec.load(target_dir, draft=draft_dir)
    result = spec.generate("abcd", max_tokens=20, tree_topk=2, num_draft=3, stop_at_eos=False)
    assert "qwen3_5 keeps recurrent state" in result.stats.note and "chain" in result.stats.note
    assert result.stats.mode == "draft" and result.stats.accepted > 0
    assert result.tokens == mlx_lm_greedy(spec.target.model, spec.encode("abcd"), 20)


def test_cli_drafts_for_a_hybrid_target(hybrid_dirs):
    target_dir, draft_dir = hybrid_dirs
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlxspec",
            "generate",
            "abcd",
            "--model",
            target_dir,
            "--draft",
            draft_dir,
            "--max-tokens",
            "12",
            "-k",
            "3",
            "-v",
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    assert "mode=draft k=" in run.stderr


@pytest.mark.slow  # 35-40 s each here; the quick run checks hybrids greedily and by their caches
@pytest.mark.parametrize("sampling", [SamplingConfig(1.0), SamplingConfig(0.7, top_p=0.9)], ids=["T1", "T0.7-top-p"])
def test_speculative_samples_on_a_hybrid_follow_the_target_distribution(sampling):
    """Chi-square of 2000 seeded runs (K=2, 3 tokens, so later steps replay what an earlier one rejected after)
    against the enumerated law of the processed hybrid target; false alarm 1e-3. The same counts must reject the
    draft's own law (power check)."""
    target = make_tiny(HYBRID, seed=0, logit_scale=3.0)
    draft = make_tiny(HYBRID, seed=5, logit_scale=3.0)
    prompt, length = [1, 2], 3
    counts, replayed = np.zeros([8] * length), 0
    for seed in range(2000):
        engines = []
        out = speculative_tokens(
            target, draft, prompt, length, num_draft=2, sampling=sampling, seed=seed, engine_out=engines
        )
        counts[tuple(out)] += 1
        replayed += engines[0].deferred.replayed
    assert replayed > 200  # the replay path ran in many of the runs
    assert chi_square_pvalue(counts, exact_joint(target, prompt, sampling, length)) > ALPHA
    assert chi_square_pvalue(counts, exact_joint(draft, prompt, sampling, length)) < ALPHA


@pytest.mark.slow  # 10-15 s on 2 cores: in the whole suite, not the quick run
def test_cli_no_draft_plan_and_budget_work_on_recurrent_and_hybrid_models(mamba_dir, tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "mlxspec", *map(str, a)], capture_output=True, text=True)  # noqa: E731
    gen = run("generate", "abc", "--model", mamba_dir, "--no-draft", "--max-tokens", 4)
    assert gen.returncode == 0 and "Traceback" not in gen.stderr, gen.stderr
    budget = run("generate", "abc", "--model", mamba_dir, "--memory-budget", "8GB", "--max-tokens", 4)
    assert budget.returncode == 0 and "Traceback" not in budget.stderr, budget.stderr
    for model in (mamba_dir, "qwen3-next-80b-a3b"):
        plan = run("plan", "--model", model, "--device", "m4-max-128gb")
        verdict = 1 if "DOES NOT FIT" in plan.stdout else 0  # the exit status says the verdict
        assert plan.returncode == verdict and "Traceback" not in plan.stderr, plan.stderr
        assert "recurrent state" in plan.stdout
    # A family mlx-lm cannot build is refused in one line with exit 2, never guessed.
    unknown = tmp_path / "config.json"
    unknown.write_text('{"model_type": "not_a_family", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 8}')
    refused = run("plan", "--model", unknown)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "model_type 'not_a_family' is not one mlx-lm can build" in refused.stderr
