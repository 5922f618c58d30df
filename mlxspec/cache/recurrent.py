"""Exact rollback for layer state that cannot be trimmed: SSM, linear-attention and RWKV states (`ArraysCache`).

A recurrent layer folds every token it sees into a fixed-size state, so a rejected draft cannot be cut out of it.
MLX arrays are immutable and mlx-lm's layers replace their `ArraysCache` entries rather than write into them, so
keeping references to the entries before a forward is a free snapshot; putting them back rewinds the layer.

Rolling back a cache then means: restore the recurrent layers to a snapshot and trim every attention layer by the
tokens fed since it. The engine re-feeds the accepted tokens at the front of its next verify pass (deferred
replay); a draft model keeps one snapshot per single-token step instead, so its rollback needs no replay.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, QuantizedKVCache, make_prompt_cache

Snapshot = list[list[Any]]  # per recurrent layer, its state arrays (references; nothing is copied)


def leaf_caches(cache: list[Any]) -> list[Any]:
    """Every per-layer cache, with mlx-lm's CacheList (several caches for one layer) opened up."""
    leaves = []
    for layer_cache in cache:
        leaves.extend(layer_cache.caches if isinstance(layer_cache, CacheList) else [layer_cache])
    return leaves


def is_recurrent(layer_cache: Any) -> bool:
    return isinstance(layer_cache, ArraysCache)


def recurrent_leaves(cache: list[Any]) -> list[ArraysCache]:
    """The layers that a rollback must restore from a snapshot (empty for a pure attention model)."""
    return [c for c in leaf_caches(cache) if is_recurrent(c)]


def snapshot(leaves: list[ArraysCache]) -> Snapshot:
    """The recurrent layers' state now: references to their arrays (free)."""
    return [list(c.cache) for c in leaves]


def restore(leaves: list[ArraysCache], state: Snapshot) -> None:
    for layer_cache, arrays in zip(leaves, state, strict=True):
        layer_cache.cache = list(arrays)


def trim_attention(cache: list[Any], num_tokens: int) -> None:
    """Drop the last num_tokens positions of every trimmable layer; recurrent layers are left to `restore`."""
    if num_tokens <= 0:
        return
    for layer_cache in leaf_caches(cache):
        if is_recurrent(layer_cache):
            continue
        trimmed = layer_cache.trim(num_tokens)
        if trimmed != num_tokens:
            raise RuntimeError(f"{type(layer_cache).__name__} trimmed {trimmed} of {num_tokens} tokens")


def rewind(cache: list[Any], state: Snapshot, num_tokens: int) -> None:
    """Put the cache back to where `state` was taken, `num_tokens` positions ago."""
    restore(recurrent_leaves(cache), state)
    trim_attention(cache, num_tokens)


def copy_prefix(cache: list[Any], num_tokens: int) -> list[Any] | None:
    """A new cache holding the first num_tokens positions of `cache`, which stays as it was (its arrays are sliced,
    never shared: a KV cache writes into its buffer in place); None when a layer's cache is of a kind whose
    positions cannot be sliced out (windows, chunks, recurrent state)."""
    copied = []
    for layer_cache in cache:
        if isinstance(layer_cache, CacheList):
            inner = copy_prefix(list(layer_cache.caches), num_tokens)
            if inner is None:
                return None
            copied.append(CacheList(*inner))
        elif type(layer_cache) is KVCache and layer_cache.keys is not None and layer_cache.offset >= num_tokens:
            fresh = KVCache()
            fresh.keys = layer_cache.keys[..., :num_tokens, :]
            fresh.values = layer_cache.values[..., :num_tokens, :]
            fresh.offset = num_tokens
            copied.append(fresh)
        elif type(layer_cache) is QuantizedKVCache and layer_cache.keys is not None:
            fresh = QuantizedKVCache(group_size=layer_cache.group_size, bits=layer_cache.bits)
            fresh.keys = tuple(x[..., :num_tokens, :] for x in layer_cache.keys)
            fresh.values = tuple(x[..., :num_tokens, :] for x in layer_cache.values)
            fresh.offset = num_tokens
            copied.append(fresh)
        else:
            return None
    return copied


def probe_cache(model) -> list[Any]:
    """The model's own cache after one lazy forward of one token: every array has its shape, nothing is computed
    (MLX is lazy), so a 671B model can be probed without allocating it."""
    cache = make_prompt_cache(model)
    model(mx.zeros((1, 1), dtype=mx.int32), cache=cache)
    return cache
