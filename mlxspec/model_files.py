"""Reading a checkpoint's files without loading it: config.json, safetensors headers, and mlx-lm's model class on
lazy arrays. Imports no MLX at import time, so the planner and the loader share these checks."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from mlxspec.errors import UserError


def text_config(config: dict) -> dict:
    """The language model's own config: multimodal and Gemma-3/Qwen3.5 checkpoints nest it under text_config."""
    inner = config.get("text_config")
    if isinstance(inner, dict):
        merged = {**inner}
        merged.setdefault("model_type", config.get("model_type"))
        for key in ("quantization", "tie_word_embeddings", "torch_dtype", "_model_id", "_source"):
            if key in config and key not in merged:
                merged[key] = config[key]
        return merged
    return config


# Sizes a config states: (smallest, largest) that any real model uses (bounds, not guesses). A value outside them, or
# of another type, is refused by name before arithmetic or mlx-lm divides by it or allocates for it. Expert counts
# may be 0 (a dense model).
CONFIG_SIZES = {
    "vocab_size": (1, 10**8),
    "hidden_size": (1, 10**6),
    "intermediate_size": (1, 10**7),
    "moe_intermediate_size": (1, 10**7),
    "num_hidden_layers": (1, 10**4),
    "num_attention_heads": (1, 10**4),
    "num_key_value_heads": (1, 10**4),
    "head_dim": (1, 10**5),
    "max_position_embeddings": (1, 10**9),
    "sliding_window_pattern": (1, 10**4),
    "num_local_experts": (0, 10**5),
    "num_experts": (0, 10**5),
    "n_routed_experts": (0, 10**5),
    "num_experts_per_tok": (0, 10**5),
}


def check_config(config: dict, where: str) -> None:
    """Refuse, naming the key, a config whose sizes are not whole numbers in range or whose quantization is not an
    object: one check for generate, serve and plan alike."""
    for key, (low, high) in CONFIG_SIZES.items():
        value = config.get(key)
        values = value if isinstance(value, list) else [value]  # some families give one size per layer
        if key == "sliding_window_pattern" and isinstance(value, str) and value:
            continue  # exaone4 spells its pattern out ("LLGL")
        if value is None or all(isinstance(v, int) and not isinstance(v, bool) and low <= v <= high for v in values):
            continue
        raise UserError(f"'{where}' says {key}={value!r}; it must be a whole number in {low}..{high}")
    quantization = config.get("quantization")
    if quantization is not None and not (
        isinstance(quantization, dict)
        and all(isinstance(quantization.get(k, 0), int) and quantization.get(k, 1) > 0 for k in ("bits", "group_size"))
    ):
        raise UserError(f"'{where}' says quantization={quantization!r}; it must be an object with bits and group_size")


def _corrupt(path: Path, why: str) -> UserError:
    return UserError(f"weights file '{path}' {why}: the download is incomplete or damaged; re-download the model")


def refuse_special_file(path: Path) -> None:
    """A pipe or device where a file should be would block a read forever: refuse it by name."""
    if path.exists() and not path.is_file() and not path.is_dir():
        raise UserError(f"'{path}' is not a regular file (a pipe or a device?); pass the model's own files")


def safetensors_header(path: Path) -> dict:
    """A safetensors file's tensor table (8-byte length, then JSON), checked against the file's size, so a truncated
    or garbage file (an interrupted download) is named before anything tries to map it. Reads only the header."""
    path = Path(path)
    if not path.exists():
        raise _corrupt(path, "is missing" + (" (a dangling symlink)" if path.is_symlink() else ""))
    refuse_special_file(path)
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


def read_config(path: Path) -> dict:
    """The config as a flat language-model config (a nested text_config is lifted out)."""
    if path.is_dir():
        raise UserError(f"'{path}' is a directory, not a config.json; pass the file or the model directory")
    refuse_special_file(path)
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read '{path}' as a config.json: {exc}") from None
    except RecursionError:
        raise UserError(f"'{path}' nests its JSON too deeply to be a config.json; pass a model's config.json") from None
    if not isinstance(config, dict):
        raise UserError(f"'{path}' holds JSON but not a config object; pass a model's config.json")
    config = text_config(config)
    check_config(config, str(path))
    return config


def lazy_model(config: dict):
    """The mlx-lm model for `config` on lazy arrays (nothing allocated), or a one-line refusal naming the family."""
    from mlx_lm.utils import _get_classes

    family = config.get("model_type")
    if isinstance(family, str) and family.endswith("_text"):
        # A nested text config brought up a level (metadata.text_config): mlx-lm names some only by their wrapper.
        try:
            _get_classes(config)
        except ValueError:
            config = {**config, "model_type": family[: -len("_text")]}
    try:
        model_class, args_class = _get_classes(config)
        return model_class(args_class.from_dict(config))
    except (ValueError, ImportError) as error:
        raise UserError(f"model_type {family!r} is not one mlx-lm can build here ({error}); it cannot be planned")
    except (TypeError, KeyError, AttributeError) as error:
        raise UserError(f"the {family} config lacks what mlx-lm needs to build it ({error}); is it complete?")
