"""The OpenAI wire format's requests, apart from HTTP: a decoded JSON body checked into a CompletionRequest (the
DecodeOptions changes it asks for). Pure functions; openai_api.py builds the responses, server.py does the I/O.

Anything mlxspec does not do (tools, response formats, streamed n > 1) is refused by name with a 400, never ignored;
so is a parameter it does not know.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any

from mlxspec.options import ACCEPTANCE_CHOICES, MAX_TOP_LOGPROBS

ROLES = ("system", "developer", "user", "assistant")
# Fields a client may send that change nothing here (accepted and ignored).
IGNORED = {"user", "metadata", "store", "service_tier", "parallel_tool_calls", "reasoning_effort", "modalities"}
IGNORED |= {"prompt_cache_key", "safety_identifier"}
# Every parameter a request may name: read, refused by name where unsupported, or in IGNORED. Anything else (a typo
# such as "repetiton_penalty") is a 400 that names it, never silently dropped.
SAMPLING_PARAMS = {"temperature", "top_p", "top_k", "min_p", "seed", "xtc_probability", "xtc_threshold"}
PENALTY_PARAMS = {"presence_penalty", "frequency_penalty", "repetition_penalty", "repetition_context_size"}
COMMON_PARAMS = {"model", "stream", "stream_options", "n", "stop", "max_tokens", "logit_bias", "logprobs"}
COMMON_PARAMS |= {"acceptance", "speculative", "response_format", "tools", "functions", "tool_choice", "function_call"}
KNOWN_PARAMS = {
    "chat": SAMPLING_PARAMS | PENALTY_PARAMS | COMMON_PARAMS | {"messages", "top_logprobs", "max_completion_tokens"},
    "text": SAMPLING_PARAMS | PENALTY_PARAMS | COMMON_PARAMS | {"prompt", "echo", "best_of", "suffix"},
}
SPECULATIVE_KEYS = {"enabled": "use_draft", "num_draft": "num_draft", "lookup": "lookup", "suffix": "suffix"}


class RequestError(Exception):
    """A request the server refuses: an HTTP status and an OpenAI-style error object naming the parameter."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        status: int = 400,
        kind: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.message, self.param, self.status = message, param, status
        kinds = {401: "authentication_error", 503: "overloaded_error", 500: "server_error"}
        self.kind = kind or kinds.get(status, "invalid_request_error")
        codes = {401: "invalid_api_key", 404: "not_found", 413: "request_too_large", 503: "queue_full"}
        self.code = code or codes.get(status)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class CompletionRequest:
    """One checked request: what to continue (messages or a prompt) and the DecodeOptions changes it asks for."""

    kind: str  # "chat" or "text"
    messages: list[dict] | None = None  # chat: role and text content of each message
    prompt: str | list[int] | None = None  # text: a string or token ids
    changes: dict = field(default_factory=dict)
    stream: bool = False
    include_usage: bool = False
    n: int = 1  # choices: n rows of one batch, seeds seed, seed + 1, ... when a seed is given


MAX_CHOICES = 16
MAX_COMPLETION_LOGPROBS = 5  # completions' logprobs, as OpenAI caps it


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _typed(body: dict, name: str, check, kind: str) -> Any:
    value = body.get(name)
    if value is not None and not check(value):
        raise RequestError(f"{name} {value!r} is not {kind}", param=name)
    return value


def _refuse_unknown(body: dict, kind: str) -> None:
    """A parameter this endpoint does not know: a 400 that names it (and the known name it is closest to)."""
    import difflib

    unknown = sorted(name for name in body if name not in KNOWN_PARAMS[kind] and name not in IGNORED)
    if not unknown:
        return
    name = unknown[0]
    shown = name if len(name) <= 60 else name[:60] + "..."
    close = difflib.get_close_matches(name, sorted(KNOWN_PARAMS[kind]), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else "; drop it"
    endpoint = "chat completions" if kind == "chat" else "completions"
    raise RequestError(f"unknown parameter {shown!r} for {endpoint}{hint}", shown)


def _refuse_unsupported(body: dict, kind: str) -> None:
    """Parameters whose effect mlxspec does not implement: a clear 400 rather than a silently different answer."""
    _refuse_unknown(body, kind)
    n = body.get("n")
    if n is not None and (not _is_int(n) or not 1 <= n <= MAX_CHOICES):
        raise RequestError(f"n {n!r} must be a whole number of choices in 1..{MAX_CHOICES}", "n")
    for name in ("tools", "functions"):
        if body.get(name):
            raise RequestError(f"{name} (tool calling) are not supported yet; drop {name}", name)
    for name, allowed in (("tool_choice", (None, "none")), ("function_call", (None, "none"))):
        if body.get(name) not in allowed:
            raise RequestError(f"{name} {body[name]!r}: tool calling is not supported yet; drop it", name)
    response_format = body.get("response_format")
    if response_format not in (None, {"type": "text"}):
        raise RequestError("response_format other than text is not supported yet; drop it", "response_format")
    if kind == "text":
        for name, neutral in (("echo", (None, False)), ("best_of", (None, 1)), ("suffix", (None, ""))):
            if body.get(name) not in neutral:
                raise RequestError(f"{name} {body[name]!r} is not supported; drop it", name)


def _text_content(content: Any, where: str) -> str:
    """A message's content as text: a string, or a list of text parts (other parts refused by name)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RequestError(f"{where}[{i}] is a {kind!r} part; only text parts are supported", where)
            texts.append(part["text"])
        return "".join(texts)
    raise RequestError(f"{where} must be a string or a list of text parts", where)


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise RequestError(f"{where} must be an object with role and content", where)
        role = message.get("role")
        if role not in ROLES:
            detail = "tool messages need tool calling, which" if role == "tool" else f"role {role!r}"
            raise RequestError(f"{where}: {detail} is not supported; use one of {', '.join(ROLES)}", f"{where}.role")
        if message.get("tool_calls"):
            raise RequestError(f"{where}: tool_calls are not supported yet", f"{where}.tool_calls")
        out.append({"role": role, "content": _text_content(message.get("content"), f"{where}.content")})
    return out


def _prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt)):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise RequestError("a batch of prompts is not supported; send one prompt per request", "prompt")
    raise RequestError("prompt must be a string or a non-empty list of token ids", "prompt")


def _speculative(value: Any) -> dict:
    """The mlxspec extension object: {"enabled": bool, "num_draft": int or "auto", "lookup": bool}. Speed only."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError("speculative must be an object with enabled, num_draft, lookup and suffix", "speculative")
    unknown = sorted(set(value) - set(SPECULATIVE_KEYS))
    if unknown:
        raise RequestError(f"speculative.{unknown[0]} is unknown; use {', '.join(SPECULATIVE_KEYS)}", "speculative")
    for name in ("enabled", "lookup", "suffix"):
        if name in value and not isinstance(value[name], bool):
            raise RequestError(f"speculative.{name} {value[name]!r} is not a boolean", f"speculative.{name}")
    changes = {SPECULATIVE_KEYS[k]: v for k, v in value.items()}
    if changes.get("suffix") and "lookup" not in changes:
        changes["lookup"] = True  # the suffix cache is searched by prompt lookup
    if changes.get("suffix") and changes.get("lookup") is False:
        raise RequestError("speculative.suffix searches by prompt lookup; drop lookup: false", "speculative.suffix")
    # Turning a drafter off turns off what needs it, whatever the server was started with: a client can always
    # ask for plain decoding (speculative.enabled: false, lookup: false).
    if changes.get("use_draft") is False:
        changes.update(tree_topk=1, tree_nodes=None)
    if changes.get("lookup") is False:
        changes.update(suffix=False, lookup_candidates=1)
    return changes


def _penalties(body: dict) -> dict[str, Any]:
    """OpenAI's presence_penalty, frequency_penalty (-2..2) and logit_bias ({"token id": -100..100}), and mlx-lm's
    repetition_penalty and repetition_context_size, as DecodeOptions changes (values checked there too)."""
    changes: dict[str, Any] = {}
    for name in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
        value = _typed(body, name, _is_number, "a number")
        if value is not None and value != 0:
            if name != "repetition_penalty" and not -2 <= value <= 2:
                raise RequestError(f"{name} {value} is outside -2..2", name)
            changes[name] = float(value)
    if _typed(body, "repetition_context_size", _is_int, "a whole number") is not None:
        changes["repetition_context_size"] = int(body["repetition_context_size"])
    bias = _typed(body, "logit_bias", lambda v: isinstance(v, dict), "an object of token ids to numbers")
    if bias:
        for token, value in bias.items():
            if not (isinstance(token, str) and token.isascii() and token.isdigit() and len(token) <= 12):
                shown = token if len(token) <= 40 else f"{token[:40]}... ({len(token)} characters)"
                raise RequestError(f"logit_bias key {shown!r} is not a token id", "logit_bias")
            if not _is_number(value) or not -100 <= value <= 100:
                raise RequestError(f"logit_bias of token {token} is {value!r}, not a number in -100..100", "logit_bias")
        changes["logit_bias"] = {int(token): float(value) for token, value in bias.items()}
    return changes


def logprobs_requested(body: dict, kind: str) -> int | None:
    """None (no logprobs), or how many alternatives each token reports."""
    if kind == "chat":
        wanted, top = body.get("logprobs"), body.get("top_logprobs")
        if wanted not in (None, True, False):
            raise RequestError(f"logprobs {wanted!r} must be true or false", "logprobs")
        if top is not None and (not _is_int(top) or not 0 <= top <= MAX_TOP_LOGPROBS):
            raise RequestError(f"top_logprobs {top!r} must be a whole number in 0..{MAX_TOP_LOGPROBS}", "top_logprobs")
        if top and not wanted:
            raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
        return (top or 0) if wanted else None
    value = body.get("logprobs")
    if value is not None and (not _is_int(value) or not 0 <= value <= MAX_COMPLETION_LOGPROBS):
        raise RequestError(f"logprobs {value!r} must be a whole number in 0..{MAX_COMPLETION_LOGPROBS}", "logprobs")
    return value


def parse_request(body: Any, kind: str) -> CompletionRequest:
    """Check a decoded JSON body of /v1/chat/completions (kind "chat") or /v1/completions ("text")."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    _refuse_unsupported(body, kind)
    _typed(body, "model", lambda v: isinstance(v, str), "a string")
    stream = _typed(body, "stream", lambda v: isinstance(v, bool), "a boolean") or False
    stream_options = _typed(body, "stream_options", lambda v: isinstance(v, dict), "an object") or {}
    include_usage = stream_options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise RequestError("stream_options.include_usage must be a boolean", "stream_options")
    changes: dict[str, Any] = {}
    for name in ("temperature", "top_p", "min_p", "xtc_probability", "xtc_threshold"):
        if _typed(body, name, _is_number, "a number") is not None:
            changes[name] = float(body[name])
    for name in ("top_k", "seed"):
        if _typed(body, name, _is_int, "a whole number") is not None:
            changes[name] = int(body[name])
    changes.update(_penalties(body))
    if (top := logprobs_requested(body, kind)) is not None:
        changes["logprobs"] = top
    for name in ("max_completion_tokens", "max_tokens"):  # the newer name wins when both are sent
        value = _typed(body, name, _is_int, "a whole number")
        if value is not None and "max_tokens" not in changes:
            if value < 1:
                raise RequestError(f"{name} {value} must be at least 1", name)
            changes["max_tokens"] = value
    choices = f"one of {', '.join(ACCEPTANCE_CHOICES)}"
    acceptance = _typed(body, "acceptance", lambda v: isinstance(v, str) and v in ACCEPTANCE_CHOICES, choices)
    if acceptance is not None:
        changes["acceptance"] = acceptance
    stop = body.get("stop")
    if stop is not None:
        if not (isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))):
            raise RequestError(f"stop {stop!r} must be a string or a list of strings", "stop")
        changes["stop"] = [s for s in ([stop] if isinstance(stop, str) else stop) if s]
    changes.update(_speculative(body.get("speculative")))
    request = CompletionRequest(kind, stream=stream, include_usage=include_usage, changes=changes, n=body.get("n") or 1)
    if kind == "chat":
        request.messages = _messages(body)
    else:
        request.prompt = _prompt(body)
    return request


# DecodeOptions' names, as its one-line refusals start with them, and the request parameters that set them.
OPTION_PARAMS = {
    "max_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "acceptance": "acceptance",
    "logit_bias": "logit_bias",
    "repetition_penalty": "repetition_penalty",
    "repetition_context_size": "repetition_context_size",
    "xtc_probability": "xtc_probability",
    "xtc_threshold": "xtc_threshold",
    "stop": "stop",
    "num_draft": "speculative.num_draft",
}


def param_named(message: str, prompt_param: str) -> str | None:
    """The request parameter a DecodeOptions or prompt refusal is about: its message starts with the option's name,
    or speaks of the prompt (messages for chat)."""
    first = message.split(" ", 1)[0]
    if first in OPTION_PARAMS:
        return OPTION_PARAMS[first]
    return prompt_param if "prompt" in message or "chat template" in message else None
