"""Driving unmodified mlx-lm models over a candidate tree in one forward pass.

mlx-lm attention takes its mask from `cache.make_mask(...)` and its RoPE offset from `cache.offset`. So, for the
length of one forward pass, each cache answers make_mask with the tree mask, and each attention's RoPE is wrapped
to rotate every token at its own position (prefix + depth) by treating tokens as the batch axis, where
`mx.fast.rope` takes an array offset. No model file is forked.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxspec.cache.recurrent import is_recurrent, leaf_caches
from mlxspec.cache.rollback import make_speculative_cache, model_family, recurrent_family
from mlxspec.decoding.trees import TreeShape, ancestor_mask


@dataclass
class TreeContext:
    """Shared by one model's RoPE wrappers and caches; set only while a tree is being verified."""

    positions: mx.array | None = None  # [N] absolute position of each node
    mask: mx.array | None = None  # [N, N] ancestor mask


class PerTokenRoPE(nn.Module):
    def __init__(self, rope: nn.Module, context: TreeContext):
        super().__init__()
        self.inner = rope
        self._context = context

    def __call__(self, x: mx.array, offset: Any = 0) -> mx.array:
        positions = self._context.positions
        if positions is None or x.shape[-2] != positions.shape[0]:
            return self.inner(x, offset=offset)
        # x: [B, H, N, D] -> [N, H, B, D]: each token becomes a batch row with its own offset.
        return self.inner(x.swapaxes(0, 2), offset=positions).swapaxes(0, 2)


CONTEXT_KEY = "_mlxspec_tree_context"  # in a model's __dict__ (not its parameters): the TreeContext its wrappers read


def tree_context(model: nn.Module) -> TreeContext:
    """The model's TreeContext. On first use every attention's `rope` is wrapped (once per model, walking the module
    tree once); the wrappers pass through to the original RoPE whenever the context is empty, i.e. outside a tree
    pass, so plain forwards on the model are unchanged."""
    context = model.__dict__.get(CONTEXT_KEY)
    if context is None:
        context = TreeContext()
        for _, module in model.named_modules():
            rope = module.get("rope") if isinstance(module, dict) else None
            if isinstance(rope, nn.Module) and not isinstance(rope, PerTokenRoPE):
                module["rope"] = PerTokenRoPE(rope, context)
        model.__dict__[CONTEXT_KEY] = context
    return context


def _stored_start(layer_cache: Any, num_new: int) -> int:
    """Absolute position of the first key the layer will return on its next update."""
    start = getattr(layer_cache, "start", 0)
    drop = getattr(layer_cache, "_drop_before_update", None)
    return start + (drop() if drop else 0)


def _tree_make_mask(
    layer_cache: Any,
    context: TreeContext,
    N: int,
    window_size: int | None = None,
    return_array: bool = False,
    **kwargs: Any,
) -> mx.array:
    """[N, stored + N] bool: every node sees the whole prefix and its own ancestors, within any sliding window."""
    prefix_positions = mx.arange(_stored_start(layer_cache, N), layer_cache.offset)
    key_positions = mx.concatenate([prefix_positions, context.positions])
    mask = mx.concatenate([mx.ones((N, prefix_positions.shape[0]), dtype=mx.bool_), context.mask], axis=1)
    window = window_size or getattr(layer_cache, "window", None)
    if window:
        mask = mask & (key_positions[None] > context.positions[:, None] - window)
    return mask


@contextmanager
def tree_verification(model: nn.Module, cache: list[Any], shape: TreeShape, prefix_length: int):
    """Within this block, a forward over shape.size tokens attends as the tree says; afterwards the caches are as
    before and the model's RoPE wrappers (installed once, tree_context) pass through again."""
    context = tree_context(model)
    context.positions, context.mask = prefix_length + mx.array(shape.depths), ancestor_mask(shape)
    attention = [c for c in leaf_caches(cache) if not is_recurrent(c)]
    for layer_cache in attention:
        layer_cache.make_mask = partial(_tree_make_mask, layer_cache, context)  # instance attribute wins
    try:
        yield
    finally:
        context.positions = context.mask = None
        for layer_cache in attention:
            del layer_cache.make_mask


def _select(buffer: Any, start: int, index: mx.array) -> Any:
    if isinstance(buffer, (tuple, list)):  # QuantizedKVCache: (packed, scales, biases)
        return type(buffer)(_select(b, start, index) for b in buffer)
    buffer[..., start : start + index.shape[0], :] = buffer[..., start + index, :]
    return buffer


def keep_tree_path(cache: list[Any], prefix_length: int, keep: list[int]) -> None:
    """After a tree pass, keep the prefix and the kept nodes (tree indices, root first) contiguously; drop the rest."""
    index = mx.array(keep)
    for layer_cache in leaf_caches(cache):
        start = prefix_length - getattr(layer_cache, "start", 0)  # where the tree begins in the stored buffer
        if keep != list(range(len(keep))):
            layer_cache.keys = _select(layer_cache.keys, start, index)
            layer_cache.values = _select(layer_cache.values, start, index)
        layer_cache.offset = prefix_length + len(keep)


# Families a tree pass has been checked on, by model: (weak reference, whether it gave each node its path's logits).
_TREE_CHECKED: dict[int, tuple[weakref.ref, bool]] = {}


def tree_supported(model: nn.Module, make_cache) -> bool:
    """Whether one tree pass gives a node the logits of its own path on this model, checked once per model.

    Families whose positions or masks do not come from `cache.offset`, `cache.make_mask` and a `rope` module
    (learned position tables, hand-written attention) would otherwise verify trees wrongly. The check: after a
    3-token prefix, a root with two children; the second child must see the prefix and the root only, at depth 1,
    exactly as decoding [prefix, root, child] does. `make_cache` builds a fresh rollback-safe cache."""
    entry = _TREE_CHECKED.get(id(model))
    if entry is not None and entry[0]() is model:
        return entry[1]
    prefix, nodes = [0, 1, 2], [3, 1, 2]
    cache = make_cache()
    # One forward per evaluation: a pipeline-sharded model must run its sends and receives in the same order on
    # every rank, which two forwards in one graph do not guarantee.
    model(mx.array(prefix)[None], cache=cache)
    mx.eval([c.state for c in cache])
    with tree_verification(model, cache, TreeShape((-1, 0, 0)), len(prefix)):
        tree_logits = model(mx.array(nodes)[None], cache=cache)[0, 2]
    mx.eval(tree_logits)
    path_logits = model(mx.array(prefix + [nodes[0], nodes[2]])[None], cache=make_cache())[0, -1]
    scale = mx.abs(path_logits).max() + 1e-6
    supported = bool((mx.abs(tree_logits - path_logits).max() / scale < 1e-3).item())
    _TREE_CHECKED[id(model)] = (weakref.ref(model), supported)
    return supported


def tree_refusal(model: nn.Module) -> str | None:
    """Why a tree cannot be verified on this model, in words naming its family, or None where it can."""
    family = model_family(model)
    if recurrent_family(model):
        return f"{family} keeps recurrent state, which a tree would need per branch"
    if not tree_supported(model, lambda: make_speculative_cache(model, max_rollback=4)):
        return f"{family} takes positions or masks in a way mlxspec's tree pass cannot drive (checked on this model)"
    return None
