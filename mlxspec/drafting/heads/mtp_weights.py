"""Native MTP heads (`--mtp`): the multi-token-prediction layer that DeepSeek-V3/R1, GLM-4.5, Qwen3.5/3.6,
Qwen3-Next and MiMo checkpoints carry, loaded into a FeatureHead (feature_head.py).

mlx-lm's `sanitize` drops these tensors, so conversions made with `mlx_lm.convert` usually lack them. They are read
from the model directory when present, otherwise from a named directory or Hugging Face repo of the original
checkpoint, fetching only the shards its safetensors index lists for them. Names and forwards follow vLLM's
`deepseek_mtp.py`, `glm4_moe_mtp.py`, `qwen3_next_mtp.py`, `qwen3_5_mtp.py` and `mimo_mtp.py`:

- DeepSeek-V3 / GLM-4.5: `model.layers.{N}.` (N = num_hidden_layers) holds `enorm`, `hnorm`, `eh_proj` (on
  [embedding ; hidden]), `shared_head.norm`, `shared_head.head` and `embed_tokens` (copies of the model's), and
  the decoder layer's own tensors; the next depth reads the block output before `shared_head.norm`.
- Qwen3-Next / Qwen3.5/3.6: `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`, `mtp.fc` (on [embedding ;
  hidden]), `mtp.layers.0.` (a full-attention layer) and `mtp.norm`; norms are stored as w for (1 + w), as the
  model's own are, and the next depth reads the normed output.
- MiMo: `model.mtp_layers.0.` holds `token_layernorm`, `hidden_layernorm`, `input_proj` (on [hidden ;
  embedding]), `final_layernorm` and a Qwen2 layer; the next depth reads the normed output.
The embedding and LM head are the target's own (shared, not copied).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from mlxspec.drafting.heads.feature_head import FeatureHead, FeatureHeadConfig
from mlxspec.errors import UserError
from mlxspec.loading import LoadedModel, on_cpu
from mlxspec.model_files import lazy_model


@dataclass(frozen=True)
class MTPLayout:
    prefix: str  # where the MTP tensors start; {n} is num_hidden_layers
    block: str  # where the decoder layer's tensors start, under prefix
    fc: str
    enorm: str
    hnorm: str
    norm: str
    hidden_first: bool = False
    feed_normed: bool = False
    gemma_norms: bool = False  # stored as w for (1 + w): mlx-lm adds 1 to the model's own norms when converting
    blank_first_embedding: bool = False  # the forward zeroes the embedding at position 0
    block_overrides: dict = field(default_factory=dict)
    shared: tuple[str, ...] = ()  # tensors under prefix that copy the model's embedding or LM head: not loaded


DEEPSEEK = MTPLayout(
    "model.layers.{n}.",
    "",
    "eh_proj",
    "enorm",
    "hnorm",
    "shared_head.norm",
    blank_first_embedding=True,
    shared=("embed_tokens.", "shared_head.head."),
)
QWEN_NEXT = MTPLayout(
    "mtp.",
    "layers.0.",
    "fc",
    "pre_fc_norm_embedding",
    "pre_fc_norm_hidden",
    "norm",
    feed_normed=True,
    gemma_norms=True,
    block_overrides={"full_attention_interval": 1, "mlp_only_layers": []},
)
LAYOUTS = {
    "deepseek_v3": DEEPSEEK,
    "glm4_moe": DEEPSEEK,
    "qwen3_next": QWEN_NEXT,
    "qwen3_5": QWEN_NEXT,
    "qwen3_5_moe": QWEN_NEXT,
    "mimo": MTPLayout(
        "model.mtp_layers.0.",
        "",
        "input_proj",
        "token_layernorm",
        "hidden_layernorm",
        "final_layernorm",
        hidden_first=True,
        feed_normed=True,
        blank_first_embedding=True,
    ),
}


def text_config(config: dict) -> dict:
    """The language model's config, with a wrapper's text_config (Qwen3.5/3.6) brought up a level."""
    inner = config.get("text_config")
    if isinstance(inner, dict):
        return {**{k: v for k, v in config.items() if k != "text_config"}, **inner, "model_type": config["model_type"]}
    return config


def safetensors_names(path: Path) -> list[str]:
    with open(path, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    return [k for k in header if k != "__metadata__"]


def _shards_holding(directory: Path, prefix: str) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return sorted({directory / f for name, f in weight_map.items() if name.startswith(prefix)})
    return [
        p for p in sorted(directory.glob("*.safetensors")) if any(n.startswith(prefix) for n in safetensors_names(p))
    ]


def holds_mtp_tensors(directory: Path, prefix: str) -> bool:
    """Whether `directory` holds MTP tensors under `prefix` in files present on disk (metadata only)."""
    try:
        shards = _shards_holding(directory, prefix)
    except (OSError, ValueError, KeyError, struct.error):
        return False
    return bool(shards) and all(shard.is_file() for shard in shards)


def _fetch_from_hub(repo: str, prefix: str) -> Path:
    """Download only the index and the shards that hold the MTP tensors; returns the local snapshot directory."""
    try:
        from huggingface_hub import hf_hub_download

        index = Path(hf_hub_download(repo, "model.safetensors.index.json"))
        weight_map = json.loads(index.read_text())["weight_map"]
        for shard in sorted({f for name, f in weight_map.items() if name.startswith(prefix)}):
            hf_hub_download(repo, shard)
        return index.parent
    except Exception as error:  # network, auth, missing repo: one line, not a traceback
        raise UserError(f"cannot fetch the MTP shards of '{repo}' ({type(error).__name__}: {error})") from None


def read_mtp_tensors(source: Path | str, prefix: str) -> dict[str, mx.array]:
    """Every tensor whose name starts with `prefix` in a local checkpoint directory or a Hugging Face repo."""
    directory = Path(source)
    if not directory.is_dir():
        if directory.exists() or "/" not in str(source):
            raise UserError(f"--mtp '{source}' is not a checkpoint directory or a Hugging Face repo id")
        directory = _fetch_from_hub(str(source), prefix)
    tensors: dict[str, mx.array] = {}
    for shard in _shards_holding(directory, prefix):
        tensors.update({k: v for k, v in mx.load(str(shard)).items() if k.startswith(prefix)})
    return tensors


def _stack_experts(block: dict[str, mx.array]) -> dict[str, mx.array]:
    """Per-expert tensors (mlp.experts.{e}.{proj}.weight) or fused ones (mlp.experts.gate_up_proj, down_proj:
    Qwen3.5 MoE) -> mlx-lm's stacked mlp.switch_mlp.{proj}.weight [E, ...], as its sanitize builds them."""
    out, experts = {}, {}
    for name, value in block.items():
        if not name.startswith("mlp.experts."):
            out[name] = value
        elif name == "mlp.experts.gate_up_proj":
            middle = value.shape[-2] // 2
            out["mlp.switch_mlp.gate_proj.weight"] = value[..., :middle, :]
            out["mlp.switch_mlp.up_proj.weight"] = value[..., middle:, :]
        elif name == "mlp.experts.down_proj":
            out["mlp.switch_mlp.down_proj.weight"] = value
        else:
            index, rest = name[len("mlp.experts.") :].split(".", 1)
            experts.setdefault(rest, {})[int(index)] = value
    for rest, by_index in experts.items():
        out[f"mlp.switch_mlp.{rest}"] = mx.stack([by_index[e] for e in sorted(by_index)])
    return out


def _block_config(config: dict, layout: MTPLayout, moe: bool) -> dict:
    """The config that makes mlx-lm's layer 0 the layer the MTP head holds: full attention, MoE or dense."""
    overrides = dict(layout.block_overrides)
    if "first_k_dense_replace" in config or layout is DEEPSEEK:
        overrides.update(first_k_dense_replace=0 if moe else 1, moe_layer_freq=1)
    return {**config, **overrides, "num_hidden_layers": 1}


def _quantizable(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) and module.weight.shape[-1] % 64 == 0


def load_mtp_head(target: LoadedModel, source: Path | str | None = None, bits: int | None = None) -> FeatureHead:
    """The target's native MTP head from `source` (default: the model's own directory), refused by name when its
    tensors are missing or malformed. bits: quantize its matrices (group 64) as the target's are."""
    config = text_config(target.config)
    family = config.get("model_type")
    layout = LAYOUTS.get(family)
    if layout is None:
        known = ", ".join(sorted(LAYOUTS))
        raise UserError(f"model_type {family!r} has no native MTP head mlxspec can load (it knows {known}); drop --mtp")
    prefix = layout.prefix.format(n=config["num_hidden_layers"])
    where = source if source is not None else target.path
    sidecar = read_sidecar(Path(where), config, layout) if Path(str(where)).is_dir() else None
    if sidecar is not None:
        return _build_head(target, config, family, layout, *sidecar, where=where, bits=bits)
    tensors = read_mtp_tensors(where, prefix)
    if not tensors:
        raise UserError(
            f"'{where}' holds no MTP tensors ({prefix}*); mlx_lm.convert drops them: pass --mtp with the original "
            "checkpoint's directory or repo"
        )
    own = {
        role: f"{prefix}{name}.weight"
        for role, name in (("fc", layout.fc), ("enorm", layout.enorm), ("hnorm", layout.hnorm), ("norm", layout.norm))
    }
    missing = [name for name in own.values() if name not in tensors]
    if missing:
        raise UserError(f"the MTP head in '{where}' lacks {missing[0]}; is the checkpoint complete?")
    head_weights = {f"{role}.weight": tensors[name] for role, name in own.items()}
    block_prefix = prefix + layout.block
    skipped = set(own.values()) | {k for k in tensors if any(k.startswith(prefix + s) for s in layout.shared)}
    block = {k[len(block_prefix) :]: v for k, v in tensors.items() if k.startswith(block_prefix) and k not in skipped}
    moe = any(".experts." in k for k in block)
    block_config = _block_config(config, layout, moe)
    twin = lazy_model(block_config)
    if layout is DEEPSEEK:  # mlx-lm's own conversion: stacked experts, MLA's kv_b_proj split, fp8 dequantized
        sanitized = twin.sanitize({f"model.layers.0.{k}": v for k, v in block.items()})
        block = {k[len("model.layers.0.") :]: v for k, v in sanitized.items()}
    else:
        block = _stack_experts(block)
    if layout.gemma_norms:
        head_weights = {k: v + 1.0 if k != "fc.weight" else v for k, v in head_weights.items()}
        block = {k: v + 1.0 if v.ndim == 1 and k.endswith("norm.weight") else v for k, v in block.items()}
    return _build_head(target, config, family, layout, head_weights, block, None, where=where, bits=bits)


def read_sidecar(directory: Path, config: dict, layout: MTPLayout) -> tuple[dict, dict, dict | None] | None:
    """An MTP head split out as its own checkpoint (mlx-vlm's `split_mtp` / `convert --mtp`: config.json with
    model_type "qwen3_5_mtp" and the target's text_config; model.safetensors without the `mtp.` prefix, in MLX's
    convention: norms already shifted, experts stacked, possibly quantized). (head, block, quantization) or None
    when `directory` is not one."""
    raw_path = directory / "config.json"
    if not raw_path.is_file():
        return None
    raw = json.loads(raw_path.read_text())
    if raw.get("model_type") not in SIDECAR_TYPES:
        return None
    if layout is not LAYOUTS["qwen3_next"]:
        raise UserError(f"'{directory}' is a {raw['model_type']} sidecar, which fits Qwen3.5/3.6 and Qwen3-Next only")
    own = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}
    for key in ("hidden_size", "num_hidden_layers", "vocab_size"):
        if own.get(key) is not None and own.get(key) != config.get(key):
            raise UserError(
                f"the MTP sidecar '{directory}' was split from a model with {key}={own.get(key)}, but the target has "
                f"{config.get(key)}; pass the sidecar made for this model"
            )
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise UserError(f"the MTP sidecar '{directory}' holds no .safetensors weights")
    tensors: dict[str, mx.array] = {}
    for file in files:
        tensors.update(mx.load(str(file)))
    roles = {"fc": layout.fc, "enorm": layout.enorm, "hnorm": layout.hnorm, "norm": layout.norm}
    head = {}
    for role, name in roles.items():
        for suffix in (".weight", ".scales", ".biases"):
            if name + suffix in tensors:
                head[role + suffix] = tensors.pop(name + suffix)
    block_prefix = layout.block
    block = {k[len(block_prefix) :]: v for k, v in tensors.items() if k.startswith(block_prefix)}
    quantization = raw.get("quantization") if isinstance(raw.get("quantization"), dict) else None
    return head, block, quantization


SIDECAR_TYPES = ("qwen3_5_mtp",)


def _build_head(target, config, family, layout, head_weights, block, quantization, where, bits) -> FeatureHead:
    """The FeatureHead for these weights (MLX's convention), refused by name when they do not fit."""
    moe = any(".experts." in k or ".switch_mlp." in k for k in block)
    block_config = _block_config(config, layout, moe)
    twin = lazy_model(block_config)
    head_config = FeatureHeadConfig(
        block_config=block_config,
        kind=family,
        input_norms=True,
        hidden_first=layout.hidden_first,
        own_norm=True,
        feed_normed=layout.feed_normed,
        blank_first_embedding=layout.blank_first_embedding,
        norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        base_model=target.path.name,
    )
    head = FeatureHead(head_config, block=twin.layers[0])
    weights = list(head_weights.items()) + [(f"block.{k}", v) for k, v in block.items()]
    if quantization:  # a quantized sidecar: its layers take the quantized shape its tensors have
        names = {name for name, _ in weights}
        nn.quantize(
            head,
            group_size=int(quantization.get("group_size", 64)),
            bits=int(quantization.get("bits", 4)),
            class_predicate=lambda path, module: f"{path}.scales" in names,
        )
    try:
        head.load_weights(weights, strict=True)
    except ValueError as error:
        raise UserError(f"the MTP tensors in '{where}' do not fit a {family} MTP layer ({error})") from None
    head.set_dtype(mx.float32 if on_cpu() else mx.bfloat16)  # CPU matmuls are fast only in float32
    if bits:  # matrices whose rows split into groups of 64, as mlx-lm quantizes
        nn.quantize(head, group_size=64, bits=bits, class_predicate=lambda _, m: _quantizable(m))
    mx.eval(head.parameters())
    return head
