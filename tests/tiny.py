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
    "llama": {
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        }
    },
    "qwen2": {},
    "qwen3": {"head_dim": 8},
    "mistral": {},
    "gemma2": {
        "head_dim": 8,
        "query_pre_attn_scalar": 8,
        "sliding_window": 6,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": True,
    },
    "gemma3_text": {
        "head_dim": 8,
        "query_pre_attn_scalar": 8,
        "sliding_window": 6,
        "sliding_window_pattern": 2,
        "tie_word_embeddings": True,
        "rope_local_base_freq": 10000.0,
    },
}
# Families whose layers keep recurrent state (an SSM or gated-DeltaNet state that cannot be trimmed), rolled back
# by snapshot and deferred replay (mlxspec/recurrent.py): mamba is all SSM, qwen3_5 a linear-attention layer then a
# full-attention one, like Qwen3.5/3.6.
# Gated-DeltaNet layer sizes (Qwen3.5/3.6, Qwen3-Next), shared with the family sweep's small config.
LINEAR_ATTENTION = {
    "linear_num_value_heads": 2,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 2,
}
RECURRENT_FAMILIES = {
    "mamba": {"state_size": 4, "conv_kernel": 4, "use_bias": False, "use_conv_bias": True, "time_step_rank": 4},
    "qwen3_5": {
        **LINEAR_ATTENTION,
        "head_dim": 8,
        "rope_parameters": {"type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    },
}


def make_tiny(
    family: str = "llama", seed: int = 0, vocab_size: int = 8, logit_scale: float = 4.0, **overrides
) -> nn.Module:
    family_config = FAMILIES.get(family) or RECURRENT_FAMILIES.get(family, {})
    config = {**BASE, **family_config, "model_type": family, "vocab_size": vocab_size, **overrides}
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


CHARS = "abcdefg"  # ids 0..6; id 7 is the end-of-text token


def save_char_tokenizer(path, eos="</s>", chars=CHARS) -> None:
    """A one-character-per-token tokenizer whose vocabulary matches the tiny models (8 ids)."""
    import json

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(chars)}
    vocab[eos] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=eos))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([eos])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "bos_token": eos, "unk_token": eos}
    (path / "tokenizer_config.json").write_text(json.dumps(config))


def save_tiny_model_dir(path, family: str = "llama", seed: int = 0, tokenizer_chars: str = CHARS, **overrides):
    """A complete mlx-lm model directory (config, float32 weights, tokenizer) holding a tiny random model."""
    import json

    model = make_tiny(family, seed=seed, **overrides)
    path.mkdir(parents=True, exist_ok=True)
    config = dict(model.config)
    config["eos_token_id"] = 7
    (path / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    save_char_tokenizer(path, chars=tokenizer_chars)
    return path
