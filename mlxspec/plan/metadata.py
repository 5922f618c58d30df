"""A model's config.json and exact weight bytes, from a local directory, a bare config, a preset or the hub,
without reading or downloading any weights."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mlxspec.errors import UserError
from mlxspec.model_files import read_config, refuse_special_file, safetensors_bytes

PRESET_DIR = Path(__file__).parents[1] / "configs"
SAFETENSORS_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "U32": 4,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}


@dataclass
class ModelMetadata:
    name: str
    config: dict
    weight_bytes: int | None  # exact, from safetensors headers, when available
    source: str
    tokenizer_file: Path | None = None  # a local model directory's tokenizer.json (a draft's may not be the target's)


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def load_metadata(name: str) -> ModelMetadata:
    """name: a preset (see `mlxspec plan --list`), a model directory, a config.json file, or a hub repo id."""
    if not str(name).strip():
        raise UserError("model '' is empty; pass a preset name, a model directory, a config.json or a repo id")
    path = Path(name).expanduser()
    refuse_special_file(path)
    if name in preset_names():
        config = read_config(PRESET_DIR / f"{name}.json")
        return ModelMetadata(name, config, None, f"preset config of {config.get('_model_id', name)}")
    if path.is_file() and path.suffix.lower() == ".gguf":
        return _gguf_metadata(path)
    if path.is_file():
        return ModelMetadata(path.parent.name or name, read_config(path), None, f"{path}")
    if path.is_dir():
        if not (path / "config.json").exists():
            raise UserError(f"'{name}' has no config.json; pass a model directory, a config.json or a preset name")
        files = sorted(p for p in path.glob("*.safetensors") if p.exists() or p.is_symlink())
        weight = sum(safetensors_bytes(f) for f in files) if files else None
        from mlxspec.platform import models_dir

        name = f"embedded {path.name}" if path.resolve().parent == models_dir().resolve() else path.name
        tokenizer = path / "tokenizer.json"
        return ModelMetadata(
            name,
            read_config(path / "config.json"),
            weight,
            f"{path} (safetensors headers)",
            tokenizer if tokenizer.is_file() else None,
        )
    if "/" in name and not name.startswith((".", "/", "~")):
        return _hub_metadata(name)
    raise UserError(f"model '{name}' is not a preset, a local path or a repo id; presets: {', '.join(preset_names())}")


def _gguf_metadata(path: Path) -> ModelMetadata:
    """A GGUF file's model as mlxspec loads it on the CPU (quantized tensors at their own bits, gguf/weights.py),
    from the header alone: no MLX, no dequantization."""
    from mlxspec.gguf.architectures import architecture_of, mlx_config, mlx_name
    from mlxspec.gguf.header import read_header
    from mlxspec.gguf.weights import held_bytes, is_matrix_weight

    header = read_header(path)
    arch = architecture_of(header)
    vocab = next((t.shape[0] for t in header.tensors if t.name == "token_embd.weight"), 0)
    config = mlx_config(header, arch, vocab, [])
    names = [(mlx_name(t.name, arch), t) for t in header.tensors]
    if any(t.type_name not in ("F32", "F16", "BF16") and is_matrix_weight(name, t) for name, t in names):
        config["quantization"] = {"group_size": 32, "bits": 4}  # per layer: 4, 5 or 8 bits, as the file holds them
    held = sum(held_bytes(name, t) for name, t in names)
    return ModelMetadata(path.stem, config, held, f"{path} (GGUF header; its own bits)")


def _hub_metadata(repo_id: str) -> ModelMetadata:
    """config.json and safetensors headers through huggingface-hub (its local cache first); never weights."""
    try:
        from huggingface_hub import get_safetensors_metadata, hf_hub_download

        config_path = Path(hf_hub_download(repo_id, "config.json"))
        try:
            meta = get_safetensors_metadata(repo_id)
            weight = sum(
                sum(n * SAFETENSORS_DTYPE_BYTES.get(dtype, 2) for dtype, n in f.parameter_count.items())
                for f in meta.files_metadata.values()
            )
        except Exception:  # no safetensors on the hub: fall back to the config arithmetic
            weight = None
    except Exception as exc:
        raise UserError(
            f"could not read '{repo_id}' from the Hugging Face hub ({type(exc).__name__}); "
            "pass a local directory, a config.json or a preset name"
        ) from None
    config = read_config(config_path)  # checked as a local config.json is
    return ModelMetadata(repo_id, config, weight, f"hub: {repo_id} (config.json + safetensors headers)")
