"""DFlash checkpoints on disk, in z-lab's format: config.json and safetensors weights, read from a local directory or
a Hugging Face repo, checked against the target, and written (by `train-heads --kind dflash`) the same way.

Two config layouts are in use:
- the older repos (Qwen3-4B/8B-DFlash-b16) keep `block_size` and `rope_theta` at the top level;
- the newer transformers-5 repos (Qwen3.5-*-DFlash) nest `block_size` in `dflash_config`, give `rope_parameters`,
  and may mix sliding and full `layer_types` with a `sliding_window`.
Both carry `num_target_layers` and `dflash_config.{target_layer_ids, mask_token_id}`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from mlxspec.decoding.target_features import target_embedding_rows
from mlxspec.drafting.dflash.model import DFlashConfig, DFlashDraftModel
from mlxspec.drafting.heads.files import check_weights_fit
from mlxspec.errors import UserError
from mlxspec.loading import HF_REPO_ID, LoadedModel, on_cpu
from mlxspec.model_files import read_config, safetensors_header, text_config

SHARED_WEIGHTS = ("embed_tokens.", "lm_head.")  # the target's: a checkpoint that carries copies has them ignored


def fetch_dflash(source: str | Path) -> Path:
    """A local DFlash directory, or a Hugging Face repo id fetched (config and weights only)."""
    path = Path(str(source)).expanduser()
    if not str(source).strip():
        raise UserError("--dflash '' is empty; pass a DFlash directory or a Hugging Face repo id")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(f"--dflash '{source}' has no config.json; pass a DFlash checkpoint directory")
        return path
    if path.exists() or not HF_REPO_ID.match(str(source)) or str(source).startswith((".", "/", "~")):
        raise UserError(f"--dflash '{source}' is not a DFlash directory or a Hugging Face repo id")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(source), allow_patterns=["*.json", "*.safetensors"]))
    except Exception as exc:  # offline, missing or gated repo: all end the same way for the user
        raise UserError(
            f"could not fetch --dflash '{source}' from the Hugging Face hub ({type(exc).__name__}); "
            "pass a local directory or check the repo id and network"
        ) from None


# The most a DFlash config may say, checked before anything is built from it (a block of 10^9 rows, or 10^9 layers,
# would be built before the weights are read). z-lab's drafters have blocks of 16 and a few layers.
LIMITS = {"block_size": 1024, "num_hidden_layers": 256, "num_target_layers": 1024, "num_attention_heads": 1024}
LIMITS |= {"num_key_value_heads": 1024, "head_dim": 4096, "hidden_size": 1 << 16, "intermediate_size": 1 << 18}
LIMITS |= {"vocab_size": 1 << 22, "mask_token_id": (1 << 22) - 1, "max_position_embeddings": 1 << 24}
LIMITS |= {"sliding_window": 1 << 24}
ROPE_FACTOR_TYPES = ("linear", "dynamic", "yarn", "llama3", "longrope")


def _number(raw: dict, key: str, where: str, kind: type = int, default: Any = None, low: float = 1) -> Any:
    value, high = raw.get(key, default), LIMITS.get(key, float("inf"))
    number = isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
    if not (number and low <= value <= high and math.isfinite(value)):
        span = f">= {low}" if high == float("inf") else f"from {low} to {high}"
        raise UserError(f"'{where}' says {key}={value!r}; a DFlash config needs a number {span} there")
    return kind(value)


def _rope_scaling(raw: dict, rope: dict, where: str) -> dict | None:
    """The RoPE scaling settings (None for plain RoPE), refusing by name what initialize_rope could not read."""
    scaling = raw.get("rope_scaling") or {k: v for k, v in rope.items() if k != "rope_theta"}
    if not isinstance(scaling, dict):
        raise UserError(f"'{where}' says rope_scaling={scaling!r}; it must be an object such as {{\"rope_type\": ...}}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    if not isinstance(kind, str):
        raise UserError(f"'{where}' says rope_type={kind!r}; it must be a name such as \"linear\"")
    if kind in ROPE_FACTOR_TYPES:
        _number(scaling, "factor", f"{where} rope_scaling", float, low=1e-6)
    return scaling


def parse_dflash_config(raw: dict, where: str) -> DFlashConfig:
    """Either layout -> DFlashConfig, refusing by name a key that is missing or of the wrong type."""
    extra = raw.get("dflash_config")
    if not isinstance(extra, dict):
        raise UserError(f"'{where}' has no dflash_config object; it is not a DFlash drafter's config")
    hidden = _number(raw, "hidden_size", where)
    heads = _number(raw, "num_attention_heads", where)
    layers = _number(raw, "num_hidden_layers", where)
    target_layers = _number(raw, "num_target_layers", where)
    taps = extra.get("target_layer_ids") or default_target_layers(target_layers, layers)
    if not (isinstance(taps, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in taps)):
        raise UserError(f"'{where}' says dflash_config.target_layer_ids={taps!r}; it must be a list of layer numbers")
    bad = next((t for t in taps if not 0 <= t < target_layers), None)
    if bad is not None:
        raise UserError(f"'{where}' taps target layer {bad}, but says the target has {target_layers} layers")
    rope = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else {}
    theta = rope.get("rope_theta", raw.get("rope_theta", 1e6))
    scaling = _rope_scaling(raw, rope, where)
    block = extra.get("block_size", raw.get("block_size", 16))
    layer_types = raw.get("layer_types") or []
    if not (isinstance(layer_types, list) and len(layer_types) in (0, layers)):
        raise UserError(f"'{where}' gives {len(layer_types)} layer_types for {layers} layers")
    sliding = "sliding_attention" in layer_types
    return DFlashConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=_number(raw, "num_key_value_heads", where, default=heads),
        head_dim=_number(raw, "head_dim", where, default=hidden // heads),
        intermediate_size=_number(raw, "intermediate_size", where),
        vocab_size=_number(raw, "vocab_size", where),
        num_target_layers=target_layers,
        target_layer_ids=tuple(taps),
        mask_token_id=_number(extra, "mask_token_id", f"{where} dflash_config", low=0),
        block_size=_number({"block_size": block}, "block_size", where, low=2),
        rms_norm_eps=_number(raw, "rms_norm_eps", where, float, 1e-6, low=0),
        rope_theta=_number({"rope_theta": theta}, "rope_theta", where, float),
        rope_scaling=scaling,
        max_position_embeddings=_number(raw, "max_position_embeddings", where, default=40960),
        layer_types=tuple(layer_types),
        sliding_window=_number(raw, "sliding_window", where) if sliding else None,
        attention_bias=bool(raw.get("attention_bias", False)),
        mlxspec=raw.get("mlxspec") if isinstance(raw.get("mlxspec"), dict) else {},
    )


def default_target_layers(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's build_target_layer_ids: one tap per draft layer, spread from layer 1 to the fourth from the top."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [int(round(start + i * (end - start) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def check_fits_target(config: DFlashConfig, target: LoadedModel, where: str) -> None:
    """Refuse by name a drafter made for another target: its layer count, hidden size or vocabulary."""
    own = text_config(target.config)
    embed_rows = target_embedding_rows(target)
    for what, theirs, mine in (
        ("num_target_layers", config.num_target_layers, own.get("num_hidden_layers")),
        ("hidden_size", config.hidden_size, own.get("hidden_size")),
        ("vocab_size", config.vocab_size, embed_rows),
    ):
        if theirs != mine:
            raise UserError(
                f"the DFlash drafter '{where}' expects a target with {what}={theirs}, but '{target.path.name}' has "
                f"{mine}; pass the drafter made for this target"
            )
    if not 0 <= config.mask_token_id < embed_rows:
        raise UserError(f"'{where}' says mask_token_id={config.mask_token_id}, outside the target's vocabulary")
    identity = config.mlxspec.get("base_model_identity")
    if identity:  # ours carry the base model's fingerprint, as EAGLE heads do (z-lab's carry none)
        from mlxspec.drafting.heads.files import base_model_identity

        if identity != base_model_identity(target.path):
            raise UserError(
                f"'{where}' was trained on base model '{config.mlxspec.get('base_model')}', not on "
                f"'{target.path}'; train one for this model with `mlxspec train-heads --kind dflash`"
            )


def load_dflash(source: str | Path, target: LoadedModel) -> DFlashDraftModel:
    """The DFlash drafter at `source` for `target`, its weights checked tensor by tensor, in the compute dtype."""
    path = fetch_dflash(source)
    raw = read_config(path / "config.json")
    config = parse_dflash_config(raw, str(path / "config.json"))
    check_fits_target(config, target, str(source))
    from mlxspec.decoding.target_features import decoder_layers

    decoder_layers(target.model)  # a family whose layers cannot be tapped is refused by name here
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise UserError(f"--dflash '{source}' holds no .safetensors weights; is the download complete?")
    weights: dict[str, mx.array] = {}
    for file in files:
        safetensors_header(file)  # a truncated or garbage file is named before MLX maps it
        weights.update({k: v for k, v in mx.load(str(file)).items() if not k.startswith(SHARED_WEIGHTS)})
    if config.num_hidden_layers > len(weights):  # each layer has tensors: say so before building them
        raise UserError(f"--dflash '{source}' says {config.num_hidden_layers} layers but holds {len(weights)} tensors")
    try:
        model = DFlashDraftModel(config)
    except (KeyError, ValueError, TypeError, AssertionError) as error:  # RoPE settings mlx-lm cannot build
        raise UserError(
            f"--dflash '{source}': its rope_scaling {config.rope_scaling!r} is not one mlx-lm can build "
            f"({type(error).__name__}: {error})"
        ) from None
    check_weights_fit(model, weights, f"the DFlash drafter '{source}'")
    model.load_weights(list(weights.items()))
    if on_cpu():  # as the target: half-precision matmul is emulated on the CPU
        model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def save_dflash(model: DFlashDraftModel, out_dir: Path, extra: dict | None = None) -> None:
    """Write `model` as z-lab's loaders read it (the newer layout, which ours and theirs both parse): config.json
    and model.safetensors in bf16, with our own keys under "mlxspec"."""
    config = model.config
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.intermediate_size,
        "vocab_size": config.vocab_size,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": {"rope_theta": config.rope_theta, "rope_type": "default", **(config.rope_scaling or {})},
        "max_position_embeddings": config.max_position_embeddings,
        "num_target_layers": config.num_target_layers,
        "block_size": config.block_size,
        "rope_theta": config.rope_theta,
        "dflash_config": {
            "block_size": config.block_size,
            "target_layer_ids": list(config.target_layer_ids),
            "mask_token_id": config.mask_token_id,
        },
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "mlxspec": {**config.mlxspec, **(extra or {})},
    }
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out_dir / "model.safetensors"), {k: v.astype(mx.bfloat16) for k, v in weights.items()})
    (out_dir / "config.json").write_text(json.dumps(raw, indent=1) + "\n")
