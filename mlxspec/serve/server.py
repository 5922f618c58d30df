"""`mlxspec serve`: an OpenAI-compatible HTTP server (Starlette on uvicorn) in front of one Speculator.

One worker thread owns MLX: it loads the model, then decodes up to --max-batch requests together (continuous
batching, batching.py: one batched target forward a step, each request exact on its own; 1 runs them one at a
time in arrival order), keeping the prompt cache between them so a resent conversation prefills only its new
turn. The HTTP handlers check, tokenize, queue and relay; a full queue answers 503, and a client that goes away
stops its generation at the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import queue
import sys
import threading
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from mlxspec.chat_template import encode_messages
from mlxspec.errors import UserError
from mlxspec.options import DecodeOptions
from mlxspec.serve import openai_api as wire
from mlxspec.serve.openai_api import CompletionRequest, RequestError

POLL_SECONDS = 0.25  # how often a waiting handler checks whether its client is still there


@dataclass
class ServeConfig:
    model_id: str  # what /v1/models lists and every response names
    api_key: str | None = None
    max_queue: int = 16  # requests waiting behind the running ones; more get 503
    max_batch: int = 8  # requests decoding together (continuous batching; 1: one at a time)
    max_context: int | None = None  # longest prompt in tokens a request may send (None: the model's context)
    max_body_bytes: int = 16 * 2**20  # a longer request body gets 413 before it is parsed
    verbose: bool = False


class Job:
    """One request's generation: the worker emits (kind, payload) events onto the handler's event loop."""

    def __init__(self, tokens: list[int], options: DecodeOptions, loop: asyncio.AbstractEventLoop):
        self.tokens, self.options, self.loop = tokens, options, loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()  # set by the handler when its client is gone

    def emit(self, kind: str, payload: Any = None) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))


class Worker:
    """The thread that loads the Speculator and runs jobs FIFO. Events: chunk (a Chunk), done (Stats), error."""

    def __init__(
        self,
        load: Callable[[], Any],
        max_queue: int,
        verbose: bool = False,
        closing: threading.Event | None = None,
        max_batch: int = 1,
    ):
        self._load, self.verbose, self.max_batch = load, verbose, max_batch
        self.closing = closing or threading.Event()  # set on shutdown: open and waiting jobs end with an error
        self.max_queue = max_queue
        self.jobs: queue.Queue = queue.Queue()  # bounded by submit: max_queue beyond the batch's free rows
        self.decoding = 0  # rows decoding now (batched)
        self._submit_lock = threading.Lock()
        self.speculator: Any = None
        self.busy = False
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="mlxspec-worker", daemon=True)

    def start(self) -> None:
        """Load in the worker thread (MLX state stays on one thread); a load error is raised here."""
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def submit(self, job: Job) -> None:
        with self._submit_lock:  # (handlers run on several threads)
            free_rows = max(0, self.max_batch - self.decoding) if self.max_batch > 1 else 0
            if self.jobs.qsize() >= self.max_queue + free_rows:
                raise RequestError(
                    f"the server is busy: {self.max_queue} requests are already waiting; retry later", status=503
                )
            self.jobs.put_nowait(job)

    def _main(self) -> None:
        try:
            self.speculator = self._load()
        except BaseException as error:  # reported by start(), in the main thread
            self._error = error
        self._ready.set()
        if self._error is None and self.max_batch > 1:
            self._batched()
        while self._error is None:
            job = self.jobs.get()
            self.busy = True
            try:
                self.run(job)
            finally:
                self.busy = False

    def run(self, job: Job) -> None:
        if job.cancelled.is_set():  # its client left while it waited
            return
        if self.closing.is_set():
            job.emit("error", shutting_down())
            return
        spec = self.speculator
        try:
            # closing(): stopping early ends the stream now, so its caches are kept for a next request.
            with contextlib.closing(spec.stream(job.tokens, job.options)) as chunks:
                for chunk in chunks:
                    job.emit("chunk", chunk)
                    if job.cancelled.is_set() or self.closing.is_set():
                        break
            if self.closing.is_set() and not job.cancelled.is_set():
                job.emit("error", shutting_down())
                return
            gone = job.cancelled.is_set()  # read before "done": a stream read to its end marks its job cancelled
            job.emit("done", spec.last_stats)
            self.log(spec.last_stats, gone)
        except Exception as error:
            self._fail(job, error)

    def _batched(self) -> None:
        """Continuous batching (batching.py): up to max_batch jobs decode together, admitted between steps."""
        from mlxspec.batching import BatchRows
        from mlxspec.results import Stats

        rows, jobs = BatchRows(), {}
        while True:
            while len(rows.rows) < self.max_batch:
                try:
                    job = self.jobs.get(block=not rows.rows)
                except queue.Empty:
                    break
                if job.cancelled.is_set():
                    continue  # its client left while it waited
                if self.closing.is_set():
                    job.emit("error", shutting_down())
                    continue
                stats = Stats()
                events = self.speculator.events(job.tokens, job.options, stats, rows.count, rows.may_draft)
                jobs[id(rows.add(events, stats, lambda chunk, job=job: job.emit("chunk", chunk)))] = job
            for row in list(rows.rows):  # a client gone, or the server stopping: its row leaves now
                job = jobs[id(row)]
                if job.cancelled.is_set() or self.closing.is_set():
                    rows.drop(row)
                    self._end(jobs.pop(id(row)), row)
            self.busy, self.decoding = bool(rows.rows), len(rows.rows)
            for row in rows.round():
                self._end(jobs.pop(id(row)), row)
            self.busy, self.decoding = bool(rows.rows), len(rows.rows)

    def _end(self, job: Job, row) -> None:
        """Tell a batched job's handler how its row ended: done, an error of its own, or the server stopping."""
        gone = job.cancelled.is_set()  # read before "done": a stream read to its end marks its job cancelled
        if self.closing.is_set() and not gone:
            job.emit("error", shutting_down())
        elif row.error is not None:
            self._fail(job, row.error)
        else:
            job.emit("done", row.stats)
            self.log(row.stats, gone)

    def _fail(self, job: Job, error: Exception) -> None:
        """A failed generation: the request's own mistake is a 400; anything else is a 500 with its traceback on
        stderr, and the prompt cache is dropped (a failure may have left a kept cache half-fed)."""
        if isinstance(error, UserError):
            job.emit("error", RequestError(str(error)))
            return
        traceback.print_exception(error, file=sys.stderr)
        if self.speculator.prompt_cache is not None:
            self.speculator.prompt_cache.clear()
        job.emit("error", RequestError(f"generation failed: {type(error).__name__}: {error}", status=500))

    def log(self, stats, cancelled: bool) -> None:
        if self.verbose:
            end = "client gone, stopped" if cancelled else "done"
            reuse = f"reused={stats.reused_tokens} ({stats.prompt_cache})"
            print(f"mlxspec: {end} {reuse} {stats.line()}", file=sys.stderr, flush=True)


def shutting_down() -> RequestError:
    """What a request gets once the server is stopping (a new error each time: they are raised and relayed)."""
    return RequestError("the server is shutting down; retry against a running one", status=503, code="shutting_down")


def sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


class OpenAIServer:
    """The HTTP endpoints; each method is one route."""

    def __init__(self, worker: Worker, config: ServeConfig, closing: threading.Event | None = None):
        self.worker, self.config = worker, config
        self.closing = closing or threading.Event()  # set on shutdown: no new request is admitted
        self.created = int(time.time())

    def app(self) -> Starlette:
        routes = [
            Route("/health", self.health),
            Route("/v1/models", self.models),
            Route("/v1/models/{model_id:path}", self.model),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
        ]
        handlers = {RequestError: self.refuse, HTTPException: self.http_error}
        return Starlette(routes=routes, exception_handlers=handlers)

    async def refuse(self, request: Request, error: RequestError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    async def http_error(self, request: Request, error: HTTPException) -> JSONResponse:
        return await self.refuse(
            request,
            RequestError(
                f"{request.method} {request.url.path}: {error.detail}", None, error.status_code, "invalid_request_error"
            ),
        )

    def authorize(self, request: Request) -> None:
        if self.config.api_key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer":  # the scheme is case-insensitive (RFC 7235)
            given = ""
        # Header values arrive decoded as latin-1: their bytes are what the client sent, as the key's UTF-8 is.
        given_bytes = given.strip().encode("latin-1", "replace")
        if not hmac.compare_digest(given_bytes, self.config.api_key.encode()):
            raise RequestError("a missing or wrong API key; send Authorization: Bearer <key>", status=401)

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "status": "ok",
                "model": self.config.model_id,
                "busy": self.worker.busy,
                "waiting": self.worker.jobs.qsize(),
            }
        )

    def model_card(self) -> dict:
        return {"id": self.config.model_id, "object": "model", "created": self.created, "owned_by": "mlxspec"}

    async def models(self, request: Request) -> JSONResponse:
        self.authorize(request)
        return JSONResponse({"object": "list", "data": [self.model_card()]})

    async def model(self, request: Request) -> JSONResponse:
        self.authorize(request)
        model_id = request.path_params["model_id"]
        if model_id != self.config.model_id:
            raise RequestError(
                f"model {model_id!r} is not served here; this server serves {self.config.model_id!r}",
                "model",
                status=404,
                kind="invalid_request_error",
            )
        return JSONResponse(self.model_card())

    async def chat_completions(self, request: Request):
        return await self.complete(request, "chat")

    async def completions(self, request: Request):
        return await self.complete(request, "text")

    async def complete(self, request: Request, kind: str):
        self.authorize(request)
        if self.closing.is_set():
            raise shutting_down()
        raw = await self.read_body(request)
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise RequestError(f"the request body is not valid JSON ({error})") from None
        except RecursionError:
            raise RequestError("the request body nests too deeply to parse; send a flat JSON object") from None
        parsed = wire.parse_request(body, kind)
        created = int(time.time())  # this completion's own time, as OpenAI's responses carry
        tokens, options = await run_in_threadpool(self.prepare, parsed)
        job = Job(tokens, options, asyncio.get_running_loop())
        self.worker.submit(job)
        first = await self.next_event(job, request)  # waits out the queue
        if first is None:
            return JSONResponse({}, status_code=499)  # the client is gone; nobody reads this
        if first[0] == "error":
            raise first[1]
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        reply = wire.Reply(kind, rid, created, self.config.model_id, parsed.stream and parsed.include_usage)
        if parsed.stream:
            return StreamingResponse(self.stream(job, reply, first), media_type="text/event-stream")
        return JSONResponse(await self.collect(job, reply, first, request))

    async def read_body(self, request: Request) -> bytes:
        """The body, refused with 413 past max_body_bytes (by its declared length, or while it streams in)."""
        limit = self.config.max_body_bytes
        too_big = RequestError(
            f"the request body is over this server's limit of {limit} bytes (serve --max-body-bytes)", status=413
        )
        declared = request.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > limit:
            raise too_big
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_big
            chunks.append(chunk)
        return b"".join(chunks)

    def prepare(self, parsed: CompletionRequest) -> tuple[list[int], DecodeOptions]:
        """Tokens and options of a request, or a 400 naming what is wrong (runs in a thread: tokenizing takes time)."""
        spec = self.worker.speculator
        where = "messages" if parsed.kind == "chat" else "prompt"
        try:
            options = spec.options.updated(chat=False, **parsed.changes).validate(spec.vocab_size)
            if parsed.kind == "chat":
                tokens = encode_messages(spec.tokenizer, parsed.messages, self.config.model_id)
            else:
                tokens = spec.encode(parsed.prompt)
        except UserError as error:
            raise RequestError(str(error), param=wire.param_named(str(error), where)) from None
        context = min(c for c in (spec.target.context_length, self.config.max_context, 2**62) if c)
        if len(tokens) >= context:
            raise RequestError(
                f"the prompt has {len(tokens)} tokens but this server's context is {context}; shorten it", where
            )
        return tokens, options

    async def next_event(self, job: Job, request: Request) -> tuple[str, Any] | None:
        """The worker's next event, or None (and the job cancelled) once the client has disconnected."""
        while True:
            try:
                return await asyncio.wait_for(job.events.get(), POLL_SECONDS)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    job.cancelled.set()
                    return None

    async def collect(self, job: Job, reply: wire.Reply, event, request: Request) -> dict:
        pieces, finish = [], None
        while event is not None:
            kind, payload = event
            if kind == "error":
                raise payload
            if kind == "done":
                return wire.completion(reply, "".join(pieces), finish, payload)
            pieces.append(payload.text)
            finish = payload.finish_reason or finish
            event = await self.next_event(job, request)
        return {}  # disconnected: the worker stops at its next step

    async def stream(self, job: Job, reply: wire.Reply, event) -> AsyncIterator[str]:
        """Server-sent events; a client that disconnects cancels this generator, which cancels the job."""
        first = True
        try:
            while True:
                kind, payload = event
                if kind == "error":
                    yield sse(payload.body())
                    return
                if kind == "done":
                    if reply.include_usage:
                        yield sse(wire.usage_chunk(reply, payload))
                    yield sse("[DONE]")
                    return
                if first and reply.kind == "chat":
                    yield sse(wire.role_chunk(reply))
                if payload.text or (first and reply.kind == "text"):
                    yield sse(wire.chunk(reply, payload.text, None))
                first = False
                if payload.finish_reason:
                    yield sse(wire.chunk(reply, None, payload.finish_reason))
                event = await job.events.get()
        finally:
            job.cancelled.set()  # a no-op once the job is done
