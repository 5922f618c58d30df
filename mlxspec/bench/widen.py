"""Function-preserving widening: the bench bed where a target forward is bandwidth-bound, as real targets are.

The embedded target (11M parameters) is dispatch-bound: its forward pass is mostly per-op overhead, so it says
nothing about speculation on a real model. Widening it keeps its function exactly (the same logits, up to float
rounding) while giving it the weight traffic of a bigger model:

- hidden channels, attention heads (query and key/value alike, so grouping is kept) and MLP units are zero-padded;
- RMSNorm over W channels of which d are live divides by sqrt(d/W) times the original norm, so norm weights are
  scaled by sqrt(d/W) and eps by d/W;
- extra layers with random weights but zero output projections (o_proj, down_proj) add nothing to the residual.

Llama-family models only (the embedded target is one). Nothing large is written unless asked
(models/recipes/widen_model.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from mlxspec.errors import UserError

WIDENABLE = ("llama", "mistral")
MAX_WIDENED_PARAMETERS = 20e9  # a bed must fit the machine it runs on; this is already 80 GB in float32


@dataclass(frozen=True)
class WidenSpec:
    layers: int
    width: int

    @classmethod
    def parse(cls, text: str) -> WidenSpec:
        """'24x768' -> 24 layers of width 768."""
        match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", str(text))
        if not match or min(int(match.group(1)), int(match.group(2))) < 1:
            raise UserError(f"--widen {text!r} is not LAYERSxWIDTH; write it like 24x768")
        layers, width = int(match.group(1)), int(match.group(2))
        parameters = 12 * layers * width**2  # attention and MLP of a llama-shaped layer, roughly
        if parameters > MAX_WIDENED_PARAMETERS:
            raise UserError(
                f"--widen {layers}x{width} would build about {parameters / 1e9:,.0f}B parameters in memory; "
                f"benchmark beds stay under {MAX_WIDENED_PARAMETERS / 1e9:.0f}B (24x768 is 0.17B)"
            )
        return cls(layers, width)


def widened_config(config: dict, spec: WidenSpec) -> dict:
    """The config of the widened model, refusing shapes that cannot hold the original's function."""
    if config.get("model_type") not in WIDENABLE:
        raise UserError(f"--widen supports {', '.join(WIDENABLE)} models, not {config.get('model_type')!r}")
    d, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim") or d // heads
    group = heads // kv_heads
    new_heads = spec.width * heads // d
    if "quantization" in config:
        raise UserError("--widen needs a float model; widen the float target, then quantize the result")
    if spec.width < d or spec.layers < layers or spec.width * heads % d or new_heads % group:
        raise UserError(
            f"--widen {spec.layers}x{spec.width} cannot hold a {layers}x{d} model with {heads} heads in groups of "
            f"{group}: use at least {layers} layers and a width of at least {d}, a multiple of {head_dim * group}"
        )
    scale = spec.width / d
    return {
        **config,
        "hidden_size": spec.width,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": new_heads,
        "num_key_value_heads": new_heads // group,
        "head_dim": head_dim,
        "intermediate_size": round(config["intermediate_size"] * scale),
        "rms_norm_eps": config.get("rms_norm_eps", 1e-6) / scale,
    }


def _pad(array: mx.array, shape: tuple[int, ...]) -> mx.array:
    """array in the leading corner of zeros of `shape`."""
    return mx.pad(array, [(0, n - o) for o, n in zip(array.shape, shape)])


def widen(model: nn.Module, config: dict, spec: WidenSpec, seed: int = 0) -> tuple[nn.Module, dict]:
    """(the widened mlx-lm model, its config): the same function as `model` at the memory traffic of the new size."""
    from mlx_lm.utils import _get_classes

    new_config = widened_config(config, spec)
    model_class, args_class = _get_classes(new_config)
    wide = model_class(args_class.from_dict(new_config))
    norm_scale = math.sqrt(config["hidden_size"] / spec.width)
    old = dict(tree_flatten(model.parameters()))
    new = dict(tree_flatten(wide.parameters()))
    mx.random.seed(seed)
    out = {}
    for name, param in new.items():
        if name in old:
            source = old[name]
            if name.endswith("norm.weight"):
                source = source * norm_scale
            out[name] = _pad(source.astype(param.dtype), param.shape)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            out[name] = mx.zeros(param.shape, param.dtype)  # an extra layer adds nothing to the residual
        elif name.endswith("norm.weight"):
            out[name] = mx.ones(param.shape, param.dtype)
        else:  # an extra layer's other weights: random, so they cost what real weights cost
            out[name] = (0.02 * mx.random.normal(param.shape)).astype(param.dtype)
    wide.update(tree_unflatten(list(out.items())))
    mx.eval(wide.parameters())
    return wide, new_config


def _widen_halves(source: mx.array, shape: tuple[int, ...], d: int, width: int) -> mx.array:
    """A [d, 2d] weight reading two d-wide inputs side by side, as [width, 2 * width] reading the live channels of
    each width-wide input and writing the live channels."""
    wide = mx.zeros(shape, source.dtype)
    wide[:d, :d] = source[:, :d]
    wide[:d, width : width + d] = source[:, d:]
    return wide


def widen_head(head, spec: WidenSpec):
    """An EAGLE head of the widened target with the same function: the widened target's features are the original
    ones zero-padded, so fc reads the live channels of [embedding ; feature] and writes the live channels; the block
    is widened as the target's layers are."""
    from mlxspec.drafting.heads.feature_head import FeatureHead, FeatureHeadConfig

    d = head.config.hidden_size
    block_config = widened_config({**head.config.block_config, "num_hidden_layers": 1}, WidenSpec(1, spec.width))
    config = FeatureHeadConfig(**{**head.config.__dict__, "block_config": block_config})
    config.norm_eps = head.config.norm_eps * d / spec.width
    wide = FeatureHead(config)
    norm_scale = math.sqrt(d / spec.width)
    new = dict(tree_flatten(wide.parameters()))
    out = {}
    for name, source in tree_flatten(head.parameters()):
        if name == "fc.weight":  # [d, 2d] -> [W, 2W]: the embedding half, then the feature half
            out[name] = _widen_halves(source, new[name].shape, d, spec.width)
        else:
            scaled = source * norm_scale if name.endswith("norm.weight") else source
            out[name] = _pad(scaled, new[name].shape)
    wide.update(tree_unflatten(list(out.items())))
    mx.eval(wide.parameters())
    return wide


def widen_dflash(model, spec: WidenSpec, target_layers: int):
    """A DFlash drafter of the widened target with the same function. The widened target's layers 0..n-1 output the
    original ones zero-padded (its extra layers add nothing), so the taps keep their ids; fc reads the live
    channels of each tap and writes the live channels; the drafter's layers are widened as the target's are (its
    per-head q/k norms keep their size and epsilon)."""
    from dataclasses import replace

    from mlxspec.drafting.dflash.model import DFlashDraftModel

    config = model.config
    d, W = config.hidden_size, spec.width
    widened = widened_config(
        {
            "model_type": "llama",
            "hidden_size": d,
            "num_hidden_layers": config.num_hidden_layers,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads,
            "head_dim": config.head_dim,
            "intermediate_size": config.intermediate_size,
            "rms_norm_eps": config.rms_norm_eps,
        },
        WidenSpec(config.num_hidden_layers, W),
    )
    wide_config = replace(
        config,
        hidden_size=W,
        num_attention_heads=widened["num_attention_heads"],
        num_key_value_heads=widened["num_key_value_heads"],
        intermediate_size=widened["intermediate_size"],
        rms_norm_eps=widened["rms_norm_eps"],
        num_target_layers=target_layers,
    )
    wide = DFlashDraftModel(wide_config)
    for layer in wide.layers:  # over head_dim channels, all live: as they were
        layer.self_attn.q_norm.eps = layer.self_attn.k_norm.eps = config.rms_norm_eps
    norm_scale = math.sqrt(d / W)
    new = dict(tree_flatten(wide.parameters()))
    out = {}
    for name, source in tree_flatten(model.parameters()):
        if name == "fc.weight":  # [d, n*d] -> [W, n*W]: tap j's live channels sit at j*W
            wide_fc = mx.zeros(new[name].shape, source.dtype)
            for j in range(len(config.target_layer_ids)):
                wide_fc[:d, j * W : j * W + d] = source[:, j * d : (j + 1) * d]
            out[name] = wide_fc
        else:
            per_head = name.endswith(("q_norm.weight", "k_norm.weight"))
            scaled = source * norm_scale if name.endswith("norm.weight") and not per_head else source
            out[name] = _pad(scaled, new[name].shape)
    wide.update(tree_unflatten(list(out.items())))
    mx.eval(wide.parameters())
    return wide


def widen_medusa(heads, spec: WidenSpec):
    """Medusa or Hydra heads of the widened target with the same function: the widened target's final hidden state
    and embeddings are the original ones zero-padded, so every weight is zero-padded (a padded channel stays zero
    through h + silu(W h + b)); a Hydra head's mix reads the live channels of [state ; embedding], and its token
    norm is scaled as the target's norms are."""
    from dataclasses import replace

    from mlxspec.drafting.heads.medusa import heads_class

    d, W = heads.config.hidden_size, spec.width
    wide = heads_class(heads.config)(replace(heads.config, hidden_size=W))
    for block in wide.blocks if heads.config.style == "hydra" else ():
        block.token_norm.eps = block.token_norm.eps * d / W
    norm_scale = math.sqrt(d / W)
    new = dict(tree_flatten(wide.parameters()))
    out = {}
    for name, source in tree_flatten(heads.parameters()):
        if name.endswith("mix.weight"):  # [d, 2d] -> [W, 2W]: the state half, then the embedding half
            out[name] = _widen_halves(source, new[name].shape, d, W)
        else:
            scaled = source * norm_scale if name.endswith("norm.weight") else source
            out[name] = _pad(scaled, new[name].shape)
    wide.update(tree_unflatten(list(out.items())))
    mx.eval(wide.parameters())
    return wide
