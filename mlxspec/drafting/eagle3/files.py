"""EAGLE-3 checkpoints on disk, in both published formats, read from a local directory or a Hugging Face repo:

- **SafeAILab** (`yuhuili/EAGLE3-*`): a Llama config.json with `draft_vocab_size`, and `pytorch_model.bin` (fp16,
  read without torch: torch_checkpoint.py) or `model.safetensors`, under `midlayer.*`, `fc`, `norm`, `lm_head`,
  `d2t`, `t2d`. It names no tapped layers: EAGLE and vLLM tap the inputs of layers (2, L//2, L-3).
- **vLLM speculators** (RedHat, Inferact): `speculators_model_type: "eagle3"` with the layer's config nested in
  `transformer_layer_config`, the tapped layers in `eagle_aux_hidden_state_layer_ids`, the verifier in
  `speculators_config.verifier`, and the layer under `layers.0.*`.

Tapped layers follow an explicit `eagle_aux_hidden_state_layer_ids` wherever it is given; otherwise the rule, and a
rule whose layers coincide (a 6-layer target: 2, 3, 3) is refused by name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from mlxspec.drafting.eagle3.model import LAYER_FAMILIES, Eagle3Config, Eagle3Head
from mlxspec.drafting.eagle3.torch_checkpoint import load_torch_state_dict
from mlxspec.drafting.heads.files import check_weights_fit
from mlxspec.errors import UserError
from mlxspec.loading import HF_REPO_ID, LoadedModel, on_cpu
from mlxspec.model_files import read_config, safetensors_header, text_config

IGNORED = ("verifier_lm_head.", "verifier_norm.")  # speculators' training-time copies of the target's
SPECULATORS_LAYER, SAFEAILAB_LAYER = "layers.0.", "midlayer."


def load_eagle_head(source: str | Path, target: LoadedModel) -> Any:
    """`--eagle`: mlxspec's own head (eagle_config.json, train-heads --kind eagle) or a published EAGLE-3 head in
    either format, told apart by its config files."""
    path = fetch_eagle_dir(source)
    if (path / "eagle_config.json").is_file():
        from mlxspec.drafting.heads.feature_head import load_head

        return load_head(path, target.path)
    if (path / "config.json").is_file() and is_eagle3_config(read_config(path / "config.json")):
        return load_eagle3(path, target, str(source))
    raise UserError(
        f"--eagle '{source}' is not an EAGLE head: it has no eagle_config.json (mlxspec's) and no config.json of a "
        "SafeAILab (draft_vocab_size) or speculators (speculators_model_type: eagle3) EAGLE-3 head"
    )


def is_eagle3_config(raw: dict) -> bool:
    return raw.get("speculators_model_type") == "eagle3" or "draft_vocab_size" in raw


def fetch_eagle_dir(source: str | Path, flag: str = "--eagle") -> Path:
    """A local head directory, or a Hugging Face repo id fetched (configs and weights only)."""
    path = Path(str(source)).expanduser()
    if not str(source).strip():
        raise UserError(f"{flag} '' is empty; pass an EAGLE head directory or a Hugging Face repo id")
    if path.is_dir():
        return path
    if path.exists() or not HF_REPO_ID.match(str(source)) or str(source).startswith((".", "/", "~")):
        raise UserError(f"{flag} '{source}' is not an EAGLE head directory or a Hugging Face repo id")
    try:
        from huggingface_hub import snapshot_download

        patterns = ["*.json", "*.safetensors", "pytorch_model.bin"]
        return Path(snapshot_download(str(source), allow_patterns=patterns))
    except Exception as exc:  # offline, missing or gated repo: all end the same way for the user
        raise UserError(
            f"could not fetch {flag} '{source}' from the Hugging Face hub ({type(exc).__name__}); "
            "pass a local directory or check the repo id and network"
        ) from None


def _int(raw: dict, key: str, where: str, default: Any = None) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UserError(f"'{where}' says {key}={value!r}; an EAGLE-3 config needs a whole number >= 1 there")
    return value


def _rope(raw: dict) -> tuple[float, dict | None]:
    params = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else {}
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    scaling = raw.get("rope_scaling") or {k: v for k, v in params.items() if k != "rope_theta"}
    if not scaling or scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    return theta, scaling


def parse_eagle3_config(raw: dict, where: str) -> Eagle3Config:
    """Either format -> Eagle3Config, refusing by name what is missing or not supported."""
    speculators = raw.get("speculators_model_type") == "eagle3"
    layer = raw.get("transformer_layer_config") if speculators else raw
    if not isinstance(layer, dict):
        raise UserError(f"'{where}' has no transformer_layer_config object; it is not a speculators EAGLE-3 config")
    family = str(layer.get("model_type", "llama"))
    if family not in LAYER_FAMILIES:
        raise UserError(
            f"'{where}' has a {family!r} decoder layer; mlxspec's EAGLE-3 reads {', '.join(LAYER_FAMILIES)}"
        )
    if _int(layer, "num_hidden_layers", where, 1) != 1:
        raise UserError(
            f"'{where}' has {layer['num_hidden_layers']} decoder layers; mlxspec runs 1-layer EAGLE-3 heads"
        )
    hidden, heads = _int(layer, "hidden_size", where), _int(layer, "num_attention_heads", where)
    if speculators:  # vLLM reads the config's head_dim (Qwen3's default is 128)
        head_dim = _int(layer, "head_dim", where, 128 if family == "qwen3" else hidden // heads)
    else:  # SafeAILab's cnets: hidden / heads
        head_dim = hidden // heads
    vocab = _int(layer, "vocab_size", where)
    theta, scaling = _rope(layer)
    aux = raw.get("eagle_aux_hidden_state_layer_ids") or ()
    if not (isinstance(aux, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) for i in aux)):
        raise UserError(f"'{where}' says eagle_aux_hidden_state_layer_ids={aux!r}; it must be a list of layer numbers")
    config = Eagle3Config(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=_int(layer, "num_key_value_heads", where, heads),
        head_dim=head_dim,
        intermediate_size=_int(layer, "intermediate_size", where),
        vocab_size=vocab,
        draft_vocab_size=_int(raw, "draft_vocab_size", where, vocab),
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(layer.get("max_position_embeddings") or 4096),
        layer_family=family,
        attention_bias=bool(layer.get("attention_bias", False)),
        mlp_bias=bool(layer.get("mlp_bias", False)),
        target_hidden_size=int(raw.get("target_hidden_size") or 0),
        aux_layer_ids=tuple(aux),
        norm_before_residual=bool(raw.get("norm_before_residual", False)),
        norm_before_fc=bool(raw.get("norm_before_fc", False)),
        fc_norm=bool(raw.get("fc_norm", False)),
        norm_output=bool(raw.get("norm_output", False)),
        source_format="speculators" if speculators else "safeailab",
        base_model=_verifier_name(raw) if speculators else str(raw.get("base_model", "")),
        mlxspec=raw.get("mlxspec") if isinstance(raw.get("mlxspec"), dict) else {},
    )
    if config.norm_before_fc and config.fc_norm:
        raise UserError(f"'{where}' sets both norm_before_fc and fc_norm; a head uses one or the other")
    return config


def _verifier_name(raw: dict) -> str:
    verifier = (raw.get("speculators_config") or {}).get("verifier") or {}
    return str(verifier.get("name_or_path") or "")


def default_aux_layers(num_target_layers: int) -> tuple[int, int, int]:
    """EAGLE's and vLLM's rule: the inputs of layers 2, L//2 and L-3."""
    return 2, num_target_layers // 2, num_target_layers - 3


def fit_to_target(config: Eagle3Config, target: LoadedModel, where: str) -> Eagle3Config:
    """`config` with its tapped layers resolved for `target`, or a one-line refusal naming what does not match."""
    own = text_config(target.config)
    layers, hidden = int(own.get("num_hidden_layers", 0)), int(own.get("hidden_size", 0))
    aux = config.aux_layer_ids or default_aux_layers(layers)
    explicit = bool(config.aux_layer_ids)
    if len(set(aux)) != len(aux):
        rule = "its eagle_aux_hidden_state_layer_ids" if explicit else "the EAGLE-3 rule (2, L//2, L-3)"
        raise UserError(
            f"{rule} taps layers {tuple(aux)} of '{target.path.name}' ({layers} layers): two coincide, so '{where}' "
            "cannot have been trained for this target; pass a head that names its layers in "
            "eagle_aux_hidden_state_layer_ids"
        )
    bad = next((i for i in aux if not 1 <= i < layers), None)
    if bad is not None:
        raise UserError(f"'{where}' taps the input of layer {bad}, but '{target.path.name}' has layers 0-{layers - 1}")
    from mlxspec.decoding.target_features import target_embedding_rows

    for what, theirs, mine in (
        ("hidden_size", config.feature_size, hidden),
        ("vocab_size", config.vocab_size, target_embedding_rows(target)),
    ):
        if theirs != mine:
            raise UserError(
                f"the EAGLE-3 head '{where}' expects a target with {what}={theirs}, but '{target.path.name}' has "
                f"{mine}; pass the head made for this target"
            )
    identity = config.mlxspec.get("base_model_identity")
    if identity:  # ours carry the base model's fingerprint (published heads name their verifier only)
        from mlxspec.drafting.heads.files import base_model_identity

        if identity != base_model_identity(target.path):
            raise UserError(
                f"'{where}' was trained on base model '{config.base_model}', not on '{target.path}'; train one for "
                "this model with `mlxspec train-heads --kind eagle3`"
            )
    config.aux_layer_ids = tuple(aux)
    return config


def read_weights(path: Path, where: str) -> dict[str, mx.array]:
    """model*.safetensors, else pytorch_model.bin (without torch), under the internal (SafeAILab) names."""
    files = sorted(path.glob("*.safetensors"))
    weights: dict[str, mx.array] = {}
    if files:
        for file in files:
            safetensors_header(file)  # a truncated or garbage file is named before MLX maps it
            weights.update(mx.load(str(file)))
    elif (path / "pytorch_model.bin").is_file():
        weights = load_torch_state_dict(path / "pytorch_model.bin")
    else:
        raise UserError(f"the EAGLE-3 head '{where}' holds no model.safetensors or pytorch_model.bin")
    renamed = {}
    for key, value in weights.items():
        if key.startswith(IGNORED):
            continue
        if key.startswith(SPECULATORS_LAYER):
            key = SAFEAILAB_LAYER + key[len(SPECULATORS_LAYER) :]
        renamed[key] = value
    return renamed


def vocabulary_map(weights: dict[str, mx.array], config: Eagle3Config, where: str) -> mx.array | None:
    """d2t checked: Vd offsets mapping draft ids to distinct target ids (None: the draft vocabulary is the target's)."""
    d2t, t2d = weights.pop("d2t", None), weights.pop("t2d", None)
    if d2t is None:
        if config.draft_vocab_size != config.vocab_size:
            raise UserError(f"'{where}' drafts {config.draft_vocab_size} of {config.vocab_size} tokens but has no d2t")
        return None
    ids = (mx.arange(d2t.shape[0]) + d2t.astype(mx.int64)).tolist() if d2t.ndim == 1 else []
    if (
        len(ids) != config.draft_vocab_size
        or not all(0 <= i < config.vocab_size for i in ids)
        or len(set(ids)) < len(ids)
    ):
        raise UserError(
            f"'{where}' has a d2t that does not map {config.draft_vocab_size} draft tokens to distinct target tokens"
        )
    if t2d is not None and (t2d.shape != (config.vocab_size,) or int(t2d.astype(mx.int32).sum()) != len(ids)):
        raise UserError(f"'{where}' has a t2d that disagrees with its d2t")
    return d2t


def load_eagle3(path: Path, target: LoadedModel, where: str) -> Eagle3Head:
    """The EAGLE-3 head in directory `path` for `target`, checked tensor by tensor, in the compute dtype."""
    raw = read_config(path / "config.json")
    config = fit_to_target(parse_eagle3_config(raw, str(path / "config.json")), target, where)
    from mlxspec.decoding.target_features import decoder_layers

    decoder_layers(target.model)  # a family whose layers cannot be tapped is refused by name here
    weights = read_weights(path, where)
    d2t = vocabulary_map(weights, config, where)
    embedding = weights.pop("embed_tokens.weight", None)
    config.has_embedding = embedding is not None and config.hidden_size != config.feature_size
    if config.hidden_size != config.feature_size and embedding is None:
        raise UserError(f"'{where}' is narrower than its target ({config.hidden_size}) but ships no embed_tokens")
    if config.has_embedding:
        weights["embed_tokens.weight"] = embedding
    head = Eagle3Head(config)
    head.set_vocabulary_map(d2t)
    if config.lm_head_from_target:
        if "lm_head.weight" in weights:
            raise UserError(f"'{where}' says its output rows come from the target, yet ships lm_head.weight")
        head.borrow_output_rows(target.model)
        weights["lm_head.weight"] = head.lm_head.weight
    check_weights_fit(head, weights, f"the EAGLE-3 head '{where}'")
    head.load_weights(list(weights.items()))
    if on_cpu():  # as the target: half-precision matmul is emulated on the CPU
        head.set_dtype(mx.float32)
    mx.eval(head.parameters())
    return head


def save_eagle3(head: Eagle3Head, out_dir: Path) -> None:
    """Write `head` in SafeAILab's layout (config.json and model.safetensors, fp16), naming its tapped layers in
    eagle_aux_hidden_state_layer_ids as speculators does (SafeAILab's rule cannot express small targets' taps)."""
    config = head.config
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": config.layer_family,
        "hidden_size": config.hidden_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": 1,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": config.rope_scaling,
        "max_position_embeddings": config.max_position_embeddings,
        "vocab_size": config.vocab_size,
        "draft_vocab_size": config.draft_vocab_size,
        "eagle_aux_hidden_state_layer_ids": list(config.aux_layer_ids),
        "norm_before_fc": config.norm_before_fc,
        "fc_norm": config.fc_norm,
        "norm_output": config.norm_output,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "base_model": config.base_model,
        "mlxspec": config.mlxspec,
    }
    skipped = ("embed_tokens", "lm_head") if config.lm_head_from_target else ("embed_tokens",)
    weights = {k: v.astype(mx.float16) for k, v in tree_flatten(head.parameters()) if not k.startswith(skipped)}
    ids = head.draft_to_target
    weights["d2t"] = (ids - mx.arange(ids.shape[0], dtype=mx.int32)).astype(mx.int64)
    weights["t2d"] = mx.zeros((config.vocab_size,), dtype=mx.int32).at[ids].add(1) > 0
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights)
    (out_dir / "config.json").write_text(json.dumps(raw, indent=1) + "\n")
