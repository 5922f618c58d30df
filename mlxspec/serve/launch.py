"""Starting and stopping the server: the port checked first, the worker loaded, uvicorn run until SIGINT or SIGTERM,
which end open streams with an error event before the process exits with status 0."""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

import uvicorn

from mlxspec.errors import UserError
from mlxspec.serve.server import OpenAIServer, ServeConfig
from mlxspec.serve.worker import Worker


class GracefulServer(uvicorn.Server):
    """uvicorn's server, ending on SIGINT or SIGTERM the way a client can read: `closing` is set, so no request is
    admitted and open streams end with an error event; then it returns (exit status 0) instead of re-raising the
    signal as uvicorn does."""

    def __init__(self, config: uvicorn.Config, closing: threading.Event):
        super().__init__(config)
        self.closing = closing

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.closing.set()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def check_port(host: str, port: int) -> None:
    """Refuse, in one line, an address this machine cannot listen on or a port something else holds."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as error:
        raise UserError(f"--host {host!r} is not an address to listen on ({error.strerror}); try 127.0.0.1") from None
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a listener still refuses
        try:
            probe.bind(address)
        except OSError as error:
            raise UserError(
                f"--port {port} on {host} cannot be used ({error.strerror}); pass another --port or stop what holds it"
            ) from None


def serve(load: Callable[[], Any], config: ServeConfig, host: str, port: int) -> None:
    """Load (in the worker thread), then serve until SIGINT or SIGTERM."""
    check_port(host, port)  # before loading anything, and before saying where it serves
    closing = threading.Event()
    worker = Worker(load, config.max_queue, config.verbose, closing, config.max_batch)
    worker.start()
    app = OpenAIServer(worker, config, closing).app()
    print(f"mlxspec: serving {config.model_id} at http://{host}:{port}/v1 (OpenAI API)", file=sys.stderr, flush=True)
    settings = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)
    GracefulServer(settings, closing).run()
    print("mlxspec: stopped serving", file=sys.stderr, flush=True)
