"""EAGLE-3 heads as published: SafeAILab's (pytorch_model.bin read without torch, or safetensors) and vLLM
speculators' formats load unchanged, tap the right target layers, decode exactly (greedy equal to plain decoding,
chains and EAGLE-2 trees, kernel on and off; sampled output following the target's law where the target puts mass
outside the draft vocabulary), and a head for another target, an incomplete one or a hostile pickle is refused by
name."""

from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_greedy_equal, assert_one_line, mlx_lm_greedy, speculative_tokens
from stats import ALPHA, chi_square_pvalue
from test_engine_exactness import exact_joint
from tiny import make_tiny, save_tiny_model_dir
from tiny_eagle3 import DRAFT_IDS, save_safeailab_eagle3, save_speculators_eagle3, write_torch_zip

from mlxspec import UserError
from mlxspec.decoding.sampling import SamplingConfig
from mlxspec.drafting.eagle3.files import load_eagle_head, parse_eagle3_config
from mlxspec.drafting.eagle3.model import Eagle3Head
from mlxspec.drafting.eagle3.torch_checkpoint import load_torch_state_dict
from mlxspec.drafting.factory import make_drafter
from mlxspec.loading import LoadedModel
from mlxspec.options import DecodeOptions

PROMPT = [1, 2, 3, 1, 2, 3, 4]


def loaded(model) -> LoadedModel:
    return LoadedModel(model, None, model.config, Path("/nonexistent/tiny"))


def target_of(family: str = "llama", layers: int = 8, seed: int = 1, **overrides):
    return make_tiny(family, seed=seed, num_hidden_layers=layers, **overrides)


def drafter(head: Eagle3Head, target, sampling=SamplingConfig(), topk: int = 1, nodes: int = 0):
    options = DecodeOptions.sampling_as(sampling, num_draft=4, tree_topk=topk, tree_nodes=nodes)
    return make_drafter(options, target_model=target, feature_head=head)


HEADS = {
    "safeailab-bin": lambda t, p: save_safeailab_eagle3(p, t, "bin"),
    "safeailab-safetensors": lambda t, p: save_safeailab_eagle3(p, t, "safetensors"),
    "speculators": lambda t, p: save_speculators_eagle3(p, t, aux=[1, 3, 6]),
}


@pytest.mark.parametrize("source", list(HEADS))
def test_each_format_loads_with_its_taps_vocabulary_and_head_dim(source, tmp_path):
    target = target_of()
    head = load_eagle_head(HEADS[source](target, tmp_path / source), loaded(target))
    assert isinstance(head, Eagle3Head)
    # The sources tap layer inputs; mlxspec taps the outputs of the layer before. Rule for 8 layers: (2, 4, 5).
    assert head.config.target_taps == ((0, 2, 5) if source == "speculators" else (1, 3, 4))
    assert head.draft_to_target.tolist() == DRAFT_IDS
    assert head.config.head_dim == (16 if source == "speculators" else 8)  # vLLM reads head_dim; EAGLE: H / heads
    assert head.midlayer.self_attn.q_proj.weight.shape == (4 * head.config.head_dim, 2 * 32)


def test_the_two_formats_hold_the_same_head_when_the_weights_are_the_same(tmp_path):
    """The same random weights written by hand under SafeAILab's names (torch zip) and speculators' give the same
    logits: the loader maps midlayer.* and layers.0.* onto one head."""
    target = target_of()
    one = load_eagle_head(save_safeailab_eagle3(tmp_path / "a", target, "bin", aux=[1, 3, 6]), loaded(target))
    other_dir = save_speculators_eagle3(tmp_path / "b", target, aux=[1, 3, 6], head_dim=8)
    other = load_eagle_head(other_dir, loaded(target))
    import mlx.core as mx

    embeds, taps = mx.random.normal((1, 3, 32)), mx.random.normal((1, 3, 96))
    # weights differ in dtype on disk (fp16 vs bf16) but come from the same float32 draw
    assert mx.allclose(one(embeds, taps), other(embeds, taps), atol=5e-2).item()


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("source", ["safeailab-bin", "speculators"])
def test_greedy_equals_plain_decoding_chains_and_trees_kernel_on_and_off(family, source, tmp_path):
    target = target_of(family)
    head = load_eagle_head(HEADS[source](target, tmp_path / source), loaded(target))
    want = mlx_lm_greedy(target, PROMPT, 24)
    for kernel in ("auto", "off"):
        for topk, nodes in ((1, 0), (3, 8)):
            engines = []
            got = speculative_tokens(
                target,
                None,
                PROMPT,
                24,
                4,
                drafter=drafter(head, target, topk=topk, nodes=nodes),
                kernel=kernel,
                tree_topk=topk,
                engine_out=engines,
            )
            assert_greedy_equal(target, PROMPT, got[:24], want)


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_after_rejections_the_head_cache_equals_one_built_from_the_whole_history(family, tmp_path):
    """The taps stay aligned with the kept positions: after a run with rejections (and, for the qwen3_5 hybrid,
    deferred replay), the head's context rows equal those a fresh head builds from one forward over the history."""
    import mlx.core as mx

    from mlxspec.decoding.target_features import forward_with_hidden

    target = target_of(family, layers=4)
    head = load_eagle_head(save_speculators_eagle3(tmp_path / "h", target, aux=[1, 2, 3]), loaded(target))
    used, totals, engines = drafter(head, target), {}, []
    got = speculative_tokens(target, None, PROMPT, 30, 4, drafter=used, totals=totals, engine_out=engines)
    assert_greedy_equal(target, PROMPT, got[:30], mlx_lm_greedy(target, PROMPT, 30))
    assert totals["accepted"] < totals["drafted"]  # rejections: rollback ran
    engines[0].settle()
    history = engines[0].history
    used._catch_up()  # feed the rows handed over since the last proposal
    fresh = drafter(head, target)
    fresh.prefill(history)
    features, _ = forward_with_hidden(target, mx.array([history[:-1]]), None, used.target_taps)
    fresh.set_hidden(features[0])
    fresh._catch_up()
    assert used.fed == fresh.fed == len(history) - 1
    kept, rebuilt = used.cache.keys[..., : used.fed, :], fresh.cache.keys[..., : fresh.fed, :]
    assert mx.allclose(kept, rebuilt, atol=1e-4).item()


@pytest.mark.parametrize(
    "sampling",
    [
        pytest.param(SamplingConfig(1.0), id="T1", marks=pytest.mark.slow),
        pytest.param(SamplingConfig(0.7, top_p=0.9), id="T0.7-top-p", marks=pytest.mark.slow),
    ],
)
def test_sampled_output_follows_the_target_law_with_mass_outside_the_draft_vocabulary(sampling, tmp_path):
    """Chi-square of 3000 seeded runs (3 tokens, vocab 8) against the enumerated law; false alarm 1e-3. Target ids
    3, 5 and 7 are outside the draft vocabulary (q = 0 there) yet carry the target's mass; they come out through
    the residual. Power check: the same counts reject the law at another temperature."""
    target = make_tiny("llama", seed=0, logit_scale=3.0, num_hidden_layers=4)
    head = load_eagle_head(save_safeailab_eagle3(tmp_path / "h", target, "bin", aux=[1, 2, 3]), loaded(target))
    prompt, length = [1, 2, 1], 3
    law = exact_joint(target, prompt, sampling, length)
    outside = sum(law[i, j, k] for i in range(8) for j in range(8) for k in range(8) if {i, j, k} - set(DRAFT_IDS))
    assert outside > 0.2  # the test has power over the residual: outside tokens are common
    counts, totals = np.zeros([8] * length), {}
    for seed in range(3000):
        out = speculative_tokens(
            target,
            None,
            prompt,
            length,
            3,
            sampling=sampling,
            seed=seed,
            drafter=drafter(head, target, sampling),
            totals=totals,
        )
        counts[tuple(out)] += 1
    assert totals["accepted"] > 300  # the acceptance rule was really exercised
    assert chi_square_pvalue(counts, law) > ALPHA
    other = SamplingConfig(sampling.temperature * 1.3, top_p=sampling.top_p)
    assert chi_square_pvalue(counts, exact_joint(target, prompt, other, length)) < ALPHA


def _edit_config(path: Path, **changes) -> Path:
    raw = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    (path / "config.json").write_text(json.dumps(raw))
    return path


def test_the_layer_rule_colliding_on_a_small_target_is_refused_by_name(tmp_path):
    target = target_of(layers=6)  # (2, 6 // 2, 6 - 3) = (2, 3, 3)
    path = save_safeailab_eagle3(tmp_path / "h", target, "bin")
    with pytest.raises(UserError, match=r"taps layers \(2, 3, 3\).*two coincide.*eagle_aux_hidden_state_layer_ids"):
        load_eagle_head(path, loaded(target))
    _edit_config(path, eagle_aux_hidden_state_layer_ids=[1, 3, 4])  # an explicit list is followed
    assert load_eagle_head(path, loaded(target)).config.target_taps == (0, 2, 3)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_size": 64}, "expects a target with hidden_size=64"),
        ({"vocab_size": 9}, "expects a target with vocab_size=9"),
        ({"eagle_aux_hidden_state_layer_ids": [1, 3, 8]}, "input of layer 8"),
        ({"draft_vocab_size": 6}, "d2t that does not map 6 draft tokens"),
    ],
)
def test_a_head_for_another_target_is_refused_by_name(change, message, tmp_path):
    target = target_of()
    path = _edit_config(save_safeailab_eagle3(tmp_path / "h", target, "safetensors"), **change)
    with pytest.raises(UserError, match=message):
        load_eagle_head(path, loaded(target))


def test_an_incomplete_or_inconsistent_head_is_refused_by_name(tmp_path):
    target = target_of()
    import mlx.core as mx

    path = save_safeailab_eagle3(tmp_path / "h", target, "safetensors")
    weights = mx.load(str(path / "model.safetensors"))
    mx.save_safetensors(str(path / "model.safetensors"), {k: v for k, v in weights.items() if k != "fc.weight"})
    with pytest.raises(UserError, match="lacks fc.weight"):
        load_eagle_head(path, loaded(target))
    weights["d2t"] = weights["d2t"] - 1  # draft 0 -> target -1: outside the vocabulary
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    with pytest.raises(UserError, match="d2t that does not map"):
        load_eagle_head(path, loaded(target))
    with pytest.raises(UserError, match="not an EAGLE head"):
        load_eagle_head(_edit_config(path, draft_vocab_size=None), loaded(target))
    spec = save_speculators_eagle3(tmp_path / "s", target, aux=[1, 3, 6])
    raw = json.loads((spec / "config.json").read_text())
    raw["transformer_layer_config"]["num_hidden_layers"] = 2
    (spec / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UserError, match="2 decoder layers; mlxspec runs 1-layer"):
        load_eagle_head(spec, loaded(target))


def test_a_pickle_that_would_run_code_is_refused_and_never_run(tmp_path):
    """Only a plain state dict's names resolve: a GLOBAL naming anything else stops the read before it runs."""
    marker = tmp_path / "ran"

    class Hostile:
        def __reduce__(self):
            return (Path.touch, (marker,))

    bad = tmp_path / "pytorch_model.bin"
    with zipfile.ZipFile(bad, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"x": Hostile()}, protocol=2))
    with pytest.raises(UserError, match=r"is not part of a plain state dict.*convert it once"):
        load_torch_state_dict(bad)
    assert not marker.exists()
    (tmp_path / "legacy.bin").write_bytes(pickle.dumps({"x": 1}))
    with pytest.raises(UserError, match="legacy .pre-zip. torch file"):
        load_torch_state_dict(tmp_path / "legacy.bin")


def test_the_torch_zip_reader_reads_strided_views_and_every_dtype_it_names(tmp_path):
    tensors = {
        "h": np.arange(12, dtype=np.float16).reshape(3, 4),
        "f": np.linspace(-1, 1, 5, dtype=np.float32),
        "i": np.array([3, -1], np.int64),
        "b": np.array([True, False, True]),
    }
    write_torch_zip(tmp_path / "w.bin", tensors)
    read = load_torch_state_dict(tmp_path / "w.bin")
    assert sorted(read) == sorted(tensors)
    for name, value in tensors.items():
        assert np.array_equal(np.array(read[name]), value), name


def test_both_formats_parse_the_same_settings():
    safeailab = {
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 48,
        "vocab_size": 8,
        "draft_vocab_size": 5,
        "rope_theta": 500000.0,
        "num_hidden_layers": 1,
    }
    speculators = {
        "speculators_model_type": "eagle3",
        "draft_vocab_size": 5,
        "eagle_aux_hidden_state_layer_ids": [2, 4, 5],
        "transformer_layer_config": {**safeailab, "model_type": "llama", "rope_parameters": {"rope_theta": 500000.0}},
        "speculators_config": {"verifier": {"name_or_path": "meta-llama/Llama-3.1-8B-Instruct"}},
    }
    a, b = parse_eagle3_config(safeailab, "a"), parse_eagle3_config(speculators, "b")
    for key in ("hidden_size", "num_key_value_heads", "head_dim", "draft_vocab_size", "rope_theta"):
        assert getattr(a, key) == getattr(b, key), key
    assert (a.source_format, b.source_format) == ("safeailab", "speculators")
    assert b.base_model == "meta-llama/Llama-3.1-8B-Instruct" and b.aux_layer_ids == (2, 4, 5)


def test_generate_with_an_eagle3_head_from_the_command_line(cli_run, tmp_path):
    """A SafeAILab directory loads unchanged from the command line: --eagle greedy equals --no-draft, in mode eagle3;
    a directory that is no EAGLE head gets one line."""
    target_dir = save_tiny_model_dir(tmp_path / "target", "llama", seed=1, num_hidden_layers=8)
    head_dir = save_safeailab_eagle3(tmp_path / "eagle3", target_of(), "bin")  # the same config
    common = ("generate", "abcab", "--model", target_dir, "--max-tokens", "12", "--json")
    code, plain, err = cli_run(*common, "--no-draft")
    assert code == 0, err
    for extra in (("-k", "3"), ("-k", "3", "--tree-topk", "2", "--tree-nodes", "6")):
        code, out, err = cli_run(*common, "--eagle", head_dir, *extra)
        assert code == 0, err
        result = json.loads(out)
        assert result["mode"].startswith("eagle3") and result["stats"]["drafted"] > 0
        assert result["tokens"] == json.loads(plain)["tokens"]
    assert_one_line(cli_run(*common, "--eagle", target_dir), "is not an EAGLE head")


# The whole suite (CI) runs it; the quick run keeps one train-heads round trip (test_feature_heads) within 8 minutes.
@pytest.mark.slow
def test_train_heads_eagle3_writes_a_safeailab_head_that_loads_drafts_exactly_and_resumes(cli_run, tmp_path):
    """A few steps on a tiny target: the result is SafeAILab's layout (config.json with draft_vocab_size and the
    tapped layers named, d2t/t2d over the most frequent tokens), loads with --eagle and decodes exactly; a second
    run on the same --out resumes; a head trained on another base is refused by its fingerprint."""
    target_dir = save_tiny_model_dir(tmp_path / "target", "llama", seed=1, num_hidden_layers=4)
    out = tmp_path / "eagle3"
    train = ("train-heads", "--kind", "eagle3", "--model", target_dir, "--out", out, "--steps", "3", "--seq-len", "80")
    code, _, err = cli_run(*train, "--distill-sequences", "8", "--batch-size", "2", "--draft-vocab", "6")
    assert code == 0, err
    assert "sampled at T=0.7" in err and "held-out greedy acceptance by depth" in err
    raw = json.loads((out / "config.json").read_text())
    assert raw["draft_vocab_size"] == 6 and raw["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert len(raw["mlxspec"]["acceptance"]) == 6
    common = ("generate", "abcab", "--model", target_dir, "--max-tokens", "12", "--json", "-k", "3")
    code, plain, err = cli_run(*common[:-2], "--no-draft")
    code, out_json, err = cli_run(*common, "--eagle", out)
    assert code == 0, err
    assert json.loads(out_json)["tokens"] == json.loads(plain)["tokens"] and json.loads(out_json)["mode"] == "eagle3"
    code, _, err = cli_run(
        *train, "--steps", "4", "--distill-sequences", "8", "--batch-size", "2", "--draft-vocab", "6"
    )
    assert code == 0 and "resumed at step 3" in err, err
    other = save_tiny_model_dir(tmp_path / "other", "llama", seed=2, num_hidden_layers=4)
    assert_one_line(cli_run("generate", "ab", "--model", other, "--eagle", out), "was trained on base model")
