"""Tiny random-weight mlx-lm models for tests: fast, float32, and peaked enough that drafts get rejected."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map
from mlx_lm.utils import _get_classes

BASE = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 8,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
}

FAMILIES = {
    "llama": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
    "qwen2": {},
    "qwen3": {"head_dim": 8},
    "mistral": {},
    "gemma2": {"head_dim": 8, "query_pre_attn_scalar": 8, "sliding_window": 6, "attn_logit_softcapping": 50.0,
               "final_logit_softcapping": 30.0, "tie_word_embeddings": True},
    "gemma3_text": {"head_dim": 8, "query_pre_attn_scalar": 8, "sliding_window": 6, "sliding_window_pattern": 2,
                    "tie_word_embeddings": True, "rope_local_base_freq": 10000.0},
}


def make_tiny(family: str = "llama", seed: int = 0, vocab_size: int = 8, logit_scale: float = 4.0,
              **overrides) -> nn.Module:
    config = {**BASE, **FAMILIES.get(family, {}), "model_type": family, "vocab_size": vocab_size, **overrides}
    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    # Scale every weight so the output distributions are far from uniform.
    params = tree_map(lambda p: p * logit_scale if p.ndim == 2 else p, model.parameters())
    model.update(params)
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    model.config = config
    return model


def num_params(model: nn.Module) -> int:
    return sum(v.size for _, v in tree_flatten(model.parameters()))
