"""GGUF in (mlxspec/gguf/): tiny random models of every converted architecture written as llama.cpp's converter
writes them (its tensor names, Gemma's norm weights plus one, llama's permuted q and k rows, a SentencePiece
vocabulary in the metadata), converted back by mlxspec: the same logits as the original model. The header reader
refuses damaged and hostile files in one line; `plan` reads a GGUF without MLX."""

from __future__ import annotations

import json
import struct

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map
from tiny import make_tiny

from mlxspec.errors import UserError
from mlxspec.gguf.convert import converted_dir
from mlxspec.gguf.header import read_header

GGUF_ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2", "gemma3_text": "gemma3"}
TO_GGUF = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}  # fmt: skip
GEMMA_TO_GGUF = {
    "pre_feedforward_layernorm": "ffn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "\u2581", *"abcdefgh", "\u2581a", "ab", "cd"]


def tiny(family: str):
    """A tiny model whose config is what a GGUF can say (Gemma 3's fixed local RoPE base and 6-layer pattern)."""
    overrides = {"vocab_size": len(TOKENS), "rope_scaling": None, "num_hidden_layers": 3}
    if family == "gemma3_text":
        overrides |= {"sliding_window_pattern": 6, "query_pre_attn_scalar": 8, "num_hidden_layers": 6}
    model = make_tiny(family, seed=3, **overrides)
    # float16-exact weights: the conversion stores float16, so the round trip is then lossless
    model.update(tree_map(lambda p: p.astype(mx.float16).astype(mx.float32), model.parameters()))
    return model


def gguf_name(name: str, family: str) -> str:
    table = (
        {**TO_GGUF, **GEMMA_TO_GGUF}
        if family.startswith("gemma")
        else {**TO_GGUF, "post_attention_layernorm": "ffn_norm"}
    )
    if name.startswith("model.layers."):
        _, _, index, rest = name.split(".", 3)
        stem, kind = rest.rsplit(".", 1)
        return f"blk.{index}.{table[stem]}.{kind}"
    return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}[name]  # fmt: skip


def write_gguf(path, model, family: str, raw_tensors: dict | None = None):
    """The model as llama.cpp's convert_hf_to_gguf.py writes it (F32 tensors); raw_tensors: name -> (block type,
    the blocks as the file holds them, rows already permuted) in place of those tensors."""
    import gguf

    config = model.config
    arch = GGUF_ARCH[family]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_theta"])
    head_dim = config.get("head_dim", config["hidden_size"] // config["num_attention_heads"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    if family.startswith("gemma"):
        writer.add_sliding_window(config["sliding_window"])
    if family == "gemma2":
        writer.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
    writer.add_tokenizer_model("llama")
    writer.add_token_list(TOKENS)
    writer.add_token_scores([0.0] * 4 + [-float(i) for i in range(len(TOKENS) - 4)])
    writer.add_token_types([3, 3, 3, 2] + [1] * (len(TOKENS) - 4))
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    for name, weight in tree_flatten(model.parameters()):
        if raw_tensors and name in raw_tensors:
            type_name, raw = raw_tensors[name]
            writer.add_tensor(gguf_name(name, family), raw, raw_dtype=gguf.GGMLQuantizationType[type_name])
            continue
        value = np.array(weight, dtype=np.float32)
        if family.startswith("gemma") and name.endswith("norm.weight"):
            value = value + 1  # llama.cpp stores Gemma's norms as 1 + w
        if family == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config["num_attention_heads"] if "q_proj" in name else config["num_key_value_heads"]
            rows = value.shape[0]
            value = value.reshape(heads, 2, rows // heads // 2, *value.shape[1:]).swapaxes(1, 2).reshape(value.shape)
        writer.add_tensor(gguf_name(name, family), value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("family", list(GGUF_ARCH))
def test_a_gguf_converts_back_to_the_same_model(tmp_path, family):
    from mlx_lm import load

    model = tiny(family)
    path = write_gguf(tmp_path / f"{family}.gguf", model, family)
    lines = []
    out = converted_dir(path, say=lines.append)
    # what it does, what became of each block type (all F32 here, kept), then where it went
    assert len(lines) == 3 and lines[1].startswith("F32: ") and lines[1].endswith("exact") and str(out) in lines[2]
    converted, tokenizer = load(str(out))
    converted.set_dtype(mx.float32)  # stored in float16 (float16-exact weights), computed as mlxspec does
    tokens = mx.array([[2, 5, 6, 7, 8, 9, 10, 11, 12, 5, 6]])
    expected, got = model(tokens), converted(tokens)
    assert np.allclose(np.array(got), np.array(expected), atol=1e-3), np.abs(np.array(got - expected)).max()
    assert converted_dir(path, say=lines.append) == out and len(lines) == 3  # converted once
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 5]) == ["<pad>", "<eos>", "<bos>", "a"]
    config = json.loads((out / "config.json").read_text())
    assert config["eos_token_id"] == [1]


def test_a_damaged_or_hostile_gguf_is_refused_in_one_line(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", tiny("qwen3"), "qwen3")
    raw = path.read_bytes()
    cases = {
        "not-gguf": b"GGML" + raw[4:],
        "truncated": raw[: len(raw) // 2],
        "huge-count": raw[:8] + struct.pack("<Q", 2**62) + raw[16:],
        "huge-string": raw[:24] + struct.pack("<Q", 2**60) + raw[32:],
    }
    for name, data in cases.items():
        bad = tmp_path / f"{name}.gguf"
        bad.write_bytes(data)
        with pytest.raises(UserError) as error:
            read_header(bad)
        assert str(bad) in str(error.value) and "\n" not in str(error.value), name


def test_an_architecture_mlxspec_does_not_convert_is_named(tmp_path):
    import gguf

    writer = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "rwkv7")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UserError, match="holds a rwkv7 model; mlxspec converts GGUF files of"):
        converted_dir(tmp_path / "x.gguf")


def test_plan_reads_a_gguf_header_without_mlx(tmp_path):
    import subprocess
    import sys

    path = write_gguf(tmp_path / "m.gguf", tiny("gemma3_text"), "gemma3_text")
    probe = (
        "import sys\nfrom mlxspec.cli.main import main\ntry:\n    main(['mlxspec', 'plan', '--model', sys.argv[1]])\n"
        "except SystemExit as e:\n    assert not e.code\nprint('MLX' if 'mlx' in sys.modules else 'none')"
    )
    run = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "none" and "m on this machine" in run.stdout
