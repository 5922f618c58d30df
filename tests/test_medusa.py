"""Medusa heads: exact drafting on every family, the sparse tree, training, and the base-model check."""

import mlx.core as mx
import numpy as np
import pytest
from helpers import speculative_tokens
from mlx.utils import tree_map
from stats import ALPHA, chi_square_pvalue
from test_engine_exactness import exact_joint
from tiny import FAMILIES, make_tiny

from mlxspec import UserError
from mlxspec.decoding.sampling import SamplingConfig
from mlxspec.decoding.target_features import forward_with_hidden
from mlxspec.decoding.trees import sparse_tree
from mlxspec.drafting.heads.medusa import (
    MedusaConfig,
    MedusaDrafter,
    MedusaHeads,
    load_medusa,
)
from mlxspec.loading import load_model
from mlxspec.train.medusa import MedusaTrainConfig, train_medusa


def random_heads(model, num_heads=3, seed=3):
    config = MedusaConfig(
        num_heads=num_heads, hidden_size=model.config["hidden_size"], vocab_size=model.config["vocab_size"]
    )
    heads = MedusaHeads(config)
    mx.random.seed(seed)
    heads.update(tree_map(lambda p: mx.random.normal(p.shape), heads.parameters()))
    return heads


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_forward_with_hidden_gives_the_models_own_logits(family):
    model = make_tiny(family)
    x = mx.array([[1, 2, 3, 4, 5]])
    _, logits = forward_with_hidden(model, x, None)
    assert mx.array_equal(logits, model(x)).item()


@pytest.mark.parametrize(
    "sampling",
    [
        # both in the whole suite: the quick run keeps Medusa's tree law in the every-family tree test (test_trees)
        pytest.param(SamplingConfig(1.0), id="T1", marks=pytest.mark.slow),
        pytest.param(SamplingConfig(0.7, top_p=0.9), id="T0.7-top-p", marks=pytest.mark.slow),
    ],
)
def test_medusa_tree_samples_follow_the_target_distribution(sampling):
    """Chi-square of 3000 seeded runs (3 tokens, vocab 8) against the enumerated law; false alarm 1e-3."""
    target = make_tiny("llama", seed=0, logit_scale=3.0)
    heads = random_heads(target)
    prompt, length = [1, 2, 1], 3
    counts = np.zeros([8] * length)
    for seed in range(3000):
        drafter = MedusaDrafter(heads, target, tree_nodes=6, tree_topk=2)
        out = speculative_tokens(
            target, None, prompt, length, num_draft=3, sampling=sampling, seed=seed, drafter=drafter
        )
        counts[tuple(out)] += 1
    assert chi_square_pvalue(counts, exact_joint(target, prompt, sampling, length)) > ALPHA


def test_sparse_tree_picks_the_most_probable_paths_parents_first():
    accuracy = [[0.6, 0.2, 0.1], [0.5, 0.2, 0.1], [0.4, 0.1, 0.1]]
    paths = sparse_tree(accuracy, max_nodes=5, max_topk=3)
    # probabilities: (0)=.6 (0,0)=.3 (1)=.2 (0,1)=.12 (0,0,0)=.12 (2)=.1 (1,0)=.1 ...; ties keep insertion order
    assert paths == [(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]
    assert all(p[:-1] in paths or len(p) == 1 for p in paths)


# The whole suite (CI) runs it; the quick run keeps one train-heads round trip (test_feature_heads) within 8 minutes.
@pytest.mark.slow
def test_train_save_load_and_refuse_other_base_models(tiny_dirs, tmp_path):
    target = load_model(tiny_dirs["target"])
    out = tmp_path / "heads"
    config = MedusaTrainConfig(num_heads=2, steps=4, batch_size=2, seq_len=32, eval_windows=4)
    trained = train_medusa(target, out, config, log=lambda s: None)
    assert (out / "medusa.safetensors").exists() and (out / "medusa_config.json").exists()
    assert len(trained.config.topk_accuracy) == 2
    loaded = load_medusa(out, tiny_dirs["target"])
    x = mx.random.normal((3, loaded.config.hidden_size))
    head = lambda h: h @ mx.ones((h.shape[-1], 8))  # noqa: E731
    assert mx.allclose(loaded(x, head), trained(x, head), atol=1e-1).item()  # bf16 storage
    with pytest.raises(UserError, match="trained on base model"):
        load_medusa(out, tiny_dirs["draft"])
    # Resuming a finished run does not train again and gives the same heads.
    again = train_medusa(target, out, config, log=lambda s: None)
    assert mx.allclose(again(x, head), trained(x, head)).item()


@pytest.mark.slow  # 15-60 s on 2 cores: in the whole suite, not the quick run
def test_training_stops_on_a_non_finite_loss_and_saves_nothing(tiny_dirs, tmp_path, monkeypatch):
    import mlxspec.train.medusa as medusa_train

    target = load_model(tiny_dirs["target"])
    monkeypatch.setattr(medusa_train, "head_losses", lambda *args: mx.full((2,), float("nan")))
    out = tmp_path / "heads"
    with pytest.raises(UserError, match="the loss became nan at step 1; .* lower --lr"):
        train_medusa(target, out, MedusaTrainConfig(num_heads=2, steps=3, batch_size=2, seq_len=16), log=lambda s: None)
    assert not (out / "medusa_config.json").exists() and not (out / "checkpoint").exists()


def test_sparse_tree_takes_each_heads_own_number_of_ranks():
    """Heads may report different numbers of ranks; each depth draws only from its own head's."""
    paths = sparse_tree([[0.6, 0.3], [0.5, 0.2, 0.1]], max_nodes=10, max_topk=3)
    assert {p for p in paths if len(p) == 1} == {(0,), (1,)}
    assert (0, 2) in paths and len(paths) == 2 + 2 * 3
    # Depth 1 is scored by head 1's accuracies and depth 2 by head 2's: (1, 0) = .35 * .5 beats (0, 1) = .6 * .25.
    assert sparse_tree([[0.6, 0.35], [0.5, 0.25, 0.1]], max_nodes=4, max_topk=3) == [(0,), (1,), (0, 0), (1, 0)]
