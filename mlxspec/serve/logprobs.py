"""OpenAI's log-probabilities in a response (openai_request.logprobs_requested reads what a request asks for).

Chat asks with `logprobs: true` and `top_logprobs: 0-20`, and gets `{"content": [{token, logprob, bytes,
top_logprobs}]}`; completions ask with `logprobs: 0-5` and get `{tokens, token_logprobs, top_logprobs,
text_offset}`. The values are the target's, as mlx-lm reports them (decoding/processors.token_logprobs), and equal
plain decoding's under any drafter.
"""

from __future__ import annotations

from typing import Any


def render(kind: str, tokens: list[int], entries: list, tokenizer: Any, offset: int = 0) -> dict:
    """The response's logprobs object for `tokens` and their (logprob, [(id, logprob)]) entries."""
    text = [tokenizer.decode([token]) for token in tokens]
    if kind == "chat":
        return {
            "content": [
                {
                    "token": piece,
                    "logprob": value,
                    "bytes": list(piece.encode()),
                    "top_logprobs": [_alternative(tokenizer, i, v) for i, v in top],
                }
                for piece, (value, top) in zip(text, entries)
            ]
        }
    offsets = []
    for piece in text:
        offsets.append(offset)
        offset += len(piece)
    return {
        "tokens": text,
        "token_logprobs": [value for value, _ in entries],
        "top_logprobs": [{tokenizer.decode([i]): v for i, v in top} for _, top in entries],
        "text_offset": offsets,
    }


def _alternative(tokenizer: Any, token: int, value: float) -> dict:
    piece = tokenizer.decode([token])
    return {"token": piece, "logprob": value, "bytes": list(piece.encode())}
