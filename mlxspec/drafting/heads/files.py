"""What draft heads trained on a base model (Medusa, EAGLE) share on disk: the base model's fingerprint, checked
at load so heads never run on a model they were not trained for, and bf16 weights beside a JSON config."""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import asdict, fields
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlxspec.errors import UserError
from mlxspec.model_files import safetensors_header


def base_model_identity(model_dir: Path) -> str:
    """A fingerprint of the base model: its config, its safetensors headers and the first MiB of each file's data."""
    digest = hashlib.sha256((model_dir / "config.json").read_bytes())
    for path in sorted(model_dir.glob("*.safetensors")):
        with open(path, "rb") as f:
            header_len = struct.unpack("<Q", f.read(8))[0]
            digest.update(f.read(header_len))
            digest.update(f.read(1 << 20))
    return digest.hexdigest()


def check_weights_fit(module: nn.Module, weights: dict, what: str) -> None:
    """Refuse, naming the first offender, weights that lack a tensor `module` has, hold one it has no place for, or
    have a tensor of the wrong shape. `what` names the checkpoint ("the DFlash drafter 'x'")."""
    expected = {k: v.shape for k, v in tree_flatten(module.parameters())}
    missing, unknown = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    if missing or unknown:
        held = f"lacks {missing[0]}" if missing else f"holds {unknown[0]}, which its config has no place for"
        raise UserError(f"{what} {held}; is the checkpoint complete and for this config?")
    wrong = next((k for k in expected if tuple(weights[k].shape) != tuple(expected[k])), None)
    if wrong is not None:
        raise UserError(
            f"{what} has {wrong} of shape {tuple(weights[wrong].shape)}, but its config needs {tuple(expected[wrong])}"
        )


def save_head_files(module: nn.Module, config, out_dir: Path, weights_file: str, config_file: str) -> None:
    """module's parameters in bf16 (half the bytes; the heads run in the compute dtype) and its config dataclass."""
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(module.parameters()))
    mx.save_safetensors(str(out_dir / weights_file), {k: v.astype(mx.bfloat16) for k, v in weights.items()})
    (out_dir / config_file).write_text(json.dumps(asdict(config), indent=1) + "\n")


# Sizes a heads config may give, checked before any module is built: a hostile num_heads of 10^9 would otherwise
# build 10^9 heads before the weights are read. Drafts are at most 64 deep; the largest published vocabularies are
# about 256k tokens.
SIZE_LIMITS = {"num_heads": 64, "hidden_size": 1 << 16, "vocab_size": 1 << 22}


def read_head_config(path: Path, config_file: str, config_class: type, what: str, trainer: str):
    """The config dataclass a heads directory holds, or one line naming the file and the fix: missing, unreadable,
    not an object, unknown or missing keys, or a size that is not a whole number >= 1."""
    config_path = path / config_file
    if not config_path.is_file():
        raise UserError(f"'{path}' has no {config_file}; pass a directory written by `{trainer}`")
    try:
        raw = json.loads(config_path.read_text())
        config = config_class(**raw) if isinstance(raw, dict) else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError, TypeError) as error:
        reason = " ".join(str(error).split())
        raise UserError(
            f"'{config_path}' is not a readable {what} config ({reason}); retrain it with `{trainer}`"
        ) from None
    if config is None:
        raise UserError(f"'{config_path}' holds {type(raw).__name__}, not a {what} config object; retrain it")
    sizes = {f.name for f in fields(config)} & set(SIZE_LIMITS)
    for name in sorted(sizes):
        value, most = getattr(config, name), SIZE_LIMITS[name]
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most:
            raise UserError(f"'{config_path}' says {name}={value!r}; it must be a whole number 1-{most}; retrain it")
    return config


def load_trained_head(
    module_class: type, config, path: Path, base_model_dir: Path, weights_file: str, what: str, trainer: str
) -> nn.Module:
    """The heads `config` describes with their weights from path/weights_file, in float32: refused in one line when
    trained on another base model, or when the weights are missing, truncated, damaged or do not fit the config."""
    if config.base_model_identity != base_model_identity(base_model_dir):
        raise UserError(
            f"'{path}' holds {what} trained on base model '{config.base_model}', not on '{base_model_dir}'; "
            f"train them for this model with `{trainer}`"
        )
    weights = path / weights_file
    if not weights.exists():
        raise UserError(f"'{path}' has no {weights_file}; copy the whole {what} directory or retrain it")
    header = safetensors_header(weights)  # a truncated or garbage file is named before MLX maps it
    heads = getattr(config, "num_heads", 0)
    if heads > len(header):  # each head has at least one tensor: say so before building them
        raise UserError(f"'{path}' says num_heads={heads}, but its weights hold {len(header)} tensors; retrain it")
    module = module_class(config)
    try:
        module.load_weights(str(weights))
    except (ValueError, RuntimeError) as error:
        reason = " ".join(str(error).split())
        raise UserError(f"the weights in '{path}' do not fit its {what} config ({reason}); retrain it") from None
    module.set_dtype(mx.float32)
    mx.eval(module.parameters())
    return module


def warmup_cosine(lr: float, warmup: int, steps: int):
    """Linear warm-up from lr/20 over min(warmup, steps/2) steps, then cosine decay to lr/10 (both trainers)."""
    import mlx.optimizers as optim

    warmup = max(1, min(warmup, steps // 2))
    return optim.join_schedules(
        [optim.linear_schedule(lr / 20, lr, warmup), optim.cosine_decay(lr, max(steps - warmup, 1), lr / 10)],
        [warmup],
    )


def checkpoint_state(ckpt: Path) -> dict:
    """The state a checkpoint directory records ({"step": 0} when there is none yet), or one line when it is
    damaged: a resume must not guess."""
    state_file = ckpt / "state.json"
    if not state_file.exists():
        return {"step": 0}
    try:
        state = json.loads(state_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        state = None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int) or isinstance(state["step"], bool):
        raise UserError(f"the checkpoint '{state_file}' is damaged; remove '{ckpt}' to start over, or pass a new --out")
    return state


def check_checkpoint_identity(state: dict, identity: dict, out_dir: Path) -> None:
    """A checkpoint resumes only the run it came from: refuse one whose recorded identity (kind, shape, base model)
    differs from this run's, naming what differs."""
    for key, want in identity.items():
        if key in state and state[key] != want:
            raise UserError(f"the checkpoint in '{out_dir}' was made for another {key}; pass a new --out")


def resume_checkpoint(module: nn.Module, optimizer, ckpt: Path, weights_file: str, out_dir: Path) -> None:
    """Load a checkpoint's weights and optimizer state, refusing one that does not fit `module`."""
    from mlx.utils import tree_unflatten

    fix = f"remove '{ckpt}' to start over, or pass a new --out"
    for name in (weights_file, "opt.safetensors"):
        if not (ckpt / name).is_file():
            raise UserError(f"the checkpoint in '{out_dir}' has no {name}; {fix}")
    try:
        module.load_weights(str(ckpt / weights_file))
        optimizer.state = tree_unflatten(list(mx.load(str(ckpt / "opt.safetensors")).items()))
    except ValueError:
        raise UserError(f"the checkpoint in '{out_dir}' does not fit this run's heads; pass a new --out") from None
    except RuntimeError:  # a truncated or garbage safetensors file
        raise UserError(f"the checkpoint in '{out_dir}' is damaged; {fix}") from None


def save_checkpoint(module: nn.Module, optimizer, ckpt: Path, weights_file: str, state: dict) -> None:
    """Weights, optimizer state and state.json, written state last so a resume never sees a half-written step."""
    ckpt.mkdir(parents=True, exist_ok=True)
    module.save_weights(str(ckpt / weights_file))
    mx.save_safetensors(str(ckpt / "opt.safetensors"), dict(tree_flatten(optimizer.state)))
    (ckpt / "state.json").write_text(json.dumps(state))
