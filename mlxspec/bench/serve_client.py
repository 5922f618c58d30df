"""Servers under test for `mlxspec bench serve`: `mlxspec serve` or `mlx_lm.server` as a child process on a free
localhost port, and one streamed OpenAI-style request timed from the client's side (plain HTTP, no SDK)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from mlxspec.errors import UserError
from mlxspec.platform import OPENBLAS_THREAD_TIMEOUT, openblas_path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(kind: str, port: int, model: str | None, draft: str | None, k: int | None, extra: list[str]):
    """The command line that starts a server of `kind` ("mlxspec" or "mlx_lm")."""
    if kind == "mlxspec":
        command = [sys.executable, "-m", "mlxspec", "serve", "--port", str(port), "-v"]
        command += (["--model", model] if model else []) + (["--draft", draft] if draft else [])
        return command + (["-k", str(k)] if k else []) + extra
    from mlxspec.loading import DEFAULT_TARGET

    command = [sys.executable, "-m", "mlx_lm.server", "--port", str(port), "--model", model or str(DEFAULT_TARGET)]
    return command + (["--draft-model", draft, "--num-draft-tokens", str(k or 3)] if draft else []) + extra


class Server:
    """A server process with its log; both kinds get Debian's OpenBLAS preloaded where it is installed."""

    def __init__(self, kind: str, model: str | None, draft: str | None, k: int | None, extra: list[str], log: Path):
        self.port = free_port()
        self.command = server_command(kind, self.port, model, draft, k, extra)
        env = dict(os.environ)
        if openblas_path().exists() and sys.platform == "linux":
            env.update(LD_PRELOAD=str(openblas_path()), OPENBLAS_THREAD_TIMEOUT=OPENBLAS_THREAD_TIMEOUT)
        self.log_path = log
        self.log = open(log, "w")
        self.process = subprocess.Popen(self.command, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.model_name = "default_model" if kind == "mlx_lm" else "default"  # mlx_lm.server loads any other name
        self.wait_until_up()

    @property
    def command_line(self) -> str:
        return " ".join(self.command)

    def wait_until_up(self, seconds: float = 300) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise UserError(f"the server '{self.command_line}' exited at start; its log is {self.log_path}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models", timeout=2).read()
                return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise UserError(f"the server '{self.command_line}' did not come up in {seconds:.0f} s; see {self.log_path}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()


def events(response: http.client.HTTPResponse):
    """The JSON objects of a server-sent event stream, until [DONE]."""
    for raw in response:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def timed_stream(server: Server, kind: str, payload, max_tokens: int, **fields) -> dict:
    """One streamed request ("text": a completion of `payload`; "chat": `payload` is the messages): its text, TTFT
    (the first non-empty text), total latency, and the usage the server sends."""
    body = {"model": server.model_name, "max_tokens": max_tokens, "stream": True}
    body["stream_options"] = {"include_usage": True}
    body.update({"messages": payload} if kind == "chat" else {"prompt": payload}, **fields)
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
    start = time.perf_counter()
    first, pieces, usage = None, [], None
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {response.read()[:200]!r}")
        for event in events(response):
            for choice in event.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") if kind == "chat" else choice.get("text")
                if text:
                    first = first or time.perf_counter()
                    pieces.append(text)
            usage = event.get("usage") or usage
    finally:
        connection.close()
    end = time.perf_counter()
    out = {"text": "".join(pieces), "ttft": (first or end) - start, "latency": end - start}
    if usage:
        out["completion_tokens"] = usage.get("completion_tokens")
        out["prompt_tokens"] = usage.get("prompt_tokens")
        out["cached_tokens"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return out
