"""A DFlash block drafter (z-lab, arXiv 2602.06036) as z-lab publishes it: a few Qwen3-style layers that draft a
whole block in one forward, reading the target's own features.

    context c_t = hidden_norm(fc([tap_1(t) ; ... ; tap_n(t)]))        (the target's tapped layer outputs at t)
    block       = embed([x_p, MASK, ..., MASK])                         (the target's own embedding)
    logits      = lm_head(norm(Layers(block | context)))                (the target's own LM head)

Each layer's queries are the block's rows; its keys and values are the context rows (kept in a KV cache, one row per
committed position) and the block's own rows, with no causal mask inside the block. Block row i >= 1 predicts the
token at position p + i. Parameter names follow z-lab's `dflash/model_mlx.py`, so their safetensors load unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache
from mlx_lm.models.qwen3 import MLP
from mlx_lm.models.rope_utils import initialize_rope


@dataclass
class DFlashConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    block_size: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    rope_scaling: dict | None = None
    max_position_embeddings: int = 40960
    layer_types: tuple[str, ...] = ()  # "full_attention" or "sliding_attention" per layer; () is all full
    sliding_window: int | None = None
    attention_bias: bool = False
    mlxspec: dict = field(default_factory=dict)  # ours only: the base model's fingerprint, training, acceptance

    def sliding(self, layer: int) -> int | None:
        """The window of layer `layer`, or None for full attention."""
        kinds = self.layer_types or ("full_attention",) * self.num_hidden_layers
        return self.sliding_window if kinds[layer] == "sliding_attention" else None


class DFlashAttention(nn.Module):
    def __init__(self, config: DFlashConfig, window: int | None):
        super().__init__()
        dim, heads, kv_heads, head_dim = (
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        self.n_heads, self.n_kv_heads, self.window = heads, kv_heads, window
        self.scale = head_dim**-0.5
        bias = config.attention_bias
        self.q_proj = nn.Linear(dim, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(dim, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(dim, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, dim, bias=bias)
        self.q_norm = nn.RMSNorm(head_dim, eps=config.rms_norm_eps)
        self.k_norm = nn.RMSNorm(head_dim, eps=config.rms_norm_eps)

    def _keys_values(self, x: mx.array, offset: int | mx.array) -> tuple[mx.array, mx.array]:
        B, L, _ = x.shape
        keys = self.k_norm(self.k_proj(x).reshape(B, L, self.n_kv_heads, -1)).transpose(0, 2, 1, 3)
        values = self.v_proj(x).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        return self.rope(keys, offset=offset), values

    def __call__(self, x: mx.array, context: mx.array | None, cache: KVCache, mask: mx.array | None) -> mx.array:
        """x [B, L, D] the block; context [B, S, D] new context rows (added to `cache`) or None; mask [L, keys]."""
        B, L, _ = x.shape
        if context is not None:
            cache.update_and_fetch(*self._keys_values(context, cache.offset))
        start = cache.offset  # the block's first position: right after the context
        queries = self.q_norm(self.q_proj(x).reshape(B, L, self.n_heads, -1)).transpose(0, 2, 1, 3)
        queries = self.rope(queries, offset=start)
        keys, values = self._keys_values(x, start)
        if start:
            keys = mx.concatenate([cache.keys[..., :start, :], keys], axis=2)
            values = mx.concatenate([cache.values[..., :start, :], values], axis=2)
        out = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))

    def train_call(self, x: mx.array, context: mx.array, anchors: mx.array, mask: mx.array) -> mx.array:
        """Training: x [S*A, L, D] the blocks of A anchors per sequence; context [S, T, D] the sequences' context
        rows (keys at positions 0..T-1, projected once per sequence); anchors [S*A] each block's first position;
        mask [S*A, 1, L, T + L] which context rows each block may read (those before its anchor)."""
        B, L, _ = x.shape
        repeats = B // context.shape[0]
        context_keys, context_values = (mx.repeat(t, repeats, axis=0) for t in self._keys_values(context, 0))
        queries = self.q_norm(self.q_proj(x).reshape(B, L, self.n_heads, -1)).transpose(0, 2, 1, 3)
        queries = self.rope(queries, offset=anchors)
        keys, values = self._keys_values(x, anchors)
        keys = mx.concatenate([context_keys, keys], axis=2)
        values = mx.concatenate([context_values, values], axis=2)
        out = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


class DFlashLayer(nn.Module):
    def __init__(self, config: DFlashConfig, window: int | None):
        super().__init__()
        self.self_attn = DFlashAttention(config, window)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def __call__(self, x: mx.array, context: mx.array | None, cache: KVCache, mask: mx.array | None) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), context, cache, mask)
        return h + self.mlp(self.post_attention_layernorm(h))

    def train_call(self, x: mx.array, context: mx.array, anchors: mx.array, mask: mx.array) -> mx.array:
        h = x + self.self_attn.train_call(self.input_layernorm(x), context, anchors, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDraftModel(nn.Module):
    """The drafter's own weights; the embedding and LM head are the target's, passed in by the caller."""

    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(len(config.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.layers = [DFlashLayer(config, config.sliding(i)) for i in range(config.num_hidden_layers)]
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        rope = initialize_rope(
            config.head_dim,
            base=config.rope_theta,
            traditional=False,
            scaling_config=config.rope_scaling,
            max_position_embeddings=config.max_position_embeddings,
        )
        for layer in self.layers:  # one RoPE, held by every attention as mlx-lm's models hold theirs
            layer.self_attn.rope = rope

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]

    def __call__(self, block: mx.array, taps: mx.array | None, cache: list[KVCache]) -> mx.array:
        """block [B, L, D] embedded block rows; taps [B, S, n*D] the target's features at the S positions after
        those in `cache` (or None). -> the normed block states [B, L, D], for the target's LM head."""
        context = self.hidden_norm(self.fc(taps)) if taps is not None else None
        start = cache[0].offset + (0 if taps is None else taps.shape[1])
        h = block
        for layer, layer_cache in zip(self.layers, cache):
            h = layer(h, context, layer_cache, block_mask(layer.self_attn.window, start, block.shape[1]))
        return self.norm(h)

    def train_forward(self, block: mx.array, taps: mx.array, anchors: mx.array, mask: mx.array) -> mx.array:
        """Training: every anchor's block at once (DFlashAttention.train_call) -> normed block states."""
        context = self.hidden_norm(self.fc(taps))
        h = block
        for layer in self.layers:
            h = layer.train_call(h, context, anchors, mask)
        return self.norm(h)


def block_mask(window: int | None, start: int, length: int) -> mx.array | None:
    """[length, start + length] bool: block rows see every context row and each other, and a sliding layer only
    the keys inside its window (key position > query position - window); None where nothing is masked."""
    if window is None or start + length <= window:
        return None
    keys = mx.arange(start + length)[None]
    queries = mx.arange(start, start + length)[:, None]
    return keys > queries - window
