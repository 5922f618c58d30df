"""The real bed (`pytest -m real`): google/gemma-3-270m as llama.cpp's GGUF Q4_K_M (scripts/fetch_real_model.py
puts it and its conversion in .real/), converted by mlxspec's own GGUF path. Greedy output equals mlx-lm's
generate_step on the converted model token for token, for every drafter that fits it; the tokenizer is the GGUF's
own; the first sampled tokens follow the target's law; `--model FILE.gguf` converts once and says where."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_greedy_equal, mlx_lm_greedy

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[1]
REAL = Path(os.environ.get("MLXSPEC_REAL_DIR") or ROOT / ".real")
GGUF = REAL / "gemma-3-270m-q4_k_m.gguf"
CONVERTED = REAL / "gemma-3-270m"
PROMPTS = [
    "The history of the printing press begins in the fifteenth century, when",
    "def binary_search(items, target):\n    low, high = 0, len(items) - 1\n",
]
TOKENS = 24


@pytest.fixture(scope="module")
def real():
    if not (GGUF.exists() and (CONVERTED / "config.json").exists()):
        pytest.fail(f"the real bed is missing from {REAL}; run `python scripts/fetch_real_model.py` first")
    import mlxspec

    return mlxspec.load(CONVERTED, draft=None)


def test_the_conversion_is_the_gguf_model_mlx_lm_runs(real):
    config = json.loads((CONVERTED / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["num_hidden_layers"] == 18
    assert config["vocab_size"] == 262144 and config["eos_token_id"] == [1, 106]
    assert real.vocab_size == 262144  # not 262145: the tokenizer's extra added tokens do not widen the output


def test_the_tokenizer_is_the_ggufs_own_token_list(real):
    from mlxspec.gguf.header import read_header

    tokens = read_header(GGUF, ("tokenizer.ggml.tokens",)).metadata["tokenizer.ggml.tokens"]
    tokenizer = real.tokenizer
    spelled = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]  # Gemma's runs of spaces
    sample = list(range(0, 262144, 97)) + list(range(0, 300))
    assert tokenizer.convert_ids_to_tokens(sample) == [spelled[i] for i in sample]
    text = "def f(x):\n    return x  # two  spaces, ünïcödé, 日本語 <end_of_turn>"
    ids = tokenizer.encode(text)
    assert ids[0] == 2 and tokenizer.decode(ids[1:]) == text  # <bos> first, then a lossless round trip
    assert tokenizer.convert_tokens_to_ids("<end_of_turn>") == 106 and len(tokenizer.encode("<end_of_turn>")) == 2


@pytest.mark.parametrize(
    "changes",
    [
        dict(use_draft=False),
        dict(use_draft=False, lookup=True, num_draft=4),
        dict(use_draft=False, lookup=True, suffix=True, num_draft=4),
        dict(use_draft=False, lookup=True, lookup_candidates=3, num_draft=3),
    ],
    ids=["plain", "lookup", "suffix", "lookup-tree"],
)
def test_greedy_output_equals_mlx_lms_generate_step(real, changes):
    for prompt in PROMPTS:
        ids = real.tokenizer.encode(prompt)
        expected = mlx_lm_greedy(real.target.model, ids, TOKENS)
        got = real.generate(ids, max_tokens=TOKENS, temperature=0.0, stop_at_eos=False, **changes).tokens
        assert_greedy_equal(real.target.model, ids, got, expected)


def test_a_cross_tokenizer_draft_is_exact_on_the_real_model():
    """The embedded 1.3M draft (another tokenizer) drafting for Gemma by re-tokenized text: plain decoding's text."""
    import mlxspec
    from mlxspec.loading import DEFAULT_DRAFT

    spec = mlxspec.load(CONVERTED, draft=DEFAULT_DRAFT, num_draft=3)
    assert spec.cross_tokenizer and "262144" in spec.cross_tokenizer  # the target's vocabulary, not 262145
    ids = spec.tokenizer.encode(PROMPTS[1])
    expected = mlx_lm_greedy(spec.target.model, ids, TOKENS)
    got = spec.generate(ids, max_tokens=TOKENS, temperature=0.0, stop_at_eos=False).tokens
    assert_greedy_equal(spec.target.model, ids, got, expected)


def test_the_first_sampled_token_follows_the_targets_law_with_lookup_drafting():
    """800 first tokens sampled at T=1 with prompt lookup drafting, against the target's own distribution
    (chi-square, false alarm 1e-3); the power check: the same counts against a distribution at T=1.3 fail it."""
    import mlx.core as mx
    from stats import ALPHA, chi_square_pvalue

    import mlxspec

    spec = mlxspec.load(CONVERTED, draft=None, prompt_cache=1)  # each draw reuses the prompt's prefill
    prompt = spec.tokenizer.encode("The the the the the cat sat on the mat. The the the")
    logits = spec.target.model(mx.array(prompt)[None])[0, -1].astype(mx.float32)
    law = np.array(mx.softmax(logits))
    counts = np.zeros(law.shape[0])
    drafted = 0
    for seed in range(800):
        result = spec.generate(
            prompt, max_tokens=3, temperature=1.0, seed=seed, lookup=True, use_draft=False, num_draft=2
        )
        counts[result.tokens[0]] += 1
        drafted += result.stats.drafted
    assert drafted > 0  # lookup really drafted (the repeated "the" matches)
    assert chi_square_pvalue(counts, law) > ALPHA
    hotter = np.array(mx.softmax(logits / 1.3))
    assert chi_square_pvalue(counts, hotter) < ALPHA


def test_generate_converts_a_gguf_once_and_says_where(tmp_path):
    import subprocess
    import sys

    env = {**os.environ, "MLXSPEC_CACHE": str(tmp_path / "cache"), "MLXSPEC_NO_OPENBLAS": "1"}
    command = [sys.executable, "-m", "mlxspec", "generate", "--model", str(GGUF), "The capital of France is"]
    command += ["--max-tokens", "8", "--no-draft", "--json"]
    first = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    assert first.returncode == 0, first.stderr
    converted = [line for line in first.stderr.splitlines() if "converted" in line and "later runs read it" in line]
    assert len(converted) == 1 and str(tmp_path / "cache" / "gguf") in converted[0]
    second = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    assert second.returncode == 0 and "convert" not in second.stderr
    assert json.loads(second.stdout)["tokens"] == json.loads(first.stdout)["tokens"]
    plan = subprocess.run(
        [sys.executable, "-m", "mlxspec", "plan", "--model", str(GGUF), "--context", "4096"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert plan.returncode == 0 and "gemma-3-270m-q4_k_m" in plan.stdout and "0.27B params" in plan.stdout
