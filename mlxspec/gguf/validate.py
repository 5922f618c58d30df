"""A GGUF file's header checked before anything is converted from it: the tensors' shapes, the metadata values the
mlx-lm config is built from, and the tokenizer's arrays. The file may be damaged or hostile, and a bad value met
later is a traceback (an IndexError in a reshape, a TypeError in float(), a crash at the first forward pass). Each
check refuses in one line naming the file, the value and what was expected. Pure Python: no MLX, no numpy."""

from __future__ import annotations

import math
import numbers
from typing import Any

from mlxspec.errors import UserError
from mlxspec.gguf.header import TYPES, Header

# Metadata under the architecture's prefix read as real numbers, with the open interval each must lie in.
REALS = {
    "attention.layer_norm_rms_epsilon": (0.0, 1.0),
    "rope.freq_base": (0.0, 1e12),
    "attn_logit_softcapping": (0.0, 1e6),
    "final_logit_softcapping": (0.0, 1e6),
}
COUNTS = ("attention.sliding_window", "attention.key_length", "attention.value_length", "context_length")
CORE_KINDS = ("attn_q", "attn_k", "attn_v", "attn_output", "attn_norm", "ffn_up", "ffn_down")
GEMMA3_PATTERN = 6  # Gemma 3's sliding-window pattern: every sixth layer is global (mlx-lm indexes its cache)
MAX_TOKEN_TEXT = 1 << 16


def refuse(header: Header, what: str) -> UserError:
    return UserError(f"'{header.path}' cannot be converted: {what}")


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_metadata(header: Header) -> None:
    """The architecture's numeric metadata: counts are whole numbers, reals are finite and in range."""
    for key, (low, high) in REALS.items():
        value = header.arch(key)
        if value is None:
            continue
        if not _is_real(value) or not math.isfinite(value) or not low < value < high:
            raise refuse(
                header, f"{header.architecture}.{key} is {value!r}; it must be a number in ({low:g}, {high:g})"
            )
    for key in COUNTS:
        value = header.arch(key)
        if value is not None and (type(value) is not int or not 0 < value < 1 << 24):
            raise refuse(header, f"{header.architecture}.{key} is {value!r}; it must be a whole number >= 1")
    heads, kv_heads = header.arch("attention.head_count"), header.arch("attention.head_count_kv", None)
    if type(heads) is int and type(kv_heads) is int and heads > 0 and (kv_heads < 1 or heads % kv_heads):
        raise refuse(header, f"{kv_heads} key-value heads do not divide {heads} attention heads")
    blocks = header.arch("block_count")
    if header.architecture == "gemma3" and type(blocks) is int and blocks < GEMMA3_PATTERN:
        raise refuse(
            header,
            f"gemma3 with {blocks} blocks; mlx-lm's Gemma 3 needs at least {GEMMA3_PATTERN} (one global layer in six)",
        )


def check_tensors(header: Header) -> None:
    """Every tensor has at least one dimension, rows whole blocks of its type, and each block the core layers."""
    blocks = header.arch("block_count")
    kinds: dict[int, set[str]] = {}
    for tensor in header.tensors:
        name, block = tensor.name, TYPES[tensor.type_id][1]
        if not tensor.shape or min(tensor.shape) < 1:
            raise refuse(
                header, f"tensor '{name}' has shape {list(tensor.shape)}; a weight has a size in each dimension"
            )
        if tensor.shape[-1] % block:
            raise refuse(
                header,
                f"tensor '{name}' is {tensor.type_name} with rows of {tensor.shape[-1]} values, not whole "
                f"{block}-value blocks",
            )
        parts = name.split(".")
        if parts[0] == "blk" and len(parts) >= 3 and parts[1].isdigit():
            index = int(parts[1])
            if type(blocks) is int and index >= blocks:
                raise refuse(header, f"tensor '{name}' is in block {index}, but the file says {blocks} blocks")
            kinds.setdefault(index, set()).add(parts[2])
    if "token_embd.weight" not in {t.name for t in header.tensors}:
        raise refuse(header, "it has no token_embd.weight (the embedding)")
    if type(blocks) is int:
        for index in range(blocks):
            missing = [kind for kind in CORE_KINDS if kind not in kinds.get(index, set())]
            if missing:
                raise refuse(header, f"block {index} has no {missing[0]}.weight")


def embedding_rows(header: Header) -> int:
    return next(t.shape[0] for t in header.tensors if t.name == "token_embd.weight")


def check_tokenizer(header: Header) -> None:
    """The vocabulary: one distinct string per embedding row (llama.cpp's rule), scores and types beside it, and
    gpt2 merges as "left right" pairs."""
    meta = header.metadata
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise refuse(header, "it carries no tokenizer (tokenizer.ggml.tokens); it cannot be converted alone")
    if not all(isinstance(t, str) and len(t) <= MAX_TOKEN_TEXT for t in tokens):
        bad = next(t for t in tokens if not isinstance(t, str) or len(t) > MAX_TOKEN_TEXT)
        raise refuse(header, f"tokenizer.ggml.tokens holds {type(bad).__name__} {str(bad)[:40]!r}, not token text")
    rows = embedding_rows(header)
    if len(tokens) != rows:
        raise refuse(
            header,
            f"its tokenizer has {len(tokens)} tokens but its embedding {rows} rows; llama.cpp requires them equal",
        )
    distinct = len(set(tokens))
    if distinct < len(tokens) // 2:
        raise refuse(header, f"its {len(tokens)} tokens hold only {distinct} distinct strings")
    for key, check, kind in (
        ("tokenizer.ggml.scores", lambda v: _is_real(v) and math.isfinite(v), "finite numbers"),
        ("tokenizer.ggml.token_type", lambda v: type(v) is int and 0 <= v <= 6, "token types 0..6"),
    ):
        values = meta.get(key)
        if values is None:
            continue
        if not isinstance(values, list) or len(values) != len(tokens) or not all(check(v) for v in values):
            count = len(values) if isinstance(values, list) else values
            raise refuse(header, f"{key} must be {len(tokens)} {kind} (one per token), not {count!r} values")
    model = meta.get("tokenizer.ggml.model")
    if model is not None and not isinstance(model, str):
        raise refuse(header, f"tokenizer.ggml.model is {model!r}, not a name")
    if model == "gpt2":
        merges = meta.get("tokenizer.ggml.merges")
        if not isinstance(merges, list) or not merges:
            raise refuse(header, "its gpt2 (BPE) tokenizer has no tokenizer.ggml.merges")
        for merge in merges:
            if not isinstance(merge, str) or len(merge.split(" ")) != 2 or "" in merge.split(" "):
                raise refuse(header, f"tokenizer.ggml.merges holds {str(merge)[:40]!r}, not a 'left right' pair")


def check_convertible(header: Header) -> None:
    """Everything conversion reads from the header, checked (the header itself was checked by read_header)."""
    check_metadata(header)
    check_tensors(header)
    check_tokenizer(header)
