"""Hydra heads: the tree drafts what the trained (teacher-forced) view computes, sampling stays exact, and
`train-heads --kind hydra` writes heads that load with --medusa, decode exactly and resume."""

import json

import mlx.core as mx
import numpy as np
import pytest
from helpers import assert_one_line, speculative_tokens
from mlx.utils import tree_map
from stats import ALPHA, chi_square_pvalue
from test_engine_exactness import exact_joint
from tiny import make_tiny, save_tiny_model_dir

from mlxspec.decoding.sampling import SamplingConfig
from mlxspec.decoding.target_features import output_head, text_model
from mlxspec.drafting.heads.hydra import HydraDrafter, HydraHeads, level_plan
from mlxspec.drafting.heads.medusa import MedusaConfig, load_medusa, save_medusa


def random_hydra(model, num_heads=3, seed=3, config: dict | None = None) -> HydraHeads:
    config = config or model.config
    config = MedusaConfig(num_heads, config["hidden_size"], config["vocab_size"], style="hydra")
    heads = HydraHeads(config)
    mx.random.seed(seed)
    heads.update(tree_map(lambda p: mx.random.normal(p.shape), heads.parameters()))
    return heads


def test_level_plan_names_each_nodes_parent_among_the_previous_depth():
    paths = [(0,), (1,), (0, 0), (1, 0), (0, 1), (0, 0, 0)]
    plan = [(p.tolist(), r.tolist()) for p, r in level_plan(paths)]
    assert plan == [([0, 0], [0, 1]), ([0, 1, 0], [0, 0, 1]), ([0], [0])]


def test_the_drafted_chain_is_what_the_teacher_forced_heads_choose():
    """Drafting and training compute the same function: feeding the drafted chain back teacher-forced, head d's
    argmax at the drafting position is the chain's d-th token (and head 1 read the pending token)."""
    target = make_tiny("llama", seed=0)
    heads = random_hydra(target, num_heads=4)
    history = [1, 2, 3, 4, 5]
    hidden = text_model(target).model(mx.array([history[:-1]]))  # rows up to the token before the pending one
    drafter = HydraDrafter(heads, target)
    drafter.prefill(history)
    drafter.set_hidden(hidden[0])
    chain = drafter.propose(4, None).tokens.tolist()
    assert len(chain) == 4
    embed = text_model(target).model.embed_tokens
    following = mx.array([[history[-1], *chain, 0]])  # the tokens after the drafting position, then padding
    rows = mx.concatenate([hidden[:, -1:], mx.zeros((1, 4, hidden.shape[-1]))], axis=1)
    outs = heads.teacher_forced(rows, embed(following), output_head(target))
    assert [int(mx.argmax(logits[0, 0]).item()) for logits in outs] == chain


def test_a_hydra_tree_holds_each_nodes_own_guesses():
    """Depth-2 nodes under different depth-1 tokens get different guesses: each node carries its own state."""
    target = make_tiny("llama", seed=0)
    heads = random_hydra(target, num_heads=2)
    drafter = HydraDrafter(heads, target, tree_nodes=6, tree_topk=2)
    drafter.prefill([1, 2, 3])
    drafter.set_hidden(text_model(target).model(mx.array([[1, 2]]))[0])
    draft = drafter.propose(2, None)
    parents = draft.shape.parents
    tokens = draft.tokens.tolist()
    embed, head = text_model(target).model.embed_tokens, output_head(target)
    root = heads.blocks[0](drafter.hidden[None], embed(mx.array([3])))  # head 1 reads the pending token
    depth_two = 0
    for node, parent in enumerate(parents[1:], start=1):
        state = root
        if parent > 0:  # a depth-2 node: its parent's token folded into the root state
            state = heads.blocks[1](root, embed(mx.array([tokens[parent - 1]])))
            depth_two += 1
        order = mx.argsort(-head(state)[0]).tolist()
        assert tokens[node - 1] == order[drafter.paths[node - 1][-1]]
    assert depth_two >= 2 and len({parents[n] for n in range(1, len(parents)) if parents[n] > 0}) == 2


@pytest.mark.parametrize(
    "sampling",
    [
        pytest.param(SamplingConfig(1.0), id="T1", marks=pytest.mark.slow),
        pytest.param(SamplingConfig(0.7, top_p=0.9), id="T0.7-top-p", marks=pytest.mark.slow),  # T1 stays quick
    ],
)
def test_hydra_tree_samples_follow_the_target_distribution(sampling):
    """Chi-square of 3000 seeded runs (3 tokens, vocab 8) against the enumerated law; false alarm 1e-3."""
    target = make_tiny("llama", seed=0, logit_scale=3.0)
    heads = random_hydra(target)
    prompt, length = [1, 2, 1], 3
    counts = np.zeros([8] * length)
    for seed in range(3000):
        drafter = HydraDrafter(heads, target, tree_nodes=6, tree_topk=2)
        out = speculative_tokens(
            target, None, prompt, length, num_draft=3, sampling=sampling, seed=seed, drafter=drafter
        )
        counts[tuple(out)] += 1
    assert chi_square_pvalue(counts, exact_joint(target, prompt, sampling, length)) > ALPHA


# The whole suite (CI) runs it; the quick run keeps one train-heads round trip (test_feature_heads) within 8 minutes.
@pytest.mark.slow
def test_train_heads_hydra_writes_heads_that_load_with_medusa_decode_exactly_and_resume(cli_run, tmp_path):
    target_dir = save_tiny_model_dir(tmp_path / "target", "llama", seed=1, num_hidden_layers=4)
    out = tmp_path / "hydra"
    train = ("train-heads", "--kind", "hydra", "--model", target_dir, "--out", out, "--seq-len", "80")
    code, _, err = cli_run(*train, "--steps", "3", "--distill-sequences", "8", "--batch-size", "2")
    assert code == 0, err
    assert "sampled at T=0.7" in err and "(target's greedy)" in err
    config = json.loads((out / "medusa_config.json").read_text())
    assert config["style"] == "hydra" and len(config["topk_accuracy"]) == 4
    common = ("generate", "abcab", "--model", target_dir, "--max-tokens", "12", "--json", "-k", "3")
    _, plain, _ = cli_run(*common[:-2], "--no-draft")
    for topk in ("1", "2"):
        code, got, err = cli_run(*common, "--medusa", out, "--tree-topk", topk)
        assert code == 0, err
        assert json.loads(got)["tokens"] == json.loads(plain)["tokens"]
    code, _, err = cli_run(*train, "--steps", "4", "--distill-sequences", "8", "--batch-size", "2")
    assert code == 0 and "resumed at step 3" in err, err
    other = save_tiny_model_dir(tmp_path / "other", "llama", seed=2, num_hidden_layers=4)
    refused = cli_run("generate", "ab", "--model", other, "--medusa", out)
    assert_one_line(refused, "Hydra heads trained on base model", "--kind hydra")


def test_heads_of_an_unknown_style_are_refused_by_name(cli_run, tmp_path):
    target_dir = save_tiny_model_dir(tmp_path / "target", "llama", seed=1)
    from mlxspec.loading import load_model

    target = load_model(target_dir)
    heads = random_hydra(target.model, config=target.config)
    from mlxspec.drafting.heads.files import base_model_identity

    heads.config.base_model_identity = base_model_identity(target_dir)
    save_medusa(heads, tmp_path / "heads")
    assert load_medusa(tmp_path / "heads", target_dir).config.style == "hydra"
    raw = json.loads((tmp_path / "heads" / "medusa_config.json").read_text())
    (tmp_path / "heads" / "medusa_config.json").write_text(json.dumps({**raw, "style": "gorgon"}))
    assert_one_line(cli_run("generate", "ab", "--model", target_dir, "--medusa", tmp_path / "heads"), "'gorgon'")
