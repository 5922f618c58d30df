"""The bench bed: a widened model computes the original's function (logits and greedy tokens)."""

import mlx.core as mx
import mlx.utils
import pytest
from helpers import mlx_lm_greedy
from tiny import make_tiny

from mlxspec import UserError
from mlxspec.bench.widen import WidenSpec, widen


def test_a_widened_tiny_llama_has_the_same_logits_and_greedy_tokens():
    model = make_tiny("llama", logit_scale=1.0)
    wide, config = widen(model, model.config, WidenSpec(layers=5, width=64))
    assert config["num_attention_heads"] == 8 and config["num_key_value_heads"] == 4
    assert config["intermediate_size"] == 128 and config["num_hidden_layers"] == 5
    tokens = mx.array([[1, 2, 3, 4, 5, 6, 7, 0, 1, 2]])
    assert mx.allclose(wide(tokens), model(tokens), atol=1e-4).item()
    prompt = [1, 2, 3]
    assert mlx_lm_greedy(wide, prompt, 12) == mlx_lm_greedy(model, prompt, 12)


def test_the_embedded_target_widened_keeps_its_function():
    import mlxspec

    spec = mlxspec.load(draft=None)
    target = spec.target
    wide, config = widen(target.model, target.config, WidenSpec.parse("8x576"))
    prompt = spec.encode("import os\nimport sys\n\n\ndef main(argv):")
    tokens = mx.array(prompt)[None]
    assert mx.allclose(wide(tokens), target.model(tokens), atol=1e-4).item()
    assert mlx_lm_greedy(wide, prompt, 16) == mlx_lm_greedy(target.model, prompt, 16)


@pytest.mark.parametrize("text", ["24", "0x768", "24x700", "1x768", "axb"])
def test_shapes_that_cannot_hold_the_model_are_refused(text):
    model = make_tiny("llama")
    with pytest.raises(UserError, match="--widen"):
        widen(model, model.config, WidenSpec.parse(text))


@pytest.mark.parametrize("style", ["medusa", "hydra"])
def test_widened_medusa_and_hydra_heads_draft_what_the_originals_draft(style):
    """On the widened target the widened heads compute the same logits (zero in every padded channel of their
    states) and so draft the same tree as the originals on the original target."""
    from test_hydra import random_hydra
    from test_medusa import random_heads

    from mlxspec.bench.widen import widen_medusa
    from mlxspec.decoding.target_features import output_head, text_model
    from mlxspec.drafting.heads.medusa import medusa_drafter

    model = make_tiny("llama", logit_scale=1.0)
    heads = random_hydra(model, num_heads=3) if style == "hydra" else random_heads(model, num_heads=3)
    heads.update(mlx.utils.tree_map(lambda p: p * 0.3, heads.parameters()))
    spec = WidenSpec(layers=3, width=64)
    wide_model, _ = widen(model, model.config, spec)
    wide_heads = widen_medusa(heads, spec)
    history = [1, 2, 3, 4, 5, 6]
    drafts = []
    for target, h in ((model, heads), (wide_model, wide_heads)):
        drafter = medusa_drafter(h, target, tree_nodes=6, tree_topk=2)
        drafter.prefill(history)
        drafter.set_hidden(text_model(target).model(mx.array([history[:-1]]))[0])
        drafts.append(drafter.propose(3, None).tokens.tolist())
    assert drafts[0] == drafts[1] and len(drafts[0]) == 6
    hidden = text_model(model).model(mx.array([history]))[0, -1:]
    wide_hidden = text_model(wide_model).model(mx.array([history]))[0, -1:]
    dims = model.config["hidden_size"]
    if style == "hydra":
        embed, wide_embed = text_model(model).model.embed_tokens, text_model(wide_model).model.embed_tokens
        narrow = heads.blocks[0](hidden, embed(mx.array([3])))
        wide = wide_heads.blocks[0](wide_hidden, wide_embed(mx.array([3])))
    else:
        narrow, wide = heads.blocks[0](hidden), wide_heads.blocks[0](wide_hidden)
    assert mx.allclose(narrow, wide[..., :dims], atol=1e-4).item() and mx.abs(wide[..., dims:]).max().item() == 0
    assert mx.allclose(output_head(model)(narrow), output_head(wide_model)(wide), atol=1e-4).item()
