"""What mlx-lm allocates for a config, read off the mlx-lm model itself, built on lazy arrays.

MLX arrays are lazy: building `Model(ModelArgs)` for a 671B config creates graph nodes, not weights, and one
forward of one token over an empty cache gives every cache array its shape without computing anything. So the
planner can count the families its arithmetic (memory_model.py) does not cover, MLA, shared and routed experts,
hybrids with SSM or DeltaNet state, exactly as mlx-lm builds them: parameters, KV bytes per token on each
attention layer, and the constant recurrent state. Nothing here is evaluated; a forward that would need to be is
refused by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

from mlxspec.errors import UserError
from mlxspec.model_files import lazy_model


@dataclass(frozen=True)
class AttentionLayer:
    elements_per_token: int  # keys + values, all heads, one position
    window: int | None  # a sliding-window layer keeps this many positions


@dataclass(frozen=True)
class Layout:
    total_parameters: int
    matrix_parameters: int  # in layers mlx-lm quantizes (Linear, Embedding, expert stacks)
    embedding: int
    lm_head: int
    attention_layers: tuple[AttentionLayer, ...]
    state_elements: int  # recurrent state of one sequence (conv + SSM / DeltaNet), constant in the context
    vocab: int
    widest_activation: int  # the widest matrix output (the MLP or expert intermediate, or the vocabulary)


def _parameter_split(model) -> tuple[int, int, int, int]:
    """(total, in quantizable matrices, embedding, lm_head) parameters."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    total = sum(v.size for _, v in tree_flatten(model.parameters()))
    matrices = embedding = lm_head = 0
    for name, module in model.named_modules():
        weight = module.get("weight") if isinstance(module, nn.Module) else None
        if weight is None or not hasattr(module, "to_quantized"):
            continue
        matrices += weight.size
        if isinstance(module, nn.Embedding):
            embedding += weight.size
        elif name.endswith("lm_head"):
            lm_head += weight.size
    return total, matrices, embedding, lm_head


def _cache_shapes(model) -> tuple[tuple[AttentionLayer, ...], int]:
    """Attention layers and recurrent state elements, from one lazy forward over an empty cache."""
    from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache, RotatingKVCache

    from mlxspec.cache.recurrent import leaf_caches, probe_cache

    layers, state = [], 0
    for leaf in leaf_caches(probe_cache(model)):
        if isinstance(leaf, ArraysCache):
            state += sum(a.size for a in leaf.cache if a is not None)
        elif isinstance(leaf, (KVCache, RotatingKVCache)) and not isinstance(leaf, QuantizedKVCache):
            keys, values = leaf.keys, leaf.values
            per_token = (keys.size + values.size) // keys.shape[-2]
            window = leaf.max_size if isinstance(leaf, RotatingKVCache) else None
            layers.append(AttentionLayer(per_token, window))
        else:
            raise UserError(
                f"{config_family(model)} keeps a {type(leaf).__name__} cache, which the planner cannot count"
            )
    return tuple(layers), state


def config_family(model) -> str:
    return getattr(getattr(model, "args", None), "model_type", type(model).__module__)


@lru_cache(maxsize=32)
def _layout(config_json: str) -> Layout:
    config = json.loads(config_json)
    model = lazy_model(config)
    total, matrices, embedding, lm_head = _parameter_split(model)
    attention, state = _cache_shapes(model)
    widest = max(
        (m.weight.shape[-2] for _, m in model.named_modules() if hasattr(m, "to_quantized") and "weight" in m),
        default=0,
    )
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return Layout(total, matrices, embedding, lm_head, attention, state, text.get("vocab_size", 0), widest)


def layout(config: dict) -> Layout:
    """The layout of the mlx-lm model `config` describes (cached per config)."""
    return _layout(json.dumps(config, sort_keys=True))
