"""What draft heads trained on a base model (Medusa, EAGLE) share on disk: the base model's fingerprint, checked
at load so heads never run on a model they were not trained for, and bf16 weights beside a JSON config."""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import asdict
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten


def base_model_identity(model_dir: Path) -> str:
    """A fingerprint of the base model: its config, its safetensors headers and the first MiB of each file's data."""
    digest = hashlib.sha256((model_dir / "config.json").read_bytes())
    for path in sorted(model_dir.glob("*.safetensors")):
        with open(path, "rb") as f:
            header_len = struct.unpack("<Q", f.read(8))[0]
            digest.update(f.read(header_len))
            digest.update(f.read(1 << 20))
    return digest.hexdigest()


def save_head_files(module: nn.Module, config, out_dir: Path, weights_file: str, config_file: str) -> None:
    """module's parameters in bf16 (half the bytes; the heads run in the compute dtype) and its config dataclass."""
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(module.parameters()))
    mx.save_safetensors(str(out_dir / weights_file), {k: v.astype(mx.bfloat16) for k, v in weights.items()})
    (out_dir / config_file).write_text(json.dumps(asdict(config), indent=1) + "\n")
