"""A draft model's hot vocabulary (FR-Spec, arXiv 2502.14856): its output layer cut to the most frequent tokens.

A small draft model's output layer is a large share of what it reads per token: Qwen2.5-Coder-0.5B's 151,936 x 896
rows are 30% of its file. Cut to the N tokens a corpus uses most, the layer reads N/V of that. Exactness is
untouched: the draft's q lives on the hot tokens (every other logit is -inf), so a token outside them is never
drafted, and the target's verification (either acceptance rule) still emits it at the target's rate.

The ranking counts the interpreter's standard library (code) and the Python reference's prose (pydoc_data), each
weighing half, so it is the same on every machine; it is counted once per tokenizer and cached. Special tokens
(end of turn, end of text) are always hot, so a draft can still propose the end of an answer.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxspec.decoding.target_features import output_cap
from mlxspec.drafting.lookup.corpus import read_text, split_files
from mlxspec.drafting.lookup.ngram_table import tokenizer_key
from mlxspec.errors import UserError
from mlxspec.k_quants import KQuantLinear
from mlxspec.platform import cache_dir

SHARES_FILE = "token-shares-{key}-{vocab}.npy"


def hot_vocabulary(tokenizer: Any, vocab_size: int, size: int) -> np.ndarray:
    """The ids of a tokenizer's `size` hot tokens, ascending."""
    if size < 1:
        raise UserError(f"--draft-vocab {size} leaves the draft no token to propose; pass at least 1")
    return hot_token_ids(corpus_token_shares(tokenizer, vocab_size), special_token_ids(tokenizer), size)


def corpus_token_shares(tokenizer: Any, vocab_size: int) -> np.ndarray:
    """[vocab_size] float64: each token's share of the stdlib's code plus its share of the reference's prose,
    counted once per tokenizer and then read from the cache."""
    path = cache_dir() / SHARES_FILE.format(key=tokenizer_key(tokenizer), vocab=vocab_size)
    try:
        return np.load(path)
    except (OSError, ValueError):
        pass
    encode = getattr(tokenizer, "_tokenizer", tokenizer)  # the fast tokenizer batches; mlx-lm's wrapper does not
    code = [text for text in (read_text(p) for p in split_files()[0]) if text]
    shares = np.zeros(vocab_size)
    for texts in (code, _prose()):
        counts = np.zeros(vocab_size)
        for start in range(0, len(texts), 200):
            for ids in encode(texts[start : start + 200], add_special_tokens=False)["input_ids"]:
                ids = np.asarray(ids, dtype=np.int64)
                counts += np.bincount(ids[ids < vocab_size], minlength=vocab_size)
        shares += counts / max(1.0, counts.sum())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, shares)
    except OSError:
        pass  # a read-only home only costs a recount next time
    return shares


def _prose() -> list[str]:
    from pydoc_data.topics import topics

    return [text for _, text in sorted(topics.items())]


def hot_token_ids(shares: np.ndarray, special_ids: list[int], size: int) -> np.ndarray:
    """The `size` most frequent ids (ties: the lower id), special ids always among them; ascending, int32."""
    vocab = shares.shape[0]
    special = sorted({i for i in special_ids if 0 <= i < vocab})
    ranked = np.lexsort((np.arange(vocab), -shares))
    rest = ranked[~np.isin(ranked, special)][: max(0, size - len(special))]
    return np.sort(np.concatenate([np.asarray(special, dtype=np.int64), rest])).astype(np.int32)


def special_token_ids(tokenizer: Any) -> list[int]:
    ids = set(getattr(tokenizer, "all_special_ids", None) or [])
    ids |= set(getattr(tokenizer, "eos_token_ids", None) or [])
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    ids |= {int(i) for i in (getattr(hf, "added_tokens_decoder", None) or {})}
    return sorted(ids)


class HotOutput(nn.Module):
    """The hot tokens' output rows; their logits scattered into the whole vocabulary, -inf elsewhere."""

    def __init__(self, rows: nn.Module, ids: mx.array, vocab_size: int):
        super().__init__()
        self.rows = rows
        self._ids = ids  # not a parameter: never trained, quantized or saved
        self.vocab_size = vocab_size

    def __call__(self, x: mx.array) -> mx.array:
        logits = self.rows(x)
        full = mx.full((*logits.shape[:-1], self.vocab_size), -mx.inf, dtype=logits.dtype)
        full[..., self._ids] = logits
        return full


def output_rows(layer: nn.Module, ids: mx.array) -> nn.Module:
    """A Linear (or QuantizedLinear at the layer's own bits) holding `layer`'s output rows `ids` (a copy); a K-quant
    layer's rows as the affine groups its products describe (the same values)."""
    if isinstance(layer, KQuantLinear):
        rows = nn.QuantizedLinear(layer.group_size, 1, bias=False, group_size=layer.group_size, bits=layer.bits)
        rows.weight, rows.scales, rows.biases = layer.affine(ids)
    elif isinstance(layer, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
        mode = getattr(layer, "mode", "affine")
        rows = nn.QuantizedLinear(
            layer.group_size, 1, bias=False, group_size=layer.group_size, bits=layer.bits, mode=mode
        )
        rows.weight, rows.scales = layer.weight[ids], layer.scales[ids]
        if layer.get("biases") is not None:
            rows.biases = layer.biases[ids]
    else:
        rows = nn.Linear(1, 1, bias=False)
        rows.weight = layer.weight[ids]
    if isinstance(layer, (nn.Linear, nn.QuantizedLinear)) and "bias" in layer:
        rows.bias = layer.bias[ids]
    mx.eval(rows.parameters())
    rows.freeze()
    return rows


class _HotTiedOutput:
    """Mixed into a tied embedding's class: lookups unchanged, `as_linear` through the hot rows."""

    def as_linear(self, x: mx.array) -> mx.array:
        return self.hot_output(x)


def _shallow_copy(module: nn.Module, cls: type | None = None) -> nn.Module:
    cls = cls or module.__class__
    copy = cls.__new__(cls)
    copy.__dict__.update({k: v for k, v in module.__dict__.items() if not k.startswith("_mlxspec")})
    dict.update(copy, module)
    return copy


def with_hot_vocabulary(model: nn.Module, ids: np.ndarray, vocab_size: int) -> nn.Module:
    """A copy of `model` (every array shared) whose output layer computes the rows `ids` only."""
    if output_cap(model):  # tanh would turn the cold tokens' -inf into -cap: drafted after all
        raise UserError("--draft-vocab cuts the output layer of a draft, and this draft caps its logits; drop it")
    hot_ids = mx.array(ids)
    if isinstance(model.get("lm_head"), nn.Module):
        view = _shallow_copy(model)
        view["lm_head"] = HotOutput(output_rows(model["lm_head"], hot_ids), hot_ids, vocab_size)
        return view
    path = _tied_embedding_path(model)
    if path is None:
        raise UserError("--draft-vocab found no output layer in this draft (no lm_head, no tied embedding); drop it")
    view = _shallow_copy(model)
    parent = view
    for name in path[:-1]:
        parent[name] = _shallow_copy(parent[name])
        parent = parent[name]
    embedding = parent[path[-1]]
    hot = _shallow_copy(embedding, type(f"Hot{type(embedding).__name__}", (_HotTiedOutput, type(embedding)), {}))
    hot["hot_output"] = HotOutput(output_rows(embedding, hot_ids), hot_ids, vocab_size)
    parent[path[-1]] = hot
    return view


def _tied_embedding_path(model: nn.Module) -> list[str] | None:
    """The module path of the embedding whose `as_linear` is the output layer (mlx-lm's tied families)."""
    for name, module in model.named_modules():
        embedding = isinstance(module, (nn.Embedding, nn.QuantizedEmbedding, KQuantLinear))
        if embedding and name.endswith(("embed_tokens", "wte")):
            return name.split(".")
    return None
