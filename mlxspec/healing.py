"""Token healing: a prompt that ends mid-token ("...\\n" where training always saw "\\n    ") is backed up by one
token, and the first generated token must start with the text removed. Opt-in, because it changes the prompt."""

from __future__ import annotations

from functools import lru_cache

import mlx.core as mx


@lru_cache(maxsize=4)
def _token_texts(tokenizer) -> tuple[str, ...]:
    size = max(tokenizer.get_vocab().values()) + 1
    return tuple(tokenizer.decode([i]) for i in range(size))


def heal(tokenizer, tokens: list[int]) -> tuple[list[int], str, mx.array | None]:
    """(prompt without its last token, the removed text, [V] bool mask of allowed first tokens).

    Returns the prompt unchanged (and no mask) when it has a single token or nothing else extends its last one.
    """
    if len(tokens) < 2:
        return tokens, "", None
    texts = _token_texts(tokenizer)
    removed = texts[tokens[-1]]
    allowed = [i for i, text in enumerate(texts) if text.startswith(removed)]
    if len(allowed) <= 1:
        return tokens, "", None
    mask = mx.zeros(len(texts), dtype=mx.bool_)
    mask[mx.array(allowed)] = True
    return tokens[:-1], removed, mask
