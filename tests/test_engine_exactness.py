"""The project's most important tests: speculative output is exactly the target's, greedy and sampled."""

import itertools

import mlx.core as mx
import numpy as np
import pytest
from helpers import assert_greedy_equal, mlx_lm_greedy, speculative_tokens
from mlx_lm.models.cache import make_prompt_cache
from stats import ALPHA, chi_square_pvalue
from tiny import make_tiny

import mlxspec.decoding.engine as engine_module
from mlxspec.decoding.assembly import build_engine
from mlxspec.decoding.sampling import SamplingConfig, to_probs
from mlxspec.options import DecodeOptions

PROMPTS = [[1, 2, 3, 4], [5, 0, 5, 0, 5, 0, 2], [7, 3]]


def test_greedy_with_the_target_as_its_own_draft_accepts_everything():
    target = make_tiny("llama", seed=0)
    engines = []
    got = speculative_tokens(target, target, PROMPTS[0], 20, num_draft=4, engine_out=engines)
    assert got == mlx_lm_greedy(target, PROMPTS[0], 20)
    assert engines[0].target_calls == 4  # 20 tokens in steps of 5: every draft accepted, plus the bonus


def test_sliding_window_target_runs_past_its_window():
    """gemma3's sliding layers use RotatingKVCache in mlx-lm; mlxspec must stay exact far past the window (6)."""
    target = make_tiny("gemma3_text", seed=0, sliding_window=6)
    draft = make_tiny("gemma3_text", seed=1, sliding_window=6)
    prompt = [1, 2, 3, 4, 5, 6, 0, 1, 2, 3]
    expected = mlx_lm_greedy(target, prompt, 40)
    for num_draft in (2, 5):
        assert_greedy_equal(
            target, prompt, speculative_tokens(target, draft, prompt, 40, num_draft=num_draft), expected
        )


@pytest.mark.parametrize("kv_bits", [4, 8])
def test_greedy_with_quantized_kv_equals_plain_decoding_with_quantized_kv(kv_bits):
    target = make_tiny("llama", seed=0, hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
    draft = make_tiny(
        "llama", seed=1, hidden_size=128, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1
    )
    for prompt in PROMPTS:
        plain = speculative_tokens(target, None, prompt, 24, kv_bits=kv_bits)
        got = speculative_tokens(target, draft, prompt, 24, num_draft=4, kv_bits=kv_bits)
        assert_greedy_equal(target, prompt, got, plain)


def test_target_cache_equals_plain_decoding_cache():
    target, draft = make_tiny("llama", seed=0), make_tiny("llama", seed=1, num_hidden_layers=1)
    prompt = PROMPTS[1]
    engines = []
    tokens = speculative_tokens(
        target, draft, prompt, 17, num_draft=3, sampling=SamplingConfig(1.0), seed=4, engine_out=engines
    )
    spec_cache = engines[0].cache
    # Plain decoding of the same tokens: everything but the last emitted token has been fed to the target.
    fed = prompt + tokens[:-1]
    plain_cache = make_prompt_cache(target)
    for token in fed:
        target(mx.array([[token]]), cache=plain_cache)
    assert engines[0].position == len(fed)  # the engine's own count, used where caches have no offset
    for spec_layer, plain_layer in zip(spec_cache, plain_cache):
        assert spec_layer.offset == plain_layer.offset == len(fed)
        spec_k, spec_v = (x[..., : len(fed), :] for x in spec_layer.state[:2])
        plain_k, plain_v = (x[..., : len(fed), :] for x in plain_layer.state[:2])
        assert mx.allclose(spec_k, plain_k, atol=1e-5).item() and mx.allclose(spec_v, plain_v, atol=1e-5).item()


def test_one_host_sync_per_step(monkeypatch):
    target, draft = make_tiny("llama", seed=0), make_tiny("llama", seed=1, num_hidden_layers=1)
    from mlxspec.drafting.draft_model.drafter import DraftModelDrafter

    sampling = SamplingConfig(0.8, top_p=0.9)
    options = DecodeOptions.sampling_as(sampling, num_draft=4)
    engine = build_engine(target, DraftModelDrafter(draft, sampling, 4), options)
    engine.prefill(PROMPTS[0])

    syncs = []
    original_to_host = engine_module.to_host
    monkeypatch.setattr(engine_module, "to_host", lambda a: syncs.append("to_host") or original_to_host(a))
    original_tolist, original_item = mx.array.tolist, mx.array.item
    monkeypatch.setattr(mx.array, "tolist", lambda a: syncs.append("tolist") or original_tolist(a))
    monkeypatch.setattr(mx.array, "item", lambda a: syncs.append("item") or original_item(a))
    monkeypatch.setattr(mx, "eval", lambda *a: syncs.append("eval"))
    for _ in range(6):
        engine.step(100)
    assert syncs.count("to_host") == 6
    assert set(syncs) == {"to_host", "tolist"} and syncs.count("tolist") == 6  # to_host's own tolist, nothing else


def test_plain_decoding_queues_its_next_forward_with_one_sync_per_step(monkeypatch):
    """No drafter: each step queues the next token's forward before syncing, still one host sync per step, and the
    tokens are mlx-lm's greedy ones."""
    target = make_tiny("llama", seed=0)
    engine = build_engine(target, None, DecodeOptions())
    engine.prefill(PROMPTS[1])
    syncs = []
    original_to_host = engine_module.to_host
    monkeypatch.setattr(engine_module, "to_host", lambda a: syncs.append("to_host") or original_to_host(a))
    monkeypatch.setattr(mx, "eval", lambda *a: syncs.append("eval"))
    out = []
    for _ in range(12):
        out += engine.step(100).tokens
        assert engine._prefetched is not None and engine.pending == []  # the next forward is already queued
    assert syncs == ["to_host"] * 12
    assert out == mlx_lm_greedy(target, PROMPTS[1], 12)


# ---- distribution tests: enumerate the exact joint law of the first three tokens (vocab 8) ----


def exact_joint(target, prompt, sampling, length):
    """P(t1..tL) under the processed target, by enumerating every prefix (8^L - 1 forward passes at most)."""
    vocab = 8
    joint = np.zeros([vocab] * length)
    for seq in itertools.product(range(vocab), repeat=length):
        prob = 1.0
        for i in range(length):
            logits = target(mx.array(prompt + list(seq[:i]))[None])[0, -1]
            prob *= float(to_probs(logits, sampling)[seq[i]])
            if prob == 0:
                break
        joint[seq] = prob
    return joint


# All four in the whole suite (40-100 s each on 2 cores); the quick run's sampled law is test_sampling_fast's.
@pytest.mark.parametrize(
    "sampling, acceptance",
    [
        pytest.param(SamplingConfig(1.0), "coupled", id="T1", marks=pytest.mark.slow),
        pytest.param(SamplingConfig(0.7, top_p=0.9), "coupled", id="T0.7-top-p", marks=pytest.mark.slow),
        pytest.param(SamplingConfig(1.0), "residual", id="T1-residual", marks=pytest.mark.slow),
        pytest.param(SamplingConfig(0.7, top_p=0.9), "residual", id="T0.7-top-p-residual", marks=pytest.mark.slow),
    ],
)
def test_speculative_samples_follow_the_target_distribution(sampling, acceptance):
    """Chi-square of 4000 seeded runs (K=2, 3 tokens) against the enumerated law of the processed target; false
    alarm 1e-3. Coupled: drafts kept where they equal the target's position-keyed draw; residual: Leviathan/Chen's
    accept, residual and bonus paths. The same counts must reject the draft's own law (power check)."""
    target = make_tiny("llama", seed=0, logit_scale=3.0)
    draft = make_tiny("llama", seed=5, logit_scale=3.0)
    prompt, length = [1, 2], 3
    counts = np.zeros([8] * length)
    for seed in range(4000):
        out = speculative_tokens(
            target, draft, prompt, length, num_draft=2, sampling=sampling, seed=seed, acceptance=acceptance
        )
        counts[tuple(out)] += 1
    assert chi_square_pvalue(counts, exact_joint(target, prompt, sampling, length)) > ALPHA
    assert chi_square_pvalue(counts, exact_joint(draft, prompt, sampling, length)) < ALPHA
