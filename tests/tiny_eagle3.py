"""Tiny random EAGLE-3 heads written as they are published, by hand (not by mlxspec's writer), so the loader is
tested against the formats themselves:

- SafeAILab (eagle/model/cnets.py): a Llama config.json with draft_vocab_size; `midlayer.*` weights in
  pytorch_model.bin (a torch zip written here without torch, as torch.save lays it out) or model.safetensors;
- vLLM speculators (models/eagle3): speculators_model_type "eagle3", transformer_layer_config,
  eagle_aux_hidden_state_layer_ids and speculators_config.verifier; `layers.0.*` weights, plus the verifier copies
  speculators keeps (verifier_norm, verifier_lm_head).
"""

from __future__ import annotations

import collections
import io
import json
import pickle
import zipfile
from pathlib import Path

import mlx.core as mx
import numpy as np

from mlxspec.model_files import text_config

HEADS, KV_HEADS = 4, 2
DRAFT_IDS = [0, 1, 2, 4, 6]  # the draft vocabulary: target ids 3, 5 and 7 can only come out through the residual


def eagle3_tensors(
    hidden: int,
    taps: int,
    vocab_ids: list[int],
    intermediate: int = 48,
    head_dim: int | None = None,
    qk_norm: bool = False,
    seed: int = 0,
    prefix: str = "midlayer.",
) -> dict[str, np.ndarray]:
    """Random weights under SafeAILab's names (prefix "midlayer.") or speculators' ("layers.0."), float32."""
    rng = np.random.default_rng(seed)
    head_dim = head_dim or hidden // HEADS

    def w(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale * cols**-0.5).astype(np.float32)

    p = prefix
    out = {
        "fc.weight": w(hidden, taps * hidden),
        "norm.weight": np.ones(hidden, np.float32),
        "lm_head.weight": w(len(vocab_ids), hidden, 4.0),
        p + "self_attn.q_proj.weight": w(HEADS * head_dim, 2 * hidden),
        p + "self_attn.k_proj.weight": w(KV_HEADS * head_dim, 2 * hidden),
        p + "self_attn.v_proj.weight": w(KV_HEADS * head_dim, 2 * hidden),
        p + "self_attn.o_proj.weight": w(hidden, HEADS * head_dim),
        p + "mlp.gate_proj.weight": w(intermediate, hidden),
        p + "mlp.up_proj.weight": w(intermediate, hidden),
        p + "mlp.down_proj.weight": w(hidden, intermediate),
        p + "hidden_norm.weight": np.ones(hidden, np.float32),
        p + "input_layernorm.weight": np.ones(hidden, np.float32),
        p + "post_attention_layernorm.weight": np.ones(hidden, np.float32),
    }
    if qk_norm:
        out[p + "self_attn.q_norm.weight"] = np.ones(head_dim, np.float32)
        out[p + "self_attn.k_norm.weight"] = np.ones(head_dim, np.float32)
    return out


def vocabulary_tensors(vocab_ids: list[int], vocab: int) -> dict[str, np.ndarray]:
    d2t = np.array(vocab_ids, np.int64) - np.arange(len(vocab_ids), dtype=np.int64)
    t2d = np.zeros(vocab, bool)
    t2d[vocab_ids] = True
    return {"d2t": d2t, "t2d": t2d}


def safeailab_config(target_config: dict, hidden: int, draft_vocab: int, aux: list[int] | None = None) -> dict:
    """config.json as SafeAILab's EAGLE-3 repos write it (eagle/traineagle3/config.json)."""
    raw = {
        "architectures": ["LlamaForCausalLM"],
        "bos_token_id": 0,
        "eos_token_id": 7,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": 48,
        "max_position_embeddings": 2048,
        "model_type": "llama",
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": 1,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "transformers_version": "4.28.1",
        "use_cache": True,
        "vocab_size": target_config["vocab_size"],
        "draft_vocab_size": draft_vocab,
    }
    if aux is not None:
        raw["eagle_aux_hidden_state_layer_ids"] = aux
    return raw


def speculators_config(
    target_config: dict, hidden: int, draft_vocab: int, aux: list[int], family: str, head_dim: int
) -> dict:
    """config.json as vLLM speculators writes it (Eagle3SpeculatorConfig.save_pretrained)."""
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.3.0",
        "draft_vocab_size": draft_vocab,
        "norm_before_residual": False,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": aux,
        "transformer_layer_config": {
            "model_type": family,
            "vocab_size": target_config["vocab_size"],
            "hidden_size": hidden,
            "intermediate_size": 48,
            "num_hidden_layers": 1,
            "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS,
            "head_dim": head_dim,
            "rms_norm_eps": 1e-06,
            "rope_theta": 10000.0,
            "max_position_embeddings": 4096,
            "torch_dtype": "bfloat16",
        },
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": {"name_or_path": "tiny/target", "architectures": ["LlamaForCausalLM"]},
        },
    }


# ---- a torch zip, as torch.save writes it, without torch ----


class _Global:
    """A reference the pickle stream names by module and attribute (GLOBAL), as torch's classes appear in it."""

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name

    def __call__(self, *args):  # pickle wants a callable here; it is only ever written, never called
        raise TypeError(f"{self.module}.{self.name} is a reference, not a function")


class _Storage:
    def __init__(self, key: str, dtype: str, numel: int):
        self.key, self.dtype, self.numel = key, dtype, numel


class _Tensor:
    def __init__(self, storage: _Storage, shape: tuple[int, ...]):
        self.storage, self.shape = storage, shape

    def __reduce__(self):
        stride = tuple(int(np.prod(self.shape[i + 1 :])) for i in range(len(self.shape)))
        rebuild = _Global("torch._utils", "_rebuild_tensor_v2")
        return rebuild, (self.storage, 0, self.shape, stride, False, collections.OrderedDict())


TORCH_STORAGE = {"float16": "HalfStorage", "float32": "FloatStorage", "int64": "LongStorage", "bool": "BoolStorage"}


class _TorchPickler(pickle._Pickler):
    dispatch = pickle._Pickler.dispatch.copy()

    def save_reference(self, obj: _Global) -> None:
        self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())

    dispatch[_Global] = save_reference

    def persistent_id(self, obj):
        if isinstance(obj, _Storage):
            return ("storage", _Global("torch", TORCH_STORAGE[obj.dtype]), obj.key, "cpu", obj.numel)
        return None


def write_torch_zip(path: Path, tensors: dict[str, np.ndarray]) -> None:
    state, blobs = collections.OrderedDict(), {}
    for i, (name, value) in enumerate(tensors.items()):
        value = np.ascontiguousarray(value)
        storage = _Storage(str(i), str(value.dtype), value.size)
        state[name] = _Tensor(storage, tuple(value.shape))
        blobs[str(i)] = value.tobytes()
    buffer = io.BytesIO()
    _TorchPickler(buffer, protocol=2).dump(state)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", buffer.getvalue())
        archive.writestr("archive/byteorder", "little")
        for key, blob in blobs.items():
            archive.writestr(f"archive/data/{key}", blob)
        archive.writestr("archive/version", "3\n")


def save_safeailab_eagle3(
    path: Path,
    target,
    weights: str = "bin",
    aux: list[int] | None = None,
    seed: int = 0,
    vocab_ids: list[int] = DRAFT_IDS,
) -> Path:
    """A SafeAILab EAGLE-3 head for mlx-lm model `target`: fp16 weights in pytorch_model.bin or model.safetensors."""
    config = text_config(target.config)
    hidden = config["hidden_size"]
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(safeailab_config(config, hidden, len(vocab_ids), aux), indent=2))
    tensors = {k: v.astype(np.float16) for k, v in eagle3_tensors(hidden, 3, vocab_ids, seed=seed).items()}
    tensors |= vocabulary_tensors(vocab_ids, config["vocab_size"])
    if weights == "bin":
        write_torch_zip(path / "pytorch_model.bin", tensors)
    else:
        mx.save_safetensors(str(path / "model.safetensors"), {k: mx.array(v) for k, v in tensors.items()})
    return path


def save_speculators_eagle3(
    path: Path, target, aux: list[int], seed: int = 0, head_dim: int = 16, vocab_ids: list[int] = DRAFT_IDS
) -> Path:
    """A speculators EAGLE-3 head for `target`, with a layer of the target's family and its own head_dim."""
    config = text_config(target.config)
    hidden = config["hidden_size"]
    family = config["model_type"] if config["model_type"] in ("llama", "qwen3") else "llama"  # heads for hybrids: llama
    path.mkdir(parents=True, exist_ok=True)
    raw = speculators_config(config, hidden, len(vocab_ids), aux, family, head_dim)
    (path / "config.json").write_text(json.dumps(raw, indent=2))
    tensors = eagle3_tensors(
        hidden, len(aux), vocab_ids, head_dim=head_dim, qk_norm=family == "qwen3", seed=seed, prefix="layers.0."
    )
    tensors |= vocabulary_tensors(vocab_ids, config["vocab_size"])
    tensors["verifier_norm.weight"] = np.ones(hidden, np.float32)
    tensors["verifier_lm_head.weight"] = np.zeros((len(vocab_ids), hidden), np.float32)
    arrays = {k: mx.array(v).astype(mx.bfloat16) if v.dtype == np.float32 else mx.array(v) for k, v in tensors.items()}
    mx.save_safetensors(str(path / "model.safetensors"), arrays)
    return path
