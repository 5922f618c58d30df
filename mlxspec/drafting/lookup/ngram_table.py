"""A corpus bigram table: each token's most frequent successor, for prompt lookup to fall back on.

Prompt lookup has nothing to copy when the last token never occurred before (about a third of greedy steps on
held-out stdlib code). A successor table counted once over a corpus still offers a one-token guess there
(retrieval-style drafting, as in REST); like every draft it only changes speed, never the output.
The default corpus is the training split of the interpreter's standard library, so the table is the same on
every machine; it is built on first use per tokenizer (a few seconds) and cached.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from mlxspec.platform import cache_dir


def successor_table(token_ids: list[list[int]], vocab_size: int) -> np.ndarray:
    """[vocab_size] int32: the most frequent next token after each token (ties: the smaller id), -1 if unseen."""
    table = np.full(vocab_size, -1, dtype=np.int32)
    pairs = [np.asarray(ids, dtype=np.int64) for ids in token_ids if len(ids) > 1]
    if not pairs:
        return table
    codes = np.concatenate([ids[:-1] * vocab_size + ids[1:] for ids in pairs])
    unique, counts = np.unique(codes, return_counts=True)
    first, second = unique // vocab_size, unique % vocab_size
    # Sort by (first, count, -second) so each first token's last row is its most frequent, smallest successor.
    order = np.lexsort((-second, counts, first))
    first, second = first[order], second[order]
    last = np.r_[first[1:] != first[:-1], True]
    table[first[last]] = second[last]
    return table


def tokenizer_key(tokenizer: Any) -> str:
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]


def corpus_successors(tokenizer: Any, vocab_size: int) -> np.ndarray:
    """The successor table of the stdlib training files for this tokenizer, built once and then cached."""
    from mlxspec.drafting.lookup.corpus import read_text, split_files

    path = cache_dir() / f"successors-{tokenizer_key(tokenizer)}-{vocab_size}.npy"
    try:
        return np.load(path)
    except (OSError, ValueError):
        pass
    from mlxspec.progress import Progress

    files = split_files()[0]
    progress = Progress("building prompt lookup's corpus table once", len(files))
    encode = getattr(tokenizer, "_tokenizer", tokenizer)  # the fast tokenizer batches; mlx-lm's wrapper does not
    token_ids, batch = [], 200
    for start in range(0, len(files), batch):
        progress.update(start)
        texts = [text for text in (read_text(p) for p in files[start : start + batch]) if text]
        token_ids += encode(texts, add_special_tokens=False)["input_ids"] if texts else []
    progress.close()
    table = successor_table(token_ids, vocab_size)
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        np.save(path, table)
    except OSError:
        pass  # a read-only home only costs a rebuild next time
    return table
