"""A model's config.json and exact weight bytes, from a local directory, a bare config, a preset or the hub,
without reading or downloading any weights."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from .errors import UserError
from .memory_model import text_config

PRESET_DIR = Path(__file__).parent / "configs"
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


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def _corrupt(path: Path, why: str) -> UserError:
    return UserError(f"weights file '{path}' {why}: the download is incomplete or damaged; re-download the model")


def safetensors_header(path: Path) -> dict:
    """A safetensors file's tensor table (8-byte length, then JSON), checked against the file's size, so a truncated
    or garbage file (an interrupted download) is named before anything tries to map it. Reads only the header."""
    path = Path(path)
    if not path.exists():
        raise _corrupt(path, "is missing" + (" (a dangling symlink)" if path.is_symlink() else ""))
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            if size < 8:
                raise _corrupt(path, f"has {size} bytes, too few for a header")
            header_len = struct.unpack("<Q", f.read(8))[0]
            if header_len > size - 8:
                raise _corrupt(path, f"declares a {header_len}-byte header but holds {size} bytes")
            header = json.loads(f.read(header_len))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise _corrupt(path, "has an unreadable header") from None
    except OSError as exc:
        raise UserError(f"cannot read weights file '{path}': {exc.strerror}") from None
    if not isinstance(header, dict):
        raise _corrupt(path, "has an unreadable header")
    data = size - 8 - header_len
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and 0 <= offsets[0] <= offsets[1] <= data):
            raise _corrupt(path, f"ends before tensor '{name}'")
    return header


def safetensors_bytes(path: Path) -> int:
    """Sum of tensor sizes from a safetensors header; reads only the header."""
    header = safetensors_header(path)
    return sum(i["data_offsets"][1] - i["data_offsets"][0] for n, i in header.items() if n != "__metadata__")


def _read_config(path: Path) -> dict:
    """The config as a flat language-model config (a nested text_config is lifted out)."""
    if path.is_dir():
        raise UserError(f"'{path}' is a directory, not a config.json; pass the file or the model directory")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read '{path}' as a config.json: {exc}") from None
    if not isinstance(config, dict):
        raise UserError(f"'{path}' holds JSON but not a config object; pass a model's config.json")
    return text_config(config)


def load_metadata(name: str) -> ModelMetadata:
    """name: a preset (see `mlxspec plan --list`), a model directory, a config.json file, or a hub repo id."""
    path = Path(name).expanduser()
    if name in preset_names():
        config = _read_config(PRESET_DIR / f"{name}.json")
        return ModelMetadata(name, config, None, f"preset config of {config.get('_model_id', name)}")
    if path.is_file():
        return ModelMetadata(path.parent.name or name, _read_config(path), None, f"{path}")
    if path.is_dir():
        if not (path / "config.json").exists():
            raise UserError(f"'{name}' has no config.json; pass a model directory, a config.json or a preset name")
        files = sorted(p for p in path.glob("*.safetensors") if p.exists() or p.is_symlink())
        weight = sum(safetensors_bytes(f) for f in files) if files else None
        from .platform import models_dir

        name = f"embedded {path.name}" if path.resolve().parent == models_dir().resolve() else path.name
        return ModelMetadata(name, _read_config(path / "config.json"), weight, f"{path} (safetensors headers)")
    if "/" in name and not name.startswith((".", "/", "~")):
        return _hub_metadata(name)
    raise UserError(f"model '{name}' is not a preset, a local path or a repo id; presets: {', '.join(preset_names())}")


def _hub_metadata(repo_id: str) -> ModelMetadata:
    """config.json and safetensors headers through huggingface-hub (its local cache first); never weights."""
    try:
        from huggingface_hub import get_safetensors_metadata, hf_hub_download

        config = json.loads(Path(hf_hub_download(repo_id, "config.json")).read_text())
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
    return ModelMetadata(repo_id, config, weight, f"hub: {repo_id} (config.json + safetensors headers)")
