"""The terminal chat loop of `mlxspec chat`: streamed answers, the conversation kept in the prompt cache."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from mlxspec.chat_template import encode_messages, render_messages
from mlxspec.errors import UserError

HELP = "/reset starts over, /stats shows the last answer's numbers, /exit leaves; Ctrl-C stops an answer"


def stats_line(stats) -> str:
    return (
        f"alpha={stats.alpha_text} tau={stats.tau_text} "
        f"gen={stats.tokens_per_second:.1f} tok/s tokens={stats.generated_tokens} mode={stats.mode} "
        f"prompt={stats.prompt_tokens} reused={stats.reused_tokens} ({stats.prompt_cache}) "
        f"prefill={stats.prompt_seconds * 1000:.0f} ms"
    )


@contextlib.contextmanager
def ctrl_c_sets(flag: threading.Event):
    """While streaming, Ctrl-C sets `flag` (checked between steps, so the caches stay whole) instead of raising."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: flag.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class ChatSession:
    """A conversation with one Speculator (its prompt cache on): the messages so far and the last answer's stats."""

    def __init__(self, speculator: Any, system: str | None = None):
        self.spec = speculator
        self.start = [{"role": "system", "content": system}] if system else []
        self.messages = list(self.start)
        self.last_stats = None
        # The conversation's text through the last answer, and the tokens that produced it: the next turn goes on
        # from the tokens generated, which a re-encoding of the answer's text may split otherwise (and then the
        # prompt cache would reuse little of the answer).
        self.said: tuple[str, list[int]] | None = None
        if system:  # a system message that leaves no room for a turn is its own fault, said once, up front
            tokens = encode_messages(speculator.tokenizer, self.start, speculator.target.path)
            context = speculator.target.context_length
            if context and len(tokens) + self.room() >= context:
                raise UserError(
                    f"--system is {len(tokens)} tokens, which leaves no room for a message and an answer in the "
                    f"{context}-token context; shorten it"
                )

    def room(self) -> int:
        """Tokens kept free for the answer."""
        context = self.spec.target.context_length
        return min(self.spec.options.max_tokens, context // 2) if context else 0

    def reset(self) -> None:
        self.messages = list(self.start)
        self.said = None
        if self.spec.prompt_cache is not None:
            self.spec.prompt_cache.clear()

    def prompt_tokens(self, note: Callable[[str], None]) -> list[int]:
        """The conversation's tokens, dropping its oldest turns while it leaves no room for an answer."""
        context = self.spec.target.context_length
        while True:
            tokens = self.continued_tokens() or encode_messages(
                self.spec.tokenizer, self.messages, self.spec.target.path
            )
            if context is None or len(tokens) + self.room() <= context:
                return tokens
            oldest = len(self.start)
            if len(self.messages) - oldest <= 1:
                raise UserError(f"this message is {len(tokens)} tokens, too long for the {context}-token context")
            del self.messages[oldest : oldest + 2]  # the oldest question and its answer
            note(f"mlxspec: the oldest turn was dropped to leave room for an answer in the {context}-token context")

    def continued_tokens(self) -> list[int] | None:
        """The conversation's tokens as the last answer's tokens followed by the encoded rest, when the template
        renders that answer unchanged (None otherwise, or when a turn was dropped)."""
        if self.said is None:
            return None
        text = render_messages(self.spec.tokenizer, self.messages, self.spec.target.path)
        said_text, said_tokens = self.said
        if not text.startswith(said_text):
            return None
        return said_tokens + list(self.spec.tokenizer.encode(text[len(said_text) :], add_special_tokens=False))

    def answer(
        self, text: str, write: Callable[[str], None], stop: threading.Event, note: Callable[[str], None] = print
    ) -> None:
        """Stream the answer to `text`; `stop` ends it at the next step; `note` says what was dropped to fit the
        context. The answer joins the conversation."""
        self.messages.append({"role": "user", "content": text})
        try:
            tokens = self.prompt_tokens(note)
        except UserError:
            self.messages.pop()
            raise
        pieces: list[str] = []
        generated: list[int] = []
        with contextlib.closing(self.spec.stream(tokens)) as chunks:
            for chunk in chunks:
                write(chunk.text)
                pieces.append(chunk.text)
                generated.extend(chunk.tokens)
                if stop.is_set():
                    write(" [stopped]")
                    break
        write("\n")
        answer = "".join(pieces)
        asked = render_messages(self.spec.tokenizer, self.messages, self.spec.target.path)
        # A stop string cuts the text short of the tokens: then the next turn re-encodes the answer
        self.said = (asked + answer, tokens + generated) if self.spec.tokenizer.decode(generated) == answer else None
        self.messages.append({"role": "assistant", "content": answer})
        self.last_stats = self.spec.last_stats


def run_chat(
    speculator: Any, system: str | None, verbose: bool, read=input, out: TextIO = sys.stdout, err: TextIO | None = None
) -> None:
    """The terminal chat: answers on `out`, notes and errors on `err` (standard error)."""
    err = err or sys.stderr
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (line editing and history for input())

    session = ChatSession(speculator, system)

    def write(text: str) -> None:
        out.write(text)
        out.flush()

    def note(line: str) -> None:
        print(line, file=err, flush=True)

    write(f"mlxspec chat with {model_label(speculator.target.path)}; {HELP}.\n")
    while True:
        try:
            line = read(">>> ").strip()
        except EOFError:
            write("\n")
            return
        except KeyboardInterrupt:
            write("\n(/exit leaves)\n")
            continue
        if line in ("/exit", "/quit"):
            return
        if line == "/reset":
            session.reset()
            write("(a new conversation)\n")
        elif line == "/stats":
            write((stats_line(session.last_stats) if session.last_stats else "(no answer yet)") + "\n")
        elif line.startswith("/"):
            write(f"(unknown command {line.split()[0]}; {HELP})\n")
        elif line:
            stop = threading.Event()
            try:
                with ctrl_c_sets(stop):
                    session.answer(line, write, stop, note)
            except UserError as error:
                note(f"mlxspec: error: {error}")
            if verbose and session.last_stats is not None:
                write(stats_line(session.last_stats) + "\n")


def model_label(path: Path) -> str:
    """How the banner names the model: the embedded one as such (its directory is called `target`), a converted
    GGUF by its file's name, any other by its directory."""
    from mlxspec.loading import DEFAULT_TARGET

    if path.resolve() == DEFAULT_TARGET.resolve():
        return "the embedded 11M model"
    marker = path / "gguf_source.json"
    if marker.is_file():
        try:
            return Path(json.loads(marker.read_text())["gguf"]).name
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return path.name
