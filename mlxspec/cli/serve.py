"""`mlxspec serve` and `mlxspec chat` behind their click options."""

from __future__ import annotations

import os
from pathlib import Path

import click

from mlxspec.cli.generate import check_contradictions, load_speculator, options_from
from mlxspec.cli.options import MODEL_OPTIONS, SAMPLING_OPTIONS, with_options
from mlxspec.errors import UserError

PLANNED_CHARS = 1 << 40  # --memory-budget plans for the whole context (capped at the model's)


def served_model_id(model: str | None) -> str:
    """The id clients see: a Hub repo id as given, a local directory by its name, the embedded target by name."""
    if model is None:
        return "mlxspec-embedded"
    return Path(model).name if Path(model).exists() else model


@click.command()
@with_options(MODEL_OPTIONS, SAMPLING_OPTIONS)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every one).")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True)
@click.option(
    "--api-key",
    default=lambda: os.environ.get("MLXSPEC_API_KEY"),
    help="Require 'Authorization: Bearer KEY' on /v1 [default: $MLXSPEC_API_KEY, else none].",
)
@click.option(
    "--max-queue",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Requests that may wait behind the running one; more get 503.",
)
@click.option(
    "--max-context",
    type=click.IntRange(min=2),
    default=None,
    help="Longest prompt in tokens a request may send [default: the model's context].",
)
@click.option(
    "--prompt-cache-size",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Conversations whose caches are kept (each holds its KV cache); a request continues the one it shares "
    "the longest prefix with.",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1024),
    default=16 * 2**20,
    show_default=True,
    help="A longer request body gets 413 before it is read further.",
)
@click.option("--model-id", default=None, help="The model id clients see [default: the --model name].")
@click.option(
    "--max-batch",
    type=click.IntRange(1, 64),
    default=8,
    show_default=True,
    help="Requests decoding together (continuous batching, exact per request); 1 runs them one at a time.",
)
@click.option("-v", "--verbose", is_flag=True, help="Print a stats line per request to stderr.")
def serve(**p) -> None:
    """Serve the model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions), speculatively
    and exactly, reusing the prompt cache across requests. Needs Starlette and uvicorn (pip install -e ".[serve]")."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise UserError(
            "mlxspec serve needs Starlette and uvicorn; from a checkout: pip install -e '.[serve]'; "
            "installed with pipx: pipx inject mlxspec starlette uvicorn"
        ) from None
    from mlxspec.serve.launch import serve
    from mlxspec.serve.server import ServeConfig

    check_contradictions(p)
    options = options_from(p).validate()
    api_key = p["api_key"]
    if api_key is not None and not api_key.strip():
        raise UserError(
            "--api-key (or $MLXSPEC_API_KEY) is empty, which would serve without a key; pass a key, or unset it"
        )
    config = ServeConfig(
        model_id=p["model_id"] or served_model_id(p["model"]),
        api_key=api_key.strip() if api_key else None,  # a key with spaces around it could never be sent back
        max_body_bytes=p["max_body_bytes"],
        max_queue=p["max_queue"],
        max_batch=p["max_batch"],
        max_context=p["max_context"],
        verbose=p["verbose"],
    )
    planned = p["max_context"] or PLANNED_CHARS
    echo = click.echo
    cache_size = p["prompt_cache_size"]
    serve(lambda: load_speculator(p, options, planned, echo, prompt_cache=cache_size), config, p["host"], p["port"])


@click.command()
@with_options(MODEL_OPTIONS, SAMPLING_OPTIONS)
@click.option("--system", default=None, help="A system message to start every conversation with.")
@click.option("-v", "--verbose", is_flag=True, help="Print the stats line after every answer.")
def chat(**p) -> None:
    """Chat in the terminal: streamed answers, the model's chat template, and the conversation's prompt cache reused
    turn after turn. /reset starts over, /stats shows the last answer's alpha, tau and tok/s, /exit leaves; Ctrl-C
    stops the answer being written."""
    from mlxspec.serve.chat import run_chat

    check_contradictions(p)
    options = options_from(p).validate()
    speculator = load_speculator(p, options, PLANNED_CHARS, click.echo, prompt_cache=1)
    if not getattr(speculator.tokenizer, "chat_template", None):
        raise UserError(
            f"'{speculator.target.path}' has no chat template, so it cannot chat; continue text with "
            "`mlxspec generate` instead"
        )
    run_chat(speculator, p["system"], p["verbose"])
