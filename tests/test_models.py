"""The embedded model family in models/: loads offline, round-trips code, shares one tokenizer, and is exact."""

import json

import pytest
from helpers import mlx_lm_greedy
from mlx_lm import load as mlx_lm_load

import mlxspec
from mlxspec.drafting.heads.medusa import load_medusa
from mlxspec.drafting.lookup.corpus import read_text, split_files
from mlxspec.loading import MODELS_DIR, load_model, tokenizer_mismatch

SHIPPED = ["target", "target-4bit", "draft"]


@pytest.mark.parametrize("name", SHIPPED)
def test_each_shipped_model_loads_with_mlx_lm(name):
    model, tokenizer = mlx_lm_load(str(MODELS_DIR / name))
    assert tokenizer.encode("import os") and model.args.vocab_size == len(tokenizer.get_vocab())


def test_shipped_models_fit_the_size_budget():
    total = sum(f.stat().st_size for f in MODELS_DIR.rglob("*") if f.is_file())
    assert total <= 40 * 2**20, f"models/ holds {total / 2**20:.1f} MiB; the budget is 40 MiB"
    dflash = sum(f.stat().st_size for f in (MODELS_DIR / "dflash").rglob("*") if f.is_file())
    assert dflash <= 5 * 10**6, f"models/dflash holds {dflash / 1e6:.2f} MB; the block-drafter issue allows 5 MB"
    assert json.loads((MODELS_DIR / "target-4bit" / "config.json").read_text())["quantization"]["bits"] == 4


def test_tokenizer_round_trips_stdlib_files_exactly():
    tokenizer = load_model(MODELS_DIR / "draft").tokenizer
    train, heldout = split_files()
    for path in heldout[:4] + train[:4]:
        text = read_text(path)
        if text:
            assert tokenizer.decode(tokenizer.encode(text)) == text, path


def test_shipped_pair_is_compatible_and_a_mismatched_tokenizer_is_rejected(tiny_dirs):
    target, draft = load_model(MODELS_DIR / "target"), load_model(MODELS_DIR / "draft")
    assert tokenizer_mismatch(target.tokenizer, draft.tokenizer) is None
    other = load_model(tiny_dirs["target"])
    assert "vocabulary sizes differ" in tokenizer_mismatch(target.tokenizer, other.tokenizer)


def test_cpu_loading_computes_in_float32():
    """The embedded bf16 checkpoints on the CPU: every embedding, norm and bias float32 (so activations are), each
    Linear's weight matrix kept bfloat16 (the kernel widens it exactly as it reads)."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    loaded = load_model(MODELS_DIR / "draft")
    linear = {f"{p}.weight" for p, m in loaded.model.named_modules() if isinstance(m, nn.Linear)}
    dtypes = {name: v.dtype for name, v in tree_flatten(loaded.model.parameters())}
    assert linear and {dtypes[name] for name in linear} == {mx.bfloat16}
    assert {d for name, d in dtypes.items() if name not in linear} == {mx.float32}
    assert loaded.compute_dtype == "float32"


@pytest.mark.parametrize("num_draft", [1, 2, 4, pytest.param(8, marks=pytest.mark.slow)])  # k=8: the whole suite
def test_embedded_greedy_equals_mlx_lm_greedy(num_draft):
    """The shipped pair, several held-out prompts: token-for-token equality with mlx-lm's own greedy decoding."""
    from helpers import assert_greedy_equal

    spec = mlxspec.load(num_draft=num_draft)
    _, heldout = split_files()
    for path in heldout[:3]:
        prompt = spec.tokenizer.encode(read_text(path))[:64]
        expected = mlx_lm_greedy(spec.target.model, prompt, 40)
        got = spec.generate(prompt, max_tokens=40, stop_at_eos=False).tokens
        assert_greedy_equal(spec.target.model, prompt, got, expected)


def test_embedded_medusa_heads_load_and_are_exact():
    from helpers import assert_greedy_equal

    spec = mlxspec.load(medusa=MODELS_DIR / "medusa")
    heads = load_medusa(MODELS_DIR / "medusa", MODELS_DIR / "target")
    shipped = json.loads((MODELS_DIR / "medusa" / "medusa_config.json").read_text())
    assert heads.config.num_heads == shipped["num_heads"] == len(heads.blocks) == len(heads.config.topk_accuracy) == 4
    prompt = spec.encode("import os\nimport sys\n\n\ndef main(argv):")
    expected = mlx_lm_greedy(spec.target.model, prompt, 40)
    for topk in (1, 2):
        got = spec.generate(prompt, max_tokens=40, tree_topk=topk, stop_at_eos=False).tokens
        assert_greedy_equal(spec.target.model, prompt, got, expected)


def test_token_healing_recompletes_a_bare_newline():
    spec = mlxspec.load(draft=None)
    healed = spec.generate("def f(x):\n", max_tokens=3, heal=True)
    first = spec.tokenizer.decode(healed.tokens[:1])
    assert first.startswith("\n") and len(first) > 1  # newline plus indentation, as training saw it
    assert not healed.text.startswith("\n")  # the user's newline is not printed twice
