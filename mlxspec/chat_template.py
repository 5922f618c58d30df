"""Messages to prompt tokens through the model's own chat template (shared by generate --chat, chat and serve)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlxspec.errors import UserError
from mlxspec.template_limits import check_template_limits
from mlxspec.text import encodable


def encode_messages(tokenizer: Any, messages: list[dict], model_path: Path | str) -> list[int]:
    """Token ids of `messages` ({role, content} with text content) followed by the assistant's generation prompt."""
    tokens = apply_template(tokenizer, messages, model_path, tokenize=True)
    if isinstance(tokens, dict):  # some tokenizers return a BatchEncoding
        tokens = tokens["input_ids"]
    return list(tokens)


def render_messages(tokenizer: Any, messages: list[dict], model_path: Path | str) -> str:
    """The text encode_messages tokenizes: what lets a chat continue from the tokens it generated."""
    return str(apply_template(tokenizer, messages, model_path, tokenize=False))


def apply_template(tokenizer: Any, messages: list[dict], model_path: Path | str, tokenize: bool) -> Any:
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(
            f"'{model_path}' has no chat template; continue plain text instead (drop --chat, or use /v1/completions)"
        )
    messages = [{**m, "content": encodable(m["content"])} if isinstance(m.get("content"), str) else m for m in messages]
    template = tokenizer.chat_template
    if isinstance(template, str):  # bounded in time and size first: the template is the model files' code
        special = getattr(tokenizer, "special_tokens_map", None)
        variables = {**(special if isinstance(special, dict) else {}), "add_generation_prompt": True}
        check_template_limits(template, messages, {**variables, "tools": None, "documents": None})
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=tokenize)
    except Exception as error:  # a template that raises (e.g. on roles it does not know) is the caller's input
        raise UserError(f"the model's chat template refused these messages: {' '.join(str(error).split())}") from None
