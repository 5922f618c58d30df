"""Target and draft KV caches that can always be rolled back by a speculative step.

mlx-lm's `RotatingKVCache` overwrites its oldest entries in place, so once full it cannot be trimmed, and its
speculative path breaks on sliding-window models. `WindowKVCache` keeps `window + slack` entries instead: the mask
enforces the window exactly, and the slack lets a step drop up to `slack` rejected tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    ChunkedKVCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from mlxspec.cache.recurrent import leaf_caches, probe_cache, recurrent_leaves, trim_attention
from mlxspec.errors import UserError


class WindowKVCache(KVCache):
    """A sliding-window KV cache that stays trimmable by up to `slack` tokens.

    Each query at absolute position t attends to keys at positions (t - window, t], as mlx-lm's RotatingKVCache
    (keep=0) does. Stored entries cover absolute positions [offset - stored, offset).
    """

    def __init__(self, window: int, slack: int):
        super().__init__()
        self.window = window
        self.slack = slack
        self.start = 0  # absolute position of the first stored entry

    def _drop_before_update(self) -> int:
        # Drop in chunks of `step` so the copy is amortized; a pure function of state so make_mask agrees.
        stored = self.offset - self.start
        excess = stored - (self.window + self.slack)
        return excess if excess >= self.step else 0

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        drop = self._drop_before_update()
        if drop:
            used = self.offset - self.start
            self.keys = self.keys[..., drop:used, :]
            self.values = self.values[..., drop:used, :]
            self.start += drop
        # Reuse KVCache's buffer growth with offsets relative to the stored region.
        absolute = self.offset
        self.offset -= self.start
        try:
            out = super().update_and_fetch(keys, values)
        finally:
            self.offset += self.start
        assert self.offset == absolute + keys.shape[2]
        return out

    def make_mask(self, N: int, window_size: int | None = None, return_array: bool = False, **kwargs: Any):
        window = window_size or self.window
        start = self.start + self._drop_before_update()
        queries = mx.arange(self.offset, self.offset + N)[:, None]
        keys = mx.arange(start, self.offset + N)[None]
        mask = (queries >= keys) & (queries < keys + window)
        if N == 1 and not return_array and (self.offset + 1 - start) <= window:
            return None
        return mask

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        # The next query still needs the window - 1 keys before it, unless nothing was ever dropped.
        floor = self.start + self.window - 1 if self.start > 0 else 0
        n = max(0, min(n, self.offset - floor))
        self.offset -= n
        return n

    def size(self) -> int:
        return min(self.offset, self.window)

    @property
    def state(self):
        return self.keys, self.values, self.offset, self.start

    @state.setter
    def state(self, v):
        self.keys, self.values, self.offset, self.start = v

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


@dataclass(frozen=True)
class CacheSpec:
    """What a target cache was built for: a cache kept from one run serves another only with the same spec."""

    max_rollback: int  # positions a step may roll back (sliding-window caches keep that much slack)
    kv_bits: int | None

    def make(self, target: nn.Module) -> list:
        return make_speculative_cache(target, max_rollback=self.max_rollback, kv_bits=self.kv_bits)


def rollback_room(drafter: Any, num_draft: int, max_nodes: int | None) -> int:
    """The most positions one step may feed and then roll back. Plain decoding never rolls back, so it runs on any
    cache, recurrent ones included."""
    if drafter is None:
        return 0
    return max(num_draft, max_nodes or 0, drafter.max_nodes) + 1


def model_family(model: nn.Module) -> str:
    args = getattr(model, "args", None)
    return getattr(args, "model_type", None) or type(model).__module__.rsplit(".", 1)[-1]


def make_speculative_cache(
    model: nn.Module, max_rollback: int, kv_bits: int | None = None, window: int | None = None
) -> list[Any]:
    """The model's own cache layout, with every attention layer made safe to roll back by `max_rollback` tokens.

    `window` turns every full-attention layer into a sliding window of that many tokens (for draft models only:
    it changes what the model computes). Recurrent layers (`ArraysCache`) are kept as they are: they roll back by
    snapshot (recurrent.py). A layer cache of any other kind is refused by name when drafting.
    """
    kv_group_size = quantization_group(model) if kv_bits else None
    convert = lambda c: _rollback_safe(model, c, max_rollback, kv_bits, kv_group_size, window)  # noqa: E731
    layers = lambda: [  # noqa: E731
        CacheList(*map(convert, c.caches)) if isinstance(c, CacheList) else convert(c) for c in make_prompt_cache(model)
    ]
    if kv_bits:
        _check_quantized_attention(model, layers())
    return layers()


def kv_widths(model: nn.Module) -> set[int]:
    """The last dimension of every cached key and value, read off one lazy forward (shapes only, nothing computed)."""
    leaves = [c for c in leaf_caches(probe_cache(model)) if not isinstance(c, ArraysCache)]
    return {
        a.shape[-1] for c in leaves for a in (getattr(c, "keys", None), getattr(c, "values", None)) if a is not None
    }


def quantization_group(model: nn.Module) -> int:
    """The KV quantization group dividing every key and value width (MLA keys and values differ), or a refusal."""
    widths = kv_widths(model)
    group = next((g for g in (64, 32) if all(w % g == 0 for w in widths)), None)
    if group is None:
        shown = ", ".join(map(str, sorted(widths)))
        family = model_family(model)
        raise UserError(f"{family} has head_dim {shown} in its KV cache, which MLX cannot quantize; drop --kv-bits")
    return group


def _check_quantized_attention(model: nn.Module, cache: list[Any]) -> None:
    """Some families compute attention themselves on plain arrays; a lazy forward shows it without computing."""
    try:
        model(mx.zeros((1, 2), dtype=mx.int32), cache=cache)
    except (AttributeError, TypeError, ValueError) as error:
        raise UserError(
            f"{model_family(model)} computes attention itself, which quantized KV caches do not support; drop --kv-bits"
        ) from error


def _rollback_safe(
    model: nn.Module,
    layer_cache: Any,
    max_rollback: int,
    kv_bits: int | None,
    kv_group_size: int | None,
    window: int | None,
) -> Any:
    """One layer's cache in a form a speculative step can roll back."""
    if window is not None and type(layer_cache) is KVCache:
        if kv_bits:
            raise UserError("a windowed draft cache cannot be quantized yet; drop --kv-bits or --draft-window")
        return WindowKVCache(window, slack=max_rollback)
    if isinstance(layer_cache, RotatingKVCache):
        if layer_cache.keep:
            raise UserError(
                f"{model_family(model)}: sliding-window caches that keep {layer_cache.keep} "
                "sink tokens are not supported yet; use a model without attention sinks"
            )
        if kv_bits:
            raise UserError(
                f"{model_family(model)} uses sliding-window attention, which mlx-lm cannot quantize; drop --kv-bits"
            )
        return WindowKVCache(layer_cache.max_size, slack=max_rollback)
    if type(layer_cache) is KVCache:
        return QuantizedKVCache(kv_group_size, kv_bits) if kv_bits else layer_cache
    # A chunked-attention cache (Llama 4) drops only entries before its current chunk, at the start of a forward, so
    # the positions a step rolls back are always still there to trim.
    if isinstance(layer_cache, (QuantizedKVCache, ArraysCache, ChunkedKVCache)) or max_rollback == 0:
        return layer_cache
    raise cannot_roll_back(model, type(layer_cache).__name__)


def cannot_roll_back(model: nn.Module, cache_name: str) -> UserError:
    """The refusal to draft for a model whose layer state cannot be rolled back, naming the family and the way out."""
    return UserError(
        f"{model_family(model)} keeps layer state ({cache_name}) that mlxspec cannot roll back, so it cannot be "
        "drafted for yet; decode plainly with --no-draft"
    )


def rollback_blocker(model: nn.Module) -> str | None:
    """The name of the first layer cache type that neither trims nor restores from a snapshot, or None."""
    for layer_cache in leaf_caches(make_prompt_cache(model)):
        if not isinstance(layer_cache, (KVCache, RotatingKVCache, QuantizedKVCache, ArraysCache, ChunkedKVCache)):
            return type(layer_cache).__name__
    return None


def recurrent_family(model: nn.Module) -> bool:
    """Whether some layer keeps recurrent state (rolled back by snapshot and deferred replay)."""
    return bool(recurrent_leaves(make_prompt_cache(model)))


def rollback(cache: list[Any], num_tokens: int) -> None:
    """Forget the last num_tokens positions of every layer: rollback is just moving the offset back.

    Only for caches without recurrent layers; those rewind to a snapshot (recurrent.rewind)."""
    if num_tokens > 0 and recurrent_leaves(cache):
        raise RuntimeError("a cache with recurrent layers rolls back by recurrent.rewind, not by trimming")
    trim_attention(cache, num_tokens)
