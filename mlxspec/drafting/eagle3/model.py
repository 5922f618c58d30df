"""An EAGLE-3 head as SafeAILab (`eagle/model/cnets.py`) and vLLM speculators (`models/eagle3`) publish it.

    h_0      = fc( [tap_a ; tap_b ; tap_c] )            three target layers' inputs, 3H -> H (context rows only)
    x        = [ input_layernorm(embed(x_{t+1})) ; hidden_norm(h_t) ]      2H wide, the attention's input
    h_{t+1}  = h_t + attn(x);  h_{t+1} += mlp(post_attention_layernorm(h_{t+1}))
    logits   = lm_head(norm(h_{t+1}))                    over a reduced draft vocabulary of Vd tokens

Draft token i is target token i + d2t[i]; the draft's q is zero on every other target token, so Leviathan/Chen's
residual max(0, p - q) brings those tokens out at exactly the target's rate. Deeper draft steps feed the head its own
output h_{t+1} (already H wide, so no fc), as both sources do; `norm_output` heads (EAGLE 3.1) feed it normed.

The attention and MLP are mlx-lm's own llama or qwen3 modules (no forked model file): the attention is built for
2H inputs with the head's head_dim, and its output projection is replaced by one back to H.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxspec.decoding.target_features import text_model

LAYER_FAMILIES = ("llama", "qwen3")


@dataclass
class Eagle3Config:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    layer_family: str = "llama"  # the decoder layer's family: llama, or qwen3 (q_norm/k_norm)
    attention_bias: bool = False
    mlp_bias: bool = False
    target_hidden_size: int = 0  # the target's hidden size when it differs (0: the same)
    aux_layer_ids: tuple[int, ...] = ()  # target layers whose INPUTS are tapped, as the sources number them
    norm_before_residual: bool = False
    norm_before_fc: bool = False  # one RMSNorm over the concatenated taps (gpt-oss style)
    fc_norm: bool = False  # one RMSNorm per tap before concatenation
    norm_output: bool = False  # deeper steps read the normed output
    has_embedding: bool = False  # ships embed_tokens (else the target's is used)
    source_format: str = "safeailab"  # or "speculators"
    base_model: str = ""  # the verifier the checkpoint names, for people
    mlxspec: dict = field(default_factory=dict)  # ours: base_model_identity, acceptance, training

    kind = "eagle3"

    @property
    def lm_head_from_target(self) -> bool:
        """A hot-vocabulary head (FR-Spec style): its output layer is the target's own output rows for the draft
        vocabulary, taken from the target when wired, never trained or stored."""
        return self.mlxspec.get("lm_head") == "target"

    @property
    def feature_size(self) -> int:
        return self.target_hidden_size or self.hidden_size

    @property
    def target_taps(self) -> tuple[int, ...]:
        """mlxspec taps layer outputs; the sources tap layer inputs, and the input of layer i is layer i-1's output."""
        return tuple(i - 1 for i in self.aux_layer_ids)


def _layer_args(config: Eagle3Config, hidden_size: int) -> Any:
    from mlx_lm.models import llama, qwen3

    module = qwen3 if config.layer_family == "qwen3" else llama
    fields = {
        "model_type": config.layer_family,
        "hidden_size": hidden_size,
        "num_hidden_layers": 1,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "vocab_size": config.vocab_size,
        "rope_theta": config.rope_theta,
        "rope_scaling": config.rope_scaling,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": False,
    }
    if module is llama:
        fields.update(attention_bias=config.attention_bias, mlp_bias=config.mlp_bias)
    return module, module.ModelArgs.from_dict(fields)


class Eagle3Layer(nn.Module):
    """The one decoder layer (SafeAILab's `midlayer`, speculators' `layers.0`)."""

    def __init__(self, config: Eagle3Config):
        super().__init__()
        from mlx_lm.models import llama

        dims, eps = config.hidden_size, config.rms_norm_eps
        module, wide = _layer_args(config, 2 * dims)
        self.self_attn = module.Attention(wide)  # q/k/v read [embedding ; hidden], 2H wide
        heads_out = config.num_attention_heads * config.head_dim
        self.self_attn.o_proj = nn.Linear(heads_out, dims, bias=config.attention_bias and module is llama)
        _, narrow = _layer_args(config, dims)
        self.mlp = llama.MLP(narrow)
        self.hidden_norm = nn.RMSNorm(dims, eps=eps)
        self.input_layernorm = nn.RMSNorm(dims, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(dims, eps=eps)
        self.norm_before_residual = config.norm_before_residual

    def __call__(self, embeds: mx.array, hidden: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = mx.concatenate([self.input_layernorm(embeds), normed], axis=-1)
        h = residual + self.self_attn(x, mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.config = config
        dims, eps, taps = config.hidden_size, config.rms_norm_eps, len(config.aux_layer_ids)
        if config.norm_before_fc:
            self.input_norm = nn.RMSNorm(taps * config.feature_size, eps=eps)
        if config.fc_norm:
            self.fc_norm = [nn.RMSNorm(config.feature_size, eps=eps) for _ in range(taps)]
        self.fc = nn.Linear(taps * config.feature_size, dims, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = nn.RMSNorm(dims, eps=eps)
        self.lm_head = nn.Linear(dims, config.draft_vocab_size, bias=False)
        if config.has_embedding:
            self.embed_tokens = nn.Embedding(config.vocab_size, dims)
        # target id of draft id i: i + d2t[i] (not a parameter: never trained, quantized or routed)
        self._draft_to_target = mx.arange(config.draft_vocab_size, dtype=mx.int32)

    def on_target(self, target: nn.Module) -> Eagle3OnTarget:
        return Eagle3OnTarget(self, target)

    def borrow_output_rows(self, target: nn.Module) -> None:
        """Take the target's output rows for the draft vocabulary as this head's (frozen) output layer."""
        from mlxspec.decoding.target_features import output_rows

        self.lm_head.weight = output_rows(target, self.draft_to_target).astype(self.lm_head.weight.dtype)
        self.lm_head.freeze()

    def set_vocabulary_map(self, d2t: mx.array | None) -> None:
        base = mx.arange(self.config.draft_vocab_size, dtype=mx.int32)
        self._draft_to_target = base if d2t is None else base + d2t.astype(mx.int32)

    @property
    def draft_to_target(self) -> mx.array:
        return self._draft_to_target

    def project_taps(self, taps: mx.array) -> mx.array:
        """The target's tapped rows [.., taps * F] -> the head's hidden [.., H]."""
        if self.config.norm_before_fc:
            taps = self.input_norm(taps)
        if self.config.fc_norm:
            parts = mx.split(taps, len(self.fc_norm), axis=-1)
            taps = mx.concatenate([norm(part) for norm, part in zip(self.fc_norm, parts)], axis=-1)
        return self.fc(taps)

    def __call__(self, embeds: mx.array, features: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        """embeds [B, L, H] of x_{t+1}; features [B, L, taps*F] (target taps) or [B, L, H] (the head's own output)
        -> the layer's output [B, L, H]."""
        if features.shape[-1] != self.config.hidden_size:  # the target's taps (context rows); never H wide
            features = self.project_taps(features)
        return self.midlayer(embeds, features, mask, cache)


class Eagle3OnTarget:
    """An EAGLE-3 head wired to its target: the target's embedding (unless it ships one), the head's own norm and
    LM head, and its draft vocabulary mapped into the target's (FeatureDrafter drives it as it drives EAGLE)."""

    def __init__(self, head: Eagle3Head, target: nn.Module):
        self.head = head
        self.target_taps = head.config.target_taps
        self.embed = head.embed_tokens if head.config.has_embedding else text_model(target).model.embed_tokens
        self.vocab_size = head.config.vocab_size
        self.draft_to_target = head.draft_to_target
        from mlxspec.decoding.target_features import output_cap

        self.cap = output_cap(target) if head.config.lm_head_from_target else None

    def step(
        self, tokens: mx.array, features: mx.array, mask: Any, cache: Any, at_start: bool = False
    ) -> tuple[mx.array, mx.array]:
        """tokens [B, L], features [B, L, *] -> (logits over the TARGET's vocabulary [B, L, V], -inf outside the
        draft vocabulary; the features the next depth reads [B, L, H])."""
        out = self.head(self.embed(tokens), features, mask, cache)
        normed = self.head.norm(out)
        draft_logits = self.head.lm_head(normed)
        if self.cap:  # the target's rows give the target's logits, which it caps
            draft_logits = mx.tanh(draft_logits / self.cap) * self.cap
        return self.to_target_vocabulary(draft_logits), normed if self.head.config.norm_output else out

    def to_target_vocabulary(self, draft_logits: mx.array) -> mx.array:
        if draft_logits.shape[-1] == self.vocab_size and self.head.config.draft_vocab_size == self.vocab_size:
            return draft_logits  # no reduced vocabulary (d2t is the identity)
        full = mx.full((*draft_logits.shape[:-1], self.vocab_size), -mx.inf, dtype=draft_logits.dtype)
        full[..., self.draft_to_target] = draft_logits
        return full
