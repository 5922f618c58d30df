"""Loading target and draft models from local directories or Hugging Face repo ids; checking they share tokens."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxspec.errors import UserError
from mlxspec.model_files import read_config, refuse_special_file, safetensors_header
from mlxspec.platform import models_dir

MODELS_DIR = models_dir()
DEFAULT_TARGET = MODELS_DIR / "target"
DEFAULT_DRAFT = MODELS_DIR / "draft"
EMBEDDED = "embedded"  # `--eagle embedded` (and --draft, --medusa, --dflash): the drafter shipped in the package


def embedded_or(source: Any, kind: str) -> Any:
    """MODELS_DIR/kind for the name "embedded", wherever mlxspec is installed (a wheel, pipx); anything else as is."""
    if source != EMBEDDED:
        return source
    path = MODELS_DIR / kind
    if not path.is_dir():
        raise UserError(f"this install ships no embedded {kind}; pass a directory or a Hugging Face repo id")
    return path


HF_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: Any  # mlx_lm TokenizerWrapper
    config: dict
    path: Path
    variant: str = ""  # how loading changed the stored weights ("draft-bits 4, vocab 32768"); "" when it did not

    @property
    def vocab_size(self) -> int:
        """Rows of the model's output: every id it reads or writes (the embedding may be padded past the tokenizer)."""
        args = getattr(self.model, "args", None)
        return getattr(args, "vocab_size", None) or len(self.tokenizer.get_vocab())

    @property
    def compute_dtype(self) -> str:
        """The floating dtype its weights (or a quantized model's scales) compute in: mlx-lm keeps a bf16
        checkpoint in bf16, while on the CPU mlxspec widens it to float32, so their texts for a seed can differ."""
        from mlx.utils import tree_flatten

        scale_names = (".scales", ".biases", "_scales", "_mins")  # affine and K-quant scales (k_quants.py)
        linear = {f"{path}.weight" for path, m in self.model.named_modules() if isinstance(m, nn.Linear)}
        floating = [
            (name, value)
            for name, value in tree_flatten(self.model.parameters())
            if mx.issubdtype(value.dtype, mx.floating) and not name.endswith(scale_names)
        ]
        # a 16-bit Linear kept 16-bit on the CPU computes in its float32 activations (widen_for_cpu)
        for name, value in sorted(floating, key=lambda item: item[0] in linear):
            return str(value.dtype).removeprefix("mlx.core.")
        return "unknown"

    @property
    def weights_note(self) -> str:
        """A converted GGUF's block types and what each became ("Q4_K:4-bit,Q6_K:8-bit~7e-03"), else ""."""
        try:
            marker = json.loads((self.path / "gguf_source.json").read_text())
        except (OSError, ValueError):
            return ""
        note = marker.get("weights") if isinstance(marker, dict) else None
        return note if isinstance(note, str) else ""

    @property
    def context_length(self) -> int | None:
        for key in ("max_position_embeddings", "max_sequence_length", "n_positions", "seq_length"):
            if isinstance(self.config.get(key), int):
                return self.config[key]
        return None


def on_cpu() -> bool:
    return mx.default_device().type == mx.DeviceType.cpu


def resolve_model_path(name: str | Path) -> Path:
    """A local model directory, a GGUF file (converted once into mlxspec's cache), or a Hugging Face repo id fetched
    through huggingface-hub."""
    if not isinstance(name, (str, Path)):
        raise UserError(f"model {name!r} is a {type(name).__name__}; pass a model directory or a Hugging Face repo id")
    if not str(name).strip():
        raise UserError("model '' is empty; pass a model directory or a Hugging Face repo id (none: the embedded)")
    path = Path(name).expanduser()
    if path.suffix.lower() == ".gguf" and path.is_file():  # llama.cpp's format: converted once, then read as mlx-lm
        from mlxspec.gguf.convert import converted_dir

        return converted_dir(path)
    if path.exists():
        if not path.is_dir():
            raise UserError(f"model path '{name}' is a file; pass the model directory that holds config.json")
        try:
            entries = {p.name for p in path.iterdir()}
        except PermissionError:
            raise UserError(f"model directory '{name}' is not readable; check its permissions") from None
        if "config.json" not in entries:
            raise UserError(f"'{name}' has no config.json; pass an mlx-lm model directory (see mlx_lm.convert)")
        return path
    if HF_REPO_ID.match(str(name)) and not str(name).startswith((".", "/", "~")):
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(str(name), allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"]))
        except Exception as exc:  # offline, missing repo, gated repo: all end the same way for the user
            raise UserError(
                f"could not fetch '{name}' from the Hugging Face hub ({type(exc).__name__}); "
                "pass a local model directory or check the repo id and network"
            ) from None
    raise UserError(
        f"model path '{name}' does not exist; pass a local mlx-lm model directory or a Hugging Face repo id"
    )


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")


def check_model_files(path: Path) -> None:
    """Refuse, naming the file, a model directory mlx-lm would fail on with a traceback: an unreadable config, a
    damaged or missing weights file (an interrupted download), or no tokenizer."""
    config = read_config(path / "config.json")
    if not isinstance(config.get("model_type"), str):
        raise UserError(f"'{path / 'config.json'}' has no model_type; is it an mlx-lm or Hugging Face model?")
    weights = sorted(p for p in path.glob("*.safetensors") if p.exists() or p.is_symlink())
    if not weights:
        raise UserError(
            f"'{path}' has no .safetensors weights; download the whole model or convert it with mlx_lm.convert"
        )
    for file in weights:
        safetensors_header(file)
    for name in TOKENIZER_FILES:
        refuse_special_file(path / name)
    check_tokenizer_json(path / "tokenizer.json")
    if not any((path / name).exists() for name in TOKENIZER_FILES):
        raise UserError(
            f"'{path}' has no tokenizer ({' or '.join(TOKENIZER_FILES[:2])}); copy the tokenizer files of the "
            "model it was converted from into it"
        )


def check_tokenizer_json(file: Path) -> None:
    """Name an unreadable or damaged tokenizer.json itself (it is not the weights that need fetching again)."""
    if not file.exists():
        return
    try:
        json.loads(file.read_text(encoding="utf-8"))
    except PermissionError:
        raise UserError(f"'{file}' is not readable; check its permissions") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        reason = type(error).__name__
        raise UserError(
            f"'{file}' cannot be read as a tokenizer ({reason}); copy the tokenizer files of the model it came from"
        ) from None


def load_model(
    name: str | Path,
    quantize_bits: int | None = None,
    group_size: int = 64,
    shard: Callable | None = None,
    requantize: bool = False,
) -> LoadedModel:
    """Load an mlx-lm model; on the CPU backend compute in float32, since half-precision matmul is emulated there.

    requantize: a model already quantized is brought down to `quantize_bits` where it holds more (a draft's
    weights only change its guesses, never the output); without it, quantizing a quantized model is refused.

    shard(model, config): split it across distributed ranks before any weight is read, so each rank reads only its
    part."""
    from mlx_lm.utils import quantize_model
    from transformers.utils import logging as transformers_logging

    # Its "sequence length is longer than the specified maximum" warning would precede mlxspec's own one line.
    transformers_logging.set_verbosity_error()
    path = resolve_model_path(name)
    check_model_files(path)
    try:
        model, tokenizer, config = _load(path, lazy=shard is not None)
    except (ValueError, FileNotFoundError, KeyError, TypeError, json.JSONDecodeError) as exc:
        detail = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"could not load '{name}': {detail}") from None
    except (RuntimeError, OSError, OverflowError) as exc:  # what a damaged weights file raises inside mlx
        raise UserError(
            f"could not read the weights in '{name}' ({type(exc).__name__}); re-download the model"
        ) from None
    if shard is not None:
        shard(model, config)
    variant = ""
    if quantize_bits:
        if quantize_bits not in (4, 8):
            raise UserError(f"--quantize-target {quantize_bits} is not supported; use 4 or 8")
        if "quantization" in config and not requantize:
            raise UserError(f"'{name}' is already quantized; drop --quantize-target")
        if "quantization" in config:
            changed = requantized(model, quantize_bits, group_size)
            variant = f"bits {quantize_bits}" + (f" ({', '.join(changed)})" if changed else " (as stored)")
        else:
            model, config = quantize_model(model, config, group_size, quantize_bits)
            variant = f"bits {quantize_bits}"
    if on_cpu():
        widen_for_cpu(model)
    mx.eval(model.parameters())
    return LoadedModel(model, tokenizer, config, path, variant)


def _load(path: Path, lazy: bool) -> tuple[nn.Module, Any, dict]:
    """mlx-lm's load; a converted GGUF whose K-quant layers are held factored (k_quants.py) is built by mlx-lm
    without them (they are listed, not quantized, in its config) and then given them from the same file."""
    from mlx_lm.utils import load as mlx_lm_load
    from mlx_lm.utils import load_model as mlx_lm_load_model
    from mlx_lm.utils import load_tokenizer

    from mlxspec import k_quants

    try:
        stored = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        stored = {}
    layers = stored.get(k_quants.CONFIG_KEY) if isinstance(stored, dict) else None
    if not layers:
        return mlx_lm_load(str(path), return_config=True, lazy=lazy)
    model, config = mlx_lm_load_model(path, lazy=True, strict=False)  # the K-quant parts are not the model's
    weights = {}
    for file in sorted(path.glob("model*.safetensors")):
        weights.update(mx.load(str(file)))
    missing = sorted({f"{layer}.{part}" for layer in layers for part in k_quants.PARTS} - set(weights))
    if missing:
        raise ValueError(f"{len(missing)} K-quant arrays are missing from the weights, e.g. {missing[0]}")
    k_quants.attach(model, weights, layers)
    from mlx.utils import tree_flatten

    unread = [name for name, _ in tree_flatten(model.parameters()) if name not in weights]
    if unread:  # what strict loading would have refused
        raise ValueError(f"{len(unread)} parameters are missing from the weights, e.g. {unread[0]}")
    if not lazy:
        mx.eval(model.parameters())
    return model, load_tokenizer(path, eos_token_ids=config.get("eos_token_id")), config


def requantized(model: nn.Module, bits: int, group_size: int = 64) -> list[str]:
    """Quantized layers held at more than `bits` re-quantized to `bits` (float16 scales), in place; what changed,
    as "8-bit -> 4-bit" per distinct kind."""
    changed = set()
    for _, module in model.named_modules():
        if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)) and module.bits > bits:
            mode = getattr(module, "mode", "affine")
            if mode != "affine":
                continue
            values = mx.dequantize(module.weight, module.scales, module.biases, module.group_size, module.bits)
            weight, scales, biases = mx.quantize(values.astype(mx.float32), group_size, bits)
            changed.add(f"{module.bits}-bit -> {bits}-bit")
            module.weight, module.scales, module.biases = weight, scales.astype(mx.float16), biases.astype(mx.float16)
            module.bits, module.group_size = bits, group_size
            mx.eval(module.weight, module.scales, module.biases)
    return sorted(changed)


def widen_for_cpu(model: nn.Module) -> None:
    """Float32 for what the CPU computes in (half-precision arithmetic is emulated there): norms, embeddings, biases
    and a quantized embedding's scales (its lookups are the hidden state), so every activation is float32. What
    stays as stored: a quantized Linear's codes, scales and biases, and a 16-bit Linear's weight matrix. The kernel
    widens those as it reads them (exactly, so the bits are those of the float32 weights), at half the bytes."""
    for _, module in model.named_modules():
        if isinstance(module, nn.QuantizedLinear):
            continue
        kept = ("weight",) if isinstance(module, nn.Linear) else ()
        floats = {
            k: v.astype(mx.float32) for k, v in module.items() if isinstance(v, mx.array) and _half(v) and k not in kept
        }
        if floats:
            module.update(floats)


def _half(value: mx.array) -> bool:
    return mx.issubdtype(value.dtype, mx.floating) and value.dtype != mx.float32


def _special_tokens(tokenizer: Any) -> dict[str, Any]:
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    return {
        "bos_token": getattr(hf, "bos_token", None),
        "eos_token": getattr(hf, "eos_token", None),
        "pad_token": getattr(hf, "pad_token", None),
        "unk_token": getattr(hf, "unk_token", None),
        "eos_token_ids": _id_list(getattr(tokenizer, "eos_token_ids", None)),
    }


def _id_list(ids: Any) -> list:
    """mlx-lm's wrapper keeps a set of EOS ids; a bare transformers tokenizer may give one int, or None."""
    if ids is None:
        return []
    return [ids] if isinstance(ids, int) else sorted(ids)


def tokenizer_mismatch(target_tokenizer: Any, draft_tokenizer: Any) -> str | None:
    """None when the two tokenizers map ids to strings identically, else a description of the first difference."""
    target_vocab = target_tokenizer.get_vocab()
    draft_vocab = draft_tokenizer.get_vocab()
    if len(target_vocab) != len(draft_vocab):
        return f"vocabulary sizes differ: target {len(target_vocab)}, draft {len(draft_vocab)}"
    target_by_id = {i: t for t, i in target_vocab.items()}
    draft_by_id = {i: t for t, i in draft_vocab.items()}
    for token_id in sorted(set(target_by_id) | set(draft_by_id)):
        if target_by_id.get(token_id) != draft_by_id.get(token_id):
            return (
                f"token {token_id} is {target_by_id.get(token_id)!r} in the target's tokenizer "
                f"but {draft_by_id.get(token_id)!r} in the draft's"
            )
    target_special, draft_special = _special_tokens(target_tokenizer), _special_tokens(draft_tokenizer)
    for key, value in target_special.items():
        if draft_special[key] != value:
            return (
                f"special token {key} is {value!r} in the target's tokenizer but {draft_special[key]!r} in the draft's"
            )
    return None
