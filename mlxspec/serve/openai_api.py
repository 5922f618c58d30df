"""The OpenAI wire format's responses, apart from HTTP: the response, chunk and usage objects built from mlxspec's
results. Pure functions; openai_request.py checks the requests, server.py does the I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxspec import __version__
from mlxspec.results import Stats

# OpenAI's responses name the backend configuration that served them; here the mlxspec release (outputs are exact
# either way: the fingerprint is for clients that log it).
SYSTEM_FINGERPRINT = f"fp_mlxspec_{__version__}"


def usage(stats: Stats) -> dict:
    """OpenAI's usage object, with the reused prefix as prompt_tokens_details.cached_tokens and the speculative
    statistics as an extension."""
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.reused_tokens},
        "speculative": {
            "mode": stats.mode,
            "num_draft": stats.num_draft,
            "drafted": stats.drafted,
            "accepted": stats.accepted,
            "acceptance_rate": round(stats.acceptance_rate, 4) if stats.drafted else None,  # nothing drafted
            "tokens_per_target_call": round(stats.tokens_per_target_call, 4),
            "batch_rows": round(stats.batch_rows, 2),
            "tokens_per_second": round(stats.tokens_per_second, 2),
            "prompt_seconds": round(stats.prompt_seconds, 4),
            "prompt_cache": stats.prompt_cache,
            "reused_tokens": stats.reused_tokens,
            "seed": stats.seed,
            "acceptance": stats.acceptance or None,  # the rule sampled drafts were kept by (null: greedy)
            "note": stats.note,
        },
    }


@dataclass(frozen=True)
class Reply:
    """What every response and chunk of one completion repeats: its id, its own creation time, the model, and
    whether the stream ends with a usage chunk (then the earlier chunks say "usage": null, as OpenAI's do)."""

    kind: str  # "chat" or "text"
    id: str
    created: int
    model: str
    include_usage: bool = False

    def head(self, streamed: bool) -> dict:
        chat = self.kind == "chat"
        obj = ("chat.completion.chunk" if streamed else "chat.completion") if chat else "text_completion"
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }


def completion(reply: Reply, text: str, finish: str | None, stats: Stats, logprobs: dict | None = None) -> dict:
    """The whole (non-streamed) response."""
    return completions(reply, [(text, finish, stats, logprobs)])


def completions(reply: Reply, choices: list[tuple[str, str | None, Stats, dict | None]]) -> dict:
    """The whole response with one choice per (text, finish reason, stats, logprobs): the usage counts the prompt
    once and every choice's tokens; its speculative part is the first choice's."""
    out = []
    for index, (text, finish, _, logprobs) in enumerate(choices):
        if reply.kind == "chat":
            message = {"role": "assistant", "content": text}
            out.append({"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish})
        else:
            out.append({"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs})
    total = usage(choices[0][2])
    total["completion_tokens"] = sum(choice[2].generated_tokens for choice in choices)
    total["total_tokens"] = total["prompt_tokens"] + total["completion_tokens"]
    return {**reply.head(streamed=False), "choices": out, "usage": total}


def role_chunk(reply: Reply, index: int = 0) -> dict:
    """A chat stream's first chunk: the assistant role and no text yet, as OpenAI's streams begin."""
    return _chunk(reply, {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None})


def chunk(reply: Reply, text: str | None, finish: str | None, logprobs: dict | None = None, index: int = 0) -> dict:
    """One streamed chunk of text, or the last one with the finish reason and no text (of choice `index`)."""
    if reply.kind == "chat":
        choice = {"index": index, "delta": {"content": text} if text else {}, "logprobs": logprobs}
    else:
        choice = {"index": index, "text": text or "", "logprobs": logprobs}
    return _chunk(reply, {**choice, "finish_reason": finish})


def _chunk(reply: Reply, choice: dict) -> dict:
    choice.setdefault("finish_reason", None)
    out = {**reply.head(streamed=True), "choices": [choice]}
    if reply.include_usage:
        out["usage"] = None
    return out


def usage_chunk(reply: Reply, stats: Stats, more: list[Stats] = ()) -> dict:
    """stream_options.include_usage: the last chunk, with no choices and the run's usage (with n > 1, the other
    choices' tokens counted too)."""
    total = usage(stats)
    total["completion_tokens"] += sum(other.generated_tokens for other in more)
    total["total_tokens"] = total["prompt_tokens"] + total["completion_tokens"]
    return {**reply.head(streamed=True), "choices": [], "usage": total}
