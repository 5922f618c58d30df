"""Feature heads from the command line and the bench bed: --eagle and --mtp, train-heads, and widening a head."""

import mlx.core as mx
import pytest
from helpers import assert_one_line
from mlx.utils import tree_map

from mlxspec.bench.widen import WidenSpec, widen, widen_head
from mlxspec.decoding.target_features import forward_with_hidden
from mlxspec.drafting.heads.feature_head import HeadOnTarget, new_eagle_head, save_head
from mlxspec.loading import load_model

G = ("generate", "abcabc", "--max-tokens", "12", "--json")


@pytest.fixture(scope="module")
def eagle_dir(tiny_dirs, tmp_path_factory):
    target = load_model(tiny_dirs["target"])
    head = new_eagle_head(target.config, target.path)
    mx.random.seed(0)
    head.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.3, head.parameters()))
    out = tmp_path_factory.mktemp("eagle")
    save_head(head, out)
    return out


def test_generate_with_an_eagle_head_equals_plain_greedy(cli_run, tiny_dirs, eagle_dir):  # noqa: F811
    import json

    code, out, err = cli_run(*G, "--model", tiny_dirs["target"], "--eagle", eagle_dir, "-k", "3")
    assert code == 0, err
    drafted = json.loads(out)
    code, out, err = cli_run(*G, "--model", tiny_dirs["target"], "--no-draft")
    assert drafted["tokens"] == json.loads(out)["tokens"] and drafted["mode"] == "eagle"
    assert drafted["stats"]["drafted"] > 0


def test_bad_feature_head_flags_get_one_line(cli_run, tiny_dirs, eagle_dir, tmp_path):  # noqa: F811
    assert_one_line(cli_run(*G, "--model", tiny_dirs["draft"], "--eagle", eagle_dir), "trained on base model")
    assert_one_line(cli_run(*G, "--eagle", tmp_path), "has no eagle_config.json")
    assert_one_line(cli_run(*G, "--eagle", eagle_dir, "--medusa", eagle_dir), "two drafters")
    assert_one_line(cli_run(*G, "--eagle", eagle_dir, "--no-draft"), "--no-draft contradicts --eagle")
    assert_one_line(cli_run(*G, "--model", tiny_dirs["target"], "--mtp"), "model_type 'llama' has no native MTP")


def test_train_heads_never_overwrites_a_finished_head_and_checks_its_sizes(cli_run, tmp_path):  # noqa: F811
    out = tmp_path / "eagle"
    out.mkdir()
    (out / "eagle_config.json").write_text("{}")
    assert_one_line(cli_run("train-heads", "--kind", "eagle", "--out", out, "--steps", 1), "already holds trained")
    assert (out / "eagle_config.json").read_text() == "{}"
    assert_one_line(cli_run("train-heads", "--kind", "eagle", "--out", tmp_path / "x", "--unroll", 9), "--unroll")
    assert_one_line(
        cli_run("train-heads", "--kind", "eagle", "--out", tmp_path / "x", "--seq-len", 4), "--seq-len 4 is too short"
    )


def test_a_widened_head_on_the_widened_target_keeps_its_function(tiny_dirs):
    target = load_model(tiny_dirs["target"])
    head = new_eagle_head(target.config, target.path)
    mx.random.seed(1)
    head.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.1, head.parameters()))
    spec = WidenSpec(3, 64)
    wide_model, _ = widen(target.model, target.config, spec)
    wide_head = widen_head(head, spec)
    x = mx.array([[1, 2, 3, 4, 5]])
    mask = mx.tril(mx.ones((5, 5), dtype=mx.bool_))
    narrow = HeadOnTarget(head, target.model).step(x, forward_with_hidden(target.model, x, None)[0], mask, None)
    wide = HeadOnTarget(wide_head, wide_model).step(x, forward_with_hidden(wide_model, x, None)[0], mask, None)
    assert mx.allclose(narrow[0], wide[0], atol=1e-4).item()  # the same logits
    dims = target.config["hidden_size"]
    assert mx.allclose(narrow[1], wide[1][..., :dims], atol=1e-4).item() and mx.abs(wide[1][..., dims:]).max() == 0
