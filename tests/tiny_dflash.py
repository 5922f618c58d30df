"""Tiny random DFlash drafters written as z-lab publishes them: config.json in either layout and one safetensors
file under their tensor names (written here by hand, not by mlxspec's own writer, so the loader is tested against
the format itself)."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx

from mlxspec.model_files import text_config

DRAFT_LAYERS = 2
HEAD_DIM = 8


def zlab_tensors(hidden: int, taps: int, layers: int = DRAFT_LAYERS, intermediate: int = 48, seed: int = 0) -> dict:
    """Random weights under z-lab's names (dflash/model_mlx.py), scaled so the drafts are confident."""
    mx.random.seed(seed)
    heads, kv_heads = 4, 2

    def w(rows: int, cols: int) -> mx.array:
        return mx.random.normal((rows, cols)) * (cols**-0.5)

    out = {"fc.weight": w(hidden, taps * hidden), "hidden_norm.weight": mx.ones(hidden), "norm.weight": mx.ones(hidden)}
    for i in range(layers):
        p = f"layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": w(heads * HEAD_DIM, hidden),
            p + "self_attn.k_proj.weight": w(kv_heads * HEAD_DIM, hidden),
            p + "self_attn.v_proj.weight": w(kv_heads * HEAD_DIM, hidden),
            p + "self_attn.o_proj.weight": w(hidden, heads * HEAD_DIM),
            p + "self_attn.q_norm.weight": mx.ones(HEAD_DIM),
            p + "self_attn.k_norm.weight": mx.ones(HEAD_DIM),
            p + "mlp.gate_proj.weight": w(intermediate, hidden),
            p + "mlp.up_proj.weight": w(intermediate, hidden),
            p + "mlp.down_proj.weight": w(hidden, intermediate),
            p + "input_layernorm.weight": mx.ones(hidden),
            p + "post_attention_layernorm.weight": mx.ones(hidden),
        }
    return out


def zlab_config(
    target_layers: int, hidden: int, vocab: int, taps: list[int], layout: str = "old", block: int = 8, mask: int = 0
) -> dict:
    """config.json as the older (Qwen3-4B-DFlash-b16) or newer (Qwen3.5-*-DFlash, transformers 5) repos write it."""
    common = {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3",
        "hidden_size": hidden,
        "num_hidden_layers": DRAFT_LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": HEAD_DIM,
        "intermediate_size": 48,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 512,
        "num_target_layers": target_layers,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    if layout == "old":
        return {
            **common,
            "block_size": block,
            "rope_theta": 1000000.0,
            "rope_scaling": None,
            "dflash_config": {"mask_token_id": mask, "target_layer_ids": taps},
        }
    return {
        **common,
        "rope_parameters": {"rope_theta": 10000000.0, "rope_type": "default"},
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 6,
        "dtype": "bfloat16",
        "transformers_version": "5.0.0",
        "dflash_config": {"block_size": block, "mask_token_id": mask, "target_layer_ids": taps},
    }


def save_zlab_dflash(path: Path, target, layout: str = "old", block: int = 8, seed: int = 0, taps=None) -> Path:
    """A tiny DFlash checkpoint directory for mlx-lm model `target` (tapping its first and last layers)."""
    config = text_config(target.config)
    hidden, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    taps = taps if taps is not None else sorted({0, layers - 1})
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    written = zlab_config(layers, hidden, vocab, taps, layout, block, mask=vocab - 1)
    (path / "config.json").write_text(json.dumps(written, indent=2))
    mx.save_safetensors(
        str(path / "model.safetensors"),
        {k: v.astype(mx.bfloat16) for k, v in zlab_tensors(hidden, len(taps), seed=seed).items()},
    )
    return path
