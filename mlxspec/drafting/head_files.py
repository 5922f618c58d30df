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


def warmup_cosine(lr: float, warmup: int, steps: int):
    """Linear warm-up from lr/20 over min(warmup, steps/2) steps, then cosine decay to lr/10 (both trainers)."""
    import mlx.optimizers as optim

    warmup = max(1, min(warmup, steps // 2))
    return optim.join_schedules(
        [optim.linear_schedule(lr / 20, lr, warmup), optim.cosine_decay(lr, max(steps - warmup, 1), lr / 10)],
        [warmup],
    )


def checkpoint_state(ckpt: Path) -> dict:
    """The state a checkpoint directory records ({"step": 0} when there is none yet)."""
    return json.loads((ckpt / "state.json").read_text()) if (ckpt / "state.json").exists() else {"step": 0}


def resume_checkpoint(module: nn.Module, optimizer, ckpt: Path, weights_file: str, out_dir: Path) -> None:
    """Load a checkpoint's weights and optimizer state, refusing one that does not fit `module`."""
    from mlx.utils import tree_unflatten

    from mlxspec.errors import UserError

    try:
        module.load_weights(str(ckpt / weights_file))
    except ValueError:
        raise UserError(f"the checkpoint in '{out_dir}' does not fit this run's heads; pass a new --out") from None
    optimizer.state = tree_unflatten(list(mx.load(str(ckpt / "opt.safetensors")).items()))


def save_checkpoint(module: nn.Module, optimizer, ckpt: Path, weights_file: str, state: dict) -> None:
    """Weights, optimizer state and state.json, written state last so a resume never sees a half-written step."""
    ckpt.mkdir(parents=True, exist_ok=True)
    module.save_weights(str(ckpt / weights_file))
    mx.save_safetensors(str(ckpt / "opt.safetensors"), dict(tree_flatten(optimizer.state)))
    (ckpt / "state.json").write_text(json.dumps(state))
