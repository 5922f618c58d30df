"""The second real bed (`pytest -m real`): Qwen2.5-Coder-1.5B-Instruct drafted by Qwen2.5-Coder-0.5B-Instruct, both
llama.cpp's GGUF Q4_K_M (`scripts/fetch_real_model.py --pair` puts them and their conversions in .real/), held at
their own bits. Greedy output of every drafting mode equals mlxspec's plain decoding on the same weights token for
token, and plain decoding equals mlx-lm's generate_step there; a seeded run writes plain decoding's text for that
seed whatever drafted; the conversion kept Q4_K exactly and said what became of Q6_K."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import assert_greedy_equal, mlx_lm_greedy

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[1]
REAL = Path(os.environ.get("MLXSPEC_REAL_DIR") or ROOT / ".real")
TARGET_GGUF = REAL / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
TARGET = REAL / "qwen2.5-coder-1.5b-instruct"
DRAFT = REAL / "qwen2.5-coder-0.5b-instruct"
PROMPT = "def binary_search(items, target):\n    low, high = 0, len(items) - 1\n"
TOKENS = 24


@pytest.fixture(scope="module")
def pair():
    if not all((folder / "config.json").exists() for folder in (TARGET, DRAFT)):
        pytest.fail(f"the pair is missing from {REAL}; run `python scripts/fetch_real_model.py --pair` first")
    import mlxspec

    return mlxspec.load(TARGET, draft=DRAFT)


def test_the_pair_is_held_at_its_own_bits():
    """Q4_K factored as the file holds it (4-bit codes, d and dmin per 256, sc and m per 32: k_quants.py), Q6_K
    re-quantized to 8 bits with its error said; the 1.5B's weights within the goal of 1.25x the file's bytes."""
    marker = json.loads((TARGET / "gguf_source.json").read_text())
    assert marker["weights"].startswith("F32:float32,Q4_K:4-bit,Q6_K:8-bit~"), marker["weights"]
    held = sum(f.stat().st_size for f in TARGET.glob("*.safetensors"))
    assert held <= 1.25 * TARGET_GGUF.stat().st_size, (held, TARGET_GGUF.stat().st_size)
    config = json.loads((TARGET / "config.json").read_text())
    affine = {layer["bits"] for key, layer in config["quantization"].items() if isinstance(layer, dict)}
    assert affine == {8} and set(config["k_quants"].values()) == {4}
    assert len(config["k_quants"]) == 169  # every Q4_K tensor, the embedding among them


def test_plain_decoding_equals_mlx_lms_generate_step(pair):
    """mlx-lm runs the converted model through MLX's own quantized_matmul; mlxspec through its kernel."""
    ids = pair.tokenizer.encode(PROMPT)
    expected = mlx_lm_greedy(pair.target.model, ids, 8)
    got = pair.generate(ids, max_tokens=8, temperature=0.0, stop_at_eos=False, use_draft=False).tokens
    assert_greedy_equal(pair.target.model, ids, got, expected)


@pytest.mark.parametrize(
    "changes",
    [
        dict(num_draft=4),
        dict(num_draft=3, tree_topk=2),
        dict(lookup=True, num_draft=4),
        dict(num_draft="auto"),
    ],
    ids=["chain", "tree", "lookup+draft", "auto"],
)
def test_every_drafting_mode_writes_plain_decodings_tokens(pair, changes):
    ids = pair.tokenizer.encode(PROMPT)
    plain = pair.generate(ids, max_tokens=TOKENS, temperature=0.0, stop_at_eos=False, use_draft=False)
    drafted = pair.generate(ids, max_tokens=TOKENS, temperature=0.0, stop_at_eos=False, **changes)
    assert drafted.tokens == plain.tokens
    if changes["num_draft"] == "auto":  # it drafts only where its measured costs say drafting pays, else says why
        said = any(words in drafted.stats.note for words in ("cannot pay", "paused for"))
        assert drafted.stats.accepted > 0 or said, drafted.stats.note
    else:
        assert drafted.stats.drafted > 0 and drafted.stats.accepted > 0  # the 0.5B's drafts were really kept


def test_a_seeded_run_writes_plain_decodings_text_whatever_drafted(pair):
    ids = pair.tokenizer.encode(PROMPT)
    sampled = dict(max_tokens=16, temperature=0.7, seed=11, stop_at_eos=False)
    plain = pair.generate(ids, use_draft=False, **sampled).tokens
    assert pair.generate(ids, num_draft=4, **sampled).tokens == plain
