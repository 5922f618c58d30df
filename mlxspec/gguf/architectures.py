"""What llama.cpp's converter did to each architecture, undone: the mlx-lm config a GGUF's metadata describes, the
mlx-lm name of each tensor, and the per-tensor transforms (Gemma's norm weights were stored plus one; llama-style
q and k rows were permuted for llama.cpp's interleaved RoPE). Pure data and numpy: no MLX."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mlxspec.errors import UserError
from mlxspec.gguf.header import Header

LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GEMMA_LAYER_NAMES = {
    **LAYER_NAMES,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# Gemma's chat template (text turns), for Gemma GGUFs that carry none: llama.cpp applies the same format built in.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
# Tokens that end a turn besides EOS, where a vocabulary has them (Gemma's <end_of_turn>, Llama 3's <|eot_id|>, ...).
END_OF_TURN = ("<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|endoftext|>", "<|end|>")


@dataclass(frozen=True)
class Architecture:
    model_type: str  # mlx-lm's
    layer_names: dict[str, str]
    norm_shift: float = 0.0  # llama.cpp stored Gemma's RMSNorm weights as 1 + w: subtract it again
    permuted_qk: bool = False  # llama.cpp permuted llama-style q and k rows: undo it
    extra: Callable[[Header], dict] | None = None  # architecture-specific config keys
    chat_template: str | None = None  # the family's own, for files that carry none


def _gemma3(h: Header) -> dict:
    head_dim = h.arch("attention.key_length", 256)
    hidden, heads = h.arch("embedding_length"), h.arch("attention.head_count")
    # llama.cpp scales queries by 1/sqrt(head_dim), except Gemma 3 27B's 1/sqrt(hidden / heads) (62 layers).
    scalar = hidden // heads if h.arch("block_count") == 62 else head_dim
    return {
        "query_pre_attn_scalar": scalar,
        "rope_local_base_freq": 10000.0,  # llama.cpp's fixed value for Gemma 3's sliding layers
        "sliding_window": h.arch("attention.sliding_window", 512),
        "sliding_window_pattern": 6,
    }


def _gemma2(h: Header) -> dict:
    return {
        "query_pre_attn_scalar": h.arch("attention.key_length", 256),
        "attn_logit_softcapping": h.arch("attn_logit_softcapping", 50.0),
        "final_logit_softcapping": h.arch("final_logit_softcapping", 30.0),
        "sliding_window": h.arch("attention.sliding_window", 4096),
    }


ARCHITECTURES = {
    "gemma3": Architecture("gemma3_text", GEMMA_LAYER_NAMES, 1.0, extra=_gemma3, chat_template=GEMMA_CHAT_TEMPLATE),
    "gemma2": Architecture("gemma2", GEMMA_LAYER_NAMES, 1.0, extra=_gemma2, chat_template=GEMMA_CHAT_TEMPLATE),
    "llama": Architecture("llama", LAYER_NAMES, permuted_qk=True),
    "qwen2": Architecture("qwen2", LAYER_NAMES),
    "qwen3": Architecture("qwen3", LAYER_NAMES),
}


def architecture_of(header: Header) -> Architecture:
    arch = ARCHITECTURES.get(header.architecture)
    if arch is None:
        raise UserError(
            f"'{header.path}' holds a {header.architecture or 'unnamed'} model; mlxspec converts GGUF files of "
            f"{', '.join(sorted(ARCHITECTURES))} (Mistral's are llama); convert others with mlx_lm.convert"
        )
    if arch.permuted_qk and any(t.name == "rope_freqs.weight" for t in header.tensors):
        raise UserError(
            f"'{header.path}' uses Llama 3.1-style RoPE scaling (rope_freqs), which mlxspec does not convert from "
            "GGUF yet; use the mlx-community conversion of the same model"
        )
    return arch


def _int(header: Header, key: str, default=None) -> int:
    value = header.arch(key, default)
    if type(value) is not int or not 0 < value < 1 << 24:
        raise UserError(f"'{header.path}' says {header.architecture}.{key}={value!r}; a GGUF model needs a count there")
    return value


def mlx_config(header: Header, arch: Architecture, vocab_size: int, eos_ids: list[int]) -> dict:
    """The config.json mlx-lm builds the model from."""
    heads = _int(header, "attention.head_count")
    hidden = _int(header, "embedding_length")
    config = {
        "model_type": arch.model_type,
        "hidden_size": hidden,
        "num_hidden_layers": _int(header, "block_count"),
        "intermediate_size": _int(header, "feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": _int(header, "attention.head_count_kv", heads),
        "head_dim": _int(header, "attention.key_length", hidden // heads),
        "rms_norm_eps": float(header.arch("attention.layer_norm_rms_epsilon", 1e-6)),
        "vocab_size": vocab_size,
        "max_position_embeddings": _int(header, "context_length", 4096),
        "rope_theta": float(header.arch("rope.freq_base", 10000.0)),
        "tie_word_embeddings": not any(t.name == "output.weight" for t in header.tensors),
        "eos_token_id": eos_ids,
    }
    return config | (arch.extra(header) if arch.extra else {})


def mlx_name(gguf_name: str, arch: Architecture) -> str:
    """blk.3.attn_q.weight -> model.layers.3.self_attn.q_proj.weight; refuses a tensor it does not know."""
    stem, _, kind = gguf_name.rpartition(".")
    parts = stem.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[1].isdigit() and parts[2] in arch.layer_names:
        return f"model.layers.{int(parts[1])}.{arch.layer_names[parts[2]]}.{kind}"
    if stem in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[stem]}.{kind}"
    raise UserError(f"the GGUF tensor '{gguf_name}' has no place in mlx-lm's {arch.model_type}; it is not converted")


def undo_transforms(name: str, weight: np.ndarray, arch: Architecture, config: dict) -> np.ndarray:
    """The tensor as the original checkpoint held it."""
    if arch.norm_shift and name.endswith("norm.weight"):
        return weight - np.float32(arch.norm_shift)
    if arch.permuted_qk and name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
        heads = config["num_attention_heads"] if ".q_proj" in name else config["num_key_value_heads"]
        rows = weight.shape[0]
        # llama.cpp: w.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2); the inverse swaps back.
        return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    return weight
