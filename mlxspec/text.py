"""Turning accepted tokens into streamed text: incremental detokenization, EOS and stop strings."""

from __future__ import annotations

from typing import Any


def encodable(text: str) -> str:
    """`text` with what cannot be UTF-8 encoded replaced by U+FFFD: undecodable bytes carried as lone surrogates
    (argv, a file read with surrogateescape) and lone surrogates a JSON body may hold (\\ud800)."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # surrogates outside U+DC80-U+DCFF are not escaped bytes: one U+FFFD each
        text = "".join("\ufffd" if 0xD800 <= ord(c) < 0xDC80 or 0xDD00 <= ord(c) <= 0xDFFF else c for c in text)
        raw = text.encode("utf-8", "surrogateescape")
    return raw.decode("utf-8", "replace")


class TextStream:
    """Feeds accepted tokens to mlx-lm's streaming detokenizer and releases text that is final.

    Text that could still grow into a stop string is held back until it cannot; `skip` characters at the start
    (text the user already has, e.g. after token healing) are never released.
    """

    def __init__(self, tokenizer: Any, stops: list[str], stop_at_eos: bool = True, skip: int = 0):
        self.detokenizer = tokenizer.detokenizer
        self.detokenizer.reset()
        self.eos = set(tokenizer.eos_token_ids or []) if stop_at_eos else set()
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.sent = skip

    def cut_at_eos(self, tokens: list[int]) -> tuple[list[int], bool]:
        """The tokens before the first EOS, and whether there was one."""
        for i, token in enumerate(tokens):
            if token in self.eos:
                return tokens[:i], True
        return tokens, False

    def add(self, tokens: list[int], final: bool) -> tuple[str, bool]:
        """(text now safe to show, whether a stop string ended the text)."""
        for token in tokens:
            self.detokenizer.add_token(token)
        if final:
            self.detokenizer.finalize()
        text = self.detokenizer.text
        search_from = max(0, self.sent - self.hold)
        hits = [text.find(s, search_from) for s in self.stops]
        cut = min((h for h in hits if h >= 0), default=-1)
        stopped = cut >= 0
        if stopped:
            text = text[:cut]
        end = len(text) if (final or stopped) else max(self.sent, len(text) - self.hold)
        piece, self.sent = text[self.sent : end], max(self.sent, end)
        return piece, stopped
