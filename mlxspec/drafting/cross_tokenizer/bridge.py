"""Two tokenizers side by side, for a draft model whose tokenizer is not the target's (cross_tokenizer.py).

Everything here works on bytes: each token's exact bytes (a byte-level BPE token's characters mapped back through
GPT-2's byte table, a SentencePiece piece with its "▁" spaces and <0xNN> byte pieces), so text never passes through a
lossy decode. Two uses:

- the tokens both vocabularies hold (the same bytes), for token-level intersection (TLI, Timor et al. 2025): a
  draft token in the intersection stands for exactly one target token;
- re-tokenizing the draft's text into target tokens (string-level exact match, SLEM), continuing the target's own
  tokens: the last few target tokens are re-encoded together with the draft's text, and the result is used only
  where it starts with those same tokens, so the proposal spells exactly the draft's text after the target's.
  The last proposed token is dropped (unless the draft ended its text): more text could still merge into it.

Special tokens (BOS, EOS, chat markers) have no bytes; the draft's EOS maps to the target's.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import mlx.core as mx
import numpy as np

from mlxspec.loading import LoadedModel, tokenizer_mismatch

TAIL_TOKENS = 3  # target tokens re-encoded with the draft's text, so a boundary that merges differently shows


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode table, inverted: the character each byte is written as in a byte-level vocab."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _hf(tokenizer: Any) -> Any:
    return getattr(tokenizer, "_tokenizer", tokenizer)


def _style(tokenizer: Any) -> str:
    backend = getattr(_hf(tokenizer), "backend_tokenizer", None)
    decoder = repr(getattr(backend, "decoder", None))
    if "ByteLevel" in decoder:
        return "byte-level"
    if "Metaspace" in decoder or "▁" in decoder:
        return "sentencepiece"
    return "plain"


def _piece_bytes(piece: str, style: str) -> bytes | None:
    if style == "byte-level":
        table = _byte_decoder()
        return bytes(table[c] for c in piece) if all(c in table for c in piece) else None
    if style == "sentencepiece":
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])
        return piece.replace("▁", " ").encode()
    return piece.encode()


def token_bytes(tokenizer: Any, width: int) -> list[bytes | None]:
    """Each id's bytes, for ids 0..width-1 (None: a special token, or an id the tokenizer does not name)."""
    hf = _hf(tokenizer)
    style = _style(tokenizer)
    specials = set(getattr(hf, "all_special_ids", []) or [])
    added = {i: t.content for i, t in (getattr(hf, "added_tokens_decoder", None) or {}).items()}
    out: list[bytes | None] = [None] * width
    for piece, i in hf.get_vocab().items():
        if i >= width or i in specials:
            continue
        # added tokens are stored as written, not in the vocabulary's byte alphabet
        out[i] = added[i].encode() if i in added else _piece_bytes(piece, style)
    return out


def complete_utf8(data: bytes) -> bytes:
    """`data` without a trailing, still incomplete UTF-8 character (split across tokens: it waits for its rest)."""
    for back in range(1, min(3, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: look further back for its lead
            continue
        if byte >= 0xC0:
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data[:-back] if need > back else data
        return data
    return data


class VocabBridge:
    """The target's and the draft's vocabularies: bytes per token, the shared tokens, and re-tokenization."""

    def __init__(self, target_tokenizer: Any, draft_tokenizer: Any, target_width: int, draft_width: int):
        self.target_tokenizer, self.draft_tokenizer = target_tokenizer, draft_tokenizer
        self.target_width, self.draft_width = target_width, draft_width
        self.target_bytes = token_bytes(target_tokenizer, target_width)
        self.draft_bytes = token_bytes(draft_tokenizer, draft_width)
        target_ids: dict[bytes, int] = {}
        for i, piece in enumerate(self.target_bytes):
            if piece:
                target_ids.setdefault(piece, i)
        to_target = np.full(draft_width, -1, dtype=np.int64)
        for i, piece in enumerate(self.draft_bytes):
            if piece and piece in target_ids:
                to_target[i] = target_ids[piece]
        self.target_eos = sorted(getattr(target_tokenizer, "eos_token_ids", None) or [])
        self.draft_eos = set(getattr(draft_tokenizer, "eos_token_ids", None) or [])
        for i in self.draft_eos:
            if self.target_eos and i < draft_width:
                to_target[i] = self.target_eos[0]  # the draft ending its text proposes the target's end
        self.to_target = to_target
        self.shared = int((to_target >= 0).sum())
        shared_ids = np.nonzero(to_target >= 0)[0]
        self.shared_mask = mx.array(to_target >= 0)  # [draft_width] bool
        self.shared_draft_ids = mx.array(shared_ids.astype(np.int32))
        self.shared_target_ids = mx.array(to_target[shared_ids].astype(np.int32))
        self.to_target_mx = mx.array(np.maximum(to_target, 0).astype(np.int32))
        to_draft = np.zeros(target_width, dtype=np.int32)  # a shared target token's draft id (one of them)
        to_draft[to_target[shared_ids]] = shared_ids
        self.to_draft_mx = mx.array(to_draft)

    def describe(self) -> str:
        return (
            f"{self.shared} of the draft's {self.draft_width} tokens are also the target's ({self.target_width}); "
            "greedy: the draft's text re-tokenized (SLEM); sampled: drafting over the shared tokens (TLI)"
        )

    def target_text(self, ids: list[int]) -> bytes:
        return b"".join(self.target_bytes[i] or b"" if 0 <= i < self.target_width else b"" for i in ids)

    def draft_text(self, ids: list[int]) -> bytes:
        return b"".join(self.draft_bytes[i] or b"" if 0 <= i < self.draft_width else b"" for i in ids)

    def encode_draft(self, text: bytes, first: bool = False) -> list[int]:
        """The draft's tokens for `text` (bytes that are not UTF-8 read as U+FFFD: the draft only guesses);
        `first`: as a document's start (the draft's BOS, if any)."""
        return list(_hf(self.draft_tokenizer).encode(text.decode("utf-8", errors="replace"), add_special_tokens=first))

    def _encode_target(self, text: bytes) -> list[int]:
        return list(_hf(self.target_tokenizer).encode(text.decode("utf-8", errors="replace"), add_special_tokens=False))

    def retokenize(self, tail: list[int], text: bytes, ended: bool) -> list[int]:
        """Target tokens continuing `tail` (the target's last committed tokens) that spell a stable prefix of the
        draft's `text`; `ended`: the draft ended its text there (its EOS), so the last token is stable too."""
        text = complete_utf8(text)
        if not text:
            return [self.target_eos[0]] if ended and self.target_eos else []
        for width in range(min(TAIL_TOKENS, len(tail)), 0, -1):
            context = self.target_text(tail[-width:])
            if not context or complete_utf8(context) != context:
                continue
            encoded = self._encode_target(context + text)
            if encoded[:width] == list(tail[-width:]):
                proposal = encoded[width:]
                if not ended:
                    return proposal[:-1]
                return proposal + self.target_eos[:1]
        return []  # the boundary re-tokenizes differently at every width: no proposal this step


def cross_tokenizer_bridge(target: LoadedModel, draft: LoadedModel) -> tuple[Any, str]:
    """(None, "") when the draft shares the target's tokenizer (compared by content); else the VocabBridge it drafts
    through and the one line that says so."""
    mismatch = tokenizer_mismatch(target.tokenizer, draft.tokenizer)
    if not mismatch:
        return None, ""
    bridge = VocabBridge(target.tokenizer, draft.tokenizer, target.vocab_size, draft.vocab_size)
    if mismatch.startswith("vocabulary sizes differ"):  # the models' output widths, not the tokenizers' entry counts
        mismatch = f"vocabulary sizes differ: target {target.vocab_size}, draft {draft.vocab_size}"
    return bridge, f"draft '{draft.path}' has another tokenizer ({mismatch}): {bridge.describe()}"
