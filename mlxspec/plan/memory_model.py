"""Memory accounting from a model's config.json: parameters, weight bytes, KV cache bytes, activations.

For the dense families in TIE_DEFAULT every function is arithmetic on config values. Every other family mlx-lm
builds (MLA, shared and routed experts, SSM and DeltaNet hybrids) is counted from the mlx-lm model itself, built on
lazy arrays (mlx_lm_layout.py): nothing is allocated either way, so planning a 671B model stays instant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlxspec.errors import UserError
from mlxspec.model_files import text_config

KV_STEP = 256  # mlx-lm's KVCache grows in 256-token blocks and never shrinks on trim
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# Families whose layout the arithmetic below knows exactly (tested against instantiated mlx-lm models), with the
# tie_word_embeddings default of each one's mlx-lm model file (None: the config must say).
TIE_DEFAULT = {
    "llama": True,
    "mistral": True,
    "qwen2": True,
    "qwen3": None,
    "qwen3_moe": None,
    "phi3": False,
    "mixtral": False,
    "gemma": True,
    "gemma2": True,
    "gemma3": True,
    "gemma3_text": True,
}
REQUIRED_KEYS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "intermediate_size")


def check_plannable(config: dict) -> None:
    """Refuse, in one line naming the family or the key, a config the arithmetic would get wrong."""
    model_type = config.get("model_type")
    if model_type not in TIE_DEFAULT:
        raise UserError(
            f"planning model_type {model_type!r} is not supported yet (known: {', '.join(sorted(TIE_DEFAULT))}); "
            "its memory would be guessed, not counted"
        )
    for key in REQUIRED_KEYS:
        if not isinstance(config.get(key), int) or config[key] < 1:
            raise UserError(f"the {model_type} config has no usable {key!r} ({config.get(key)!r}); is it complete?")
    if TIE_DEFAULT[model_type] is None and "tie_word_embeddings" not in config:
        raise UserError(f"the {model_type} config has no 'tie_word_embeddings', which mlx-lm requires for it")


def kv_group_size_for(head_dim: int) -> int | None:
    """The quantization group for KV heads of this size: 64 where it divides, else 32 (head_dim 96), else None."""
    return next((g for g in (64, 32) if head_dim % g == 0), None)


def _get(config: dict, *names: str, default=None):
    for name in names:
        if config.get(name) is not None:
            return config[name]
    return default


@dataclass(frozen=True)
class Shape:
    """The handful of config values memory depends on, with each family's defaults applied."""

    model_type: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    norms_per_layer: int
    experts: int
    expert_intermediate: int
    sliding_window: int | None
    sliding_layers: tuple[bool, ...]

    @classmethod
    def from_config(cls, config: dict) -> Shape:
        config = text_config(config)
        check_plannable(config)
        model_type = config["model_type"]
        hidden = config["hidden_size"]
        heads = config["num_attention_heads"]
        layers = config["num_hidden_layers"]
        gemma = model_type in ("gemma", "gemma2", "gemma3", "gemma3_text")
        window = config.get("sliding_window")
        if model_type in ("gemma3", "gemma3_text"):
            pattern = config.get("sliding_window_pattern", 6)
            sliding = tuple(i % pattern != pattern - 1 for i in range(layers))
        elif model_type == "llama" and config.get("layer_types"):
            sliding = tuple(t == "sliding_attention" for t in config["layer_types"])
        else:  # mlx-lm gives every other family full KV caches, whatever its config says about windows
            sliding = (False,) * layers
        experts = _get(config, "num_local_experts", "num_experts", default=0)
        return cls(
            model_type=model_type,
            vocab=config["vocab_size"],
            hidden=hidden,
            layers=layers,
            heads=heads,
            kv_heads=_get(config, "num_key_value_heads", default=heads),
            head_dim=_get(config, "head_dim", default=hidden // heads),
            intermediate=config["intermediate_size"],
            tied=True if gemma else bool(config.get("tie_word_embeddings", TIE_DEFAULT[model_type])),
            qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
            o_bias=model_type != "qwen2" and bool(config.get("attention_bias", False)),
            mlp_bias=bool(config.get("mlp_bias", False)),
            qk_norm=model_type in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text"),
            norms_per_layer=4 if model_type in ("gemma2", "gemma3", "gemma3_text") else 2,
            experts=experts,
            expert_intermediate=_get(config, "moe_intermediate_size", default=config["intermediate_size"]),
            sliding_window=window if any(sliding) else None,
            sliding_layers=sliding,
        )


@dataclass(frozen=True)
class ParameterCount:
    embedding: int
    attention: int
    mlp: int
    norms: int
    lm_head: int

    @property
    def total(self) -> int:
        return self.embedding + self.attention + self.mlp + self.norms + self.lm_head

    @property
    def matrices(self) -> int:
        """Parameters in quantizable matrices (everything but norms and biases, roughly)."""
        return self.embedding + self.attention + self.mlp + self.lm_head


def counted_by_arithmetic(config: dict) -> bool:
    return text_config(config).get("model_type") in TIE_DEFAULT


def _layout(config: dict):
    from mlxspec.plan.mlx_lm_layout import layout

    return layout(config)


def count_parameters(config: dict) -> ParameterCount:
    """Exact parameter count of the mlx-lm model a config describes (tested per family against instantiation)."""
    if not counted_by_arithmetic(config):
        lay = _layout(config)
        other = lay.matrix_parameters - lay.embedding - lay.lm_head
        return ParameterCount(lay.embedding, other, 0, lay.total_parameters - lay.matrix_parameters, lay.lm_head)
    s = Shape.from_config(config)
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    attention = s.hidden * q + 2 * s.hidden * kv + q * s.hidden
    attention += (q + 2 * kv) * s.qkv_bias + s.hidden * s.o_bias + 2 * s.head_dim * s.qk_norm
    if s.experts:
        mlp = s.hidden * s.experts + s.experts * 3 * s.hidden * s.expert_intermediate
    else:
        mlp = 3 * s.hidden * s.intermediate + (2 * s.intermediate + s.hidden) * s.mlp_bias
    return ParameterCount(
        embedding=s.vocab * s.hidden,
        attention=s.layers * attention,
        mlp=s.layers * mlp,
        norms=s.layers * s.norms_per_layer * s.hidden + s.hidden,
        lm_head=0 if s.tied else s.vocab * s.hidden,
    )


def weight_bytes(params: ParameterCount, bits: int | None = None, group_size: int = 64, dtype: str = "bfloat16") -> int:
    """Bytes of the weights as stored: quantized matrices pay bits/8 per weight plus a scale and bias per group."""
    elem = DTYPE_BYTES[dtype]
    if not bits:
        return params.total * elem
    quantized = params.matrices * bits // 8 + 2 * math.ceil(params.matrices / group_size) * elem
    return quantized + (params.total - params.matrices) * elem


def allocated_tokens(tokens: int) -> int:
    """Positions mlx-lm's KVCache has allocated after holding `tokens` at its peak."""
    return math.ceil(tokens / KV_STEP) * KV_STEP


def kv_cache_bytes(
    config: dict,
    context: int,
    rollback: int = 0,
    kv_bits: int | None = None,
    kv_group_size: int | None = None,
    dtype: str = "float32",
    batch: int = 1,
    window: int | None = None,
    snapshots: int = 0,
) -> int:
    """Peak KV bytes after `context` tokens, with `rollback` extra positions a speculative step writes then trims.

    Sliding-window layers hold window + rollback (mlxspec's WindowKVCache); `window` caps every layer (a windowed
    draft cache). Quantized KV stores bits/8 per element plus a scale and bias per group. Recurrent layers hold a
    state of constant size, plus `snapshots` earlier copies kept for rollback (recurrent.py).
    """
    elem = DTYPE_BYTES[dtype]
    if counted_by_arithmetic(config):
        s = Shape.from_config(config)
        layers = [(2 * s.kv_heads * s.head_dim, s.sliding_window if sliding else None) for sliding in s.sliding_layers]
        head, state = s.head_dim, 0
    else:
        lay = _layout(config)
        layers = [(layer.elements_per_token, layer.window) for layer in lay.attention_layers]
        head = text_config(config).get("head_dim") or 64
        state = lay.state_elements * elem * (1 + snapshots)
    kv_group_size = kv_group_size or kv_group_size_for(head) or head
    total = float(state)
    peak = context + rollback
    for per_position, layer_window in layers:
        per_position_bytes = (
            (per_position * kv_bits / 8 + 2 * (per_position / kv_group_size) * elem) if kv_bits else per_position * elem
        )
        if window is not None:
            layer_window = min(window, layer_window or window)
        # A windowed cache keeps window + slack entries and drops the excess in KV_STEP chunks.
        held = min(peak, layer_window + rollback + KV_STEP) if layer_window else peak
        total += allocated_tokens(held) * per_position_bytes
    return int(total * batch)


def verification_bytes(
    config: dict, positions: int, context: int, prefill_chunk: int = 512, materialized_scores: bool = True
) -> int:
    """Transient activations at their peak: the verify pass over `positions` tokens, or a prefill chunk.

    Counts float32 logits and their processed copies, the MLP intermediate, and one layer's attention scores where
    the backend materializes them (MLX's CPU attention does; Metal's fused attention kernels do not).
    """
    heads, vocab, intermediate = _activation_sizes(config)
    f32 = 4
    scores = heads * materialized_scores
    verify = (3 * positions * vocab + scores * positions * (context + positions) + 3 * positions * intermediate) * f32
    chunk = min(prefill_chunk, context)
    prefill = (scores * chunk * context + 3 * chunk * intermediate) * f32
    return int(max(verify, prefill))


def recurrent_state_bytes(config: dict, dtype: str = "bfloat16") -> int:
    """One sequence's SSM / DeltaNet state (conv + recurrent), constant in the context; 0 for attention-only models."""
    return 0 if counted_by_arithmetic(config) else _layout(config).state_elements * DTYPE_BYTES[dtype]


def _activation_sizes(config: dict) -> tuple[int, int, int]:
    """(attention heads, vocabulary, widest MLP or expert intermediate) for the activation estimate."""
    if counted_by_arithmetic(config):
        s = Shape.from_config(config)
        return s.heads, s.vocab, max(s.intermediate, s.expert_intermediate, s.hidden)
    lay, text = _layout(config), text_config(config)
    widest_mlp = max((v for k, v in text.items() if k.endswith("intermediate_size") and isinstance(v, int)), default=0)
    return text.get("num_attention_heads") or 0, lay.vocab, max(widest_mlp, text.get("hidden_size") or 0)


def medusa_parameters(config: dict, heads: int = 4, shared_lm_head: bool = True) -> int:
    """Medusa heads: a residual SiLU block (hidden x hidden + bias) per head, plus an LM head each unless shared."""
    text = text_config(config)
    hidden, vocab = text["hidden_size"], text["vocab_size"]
    return heads * (hidden * hidden + hidden + (0 if shared_lm_head else vocab * hidden))
