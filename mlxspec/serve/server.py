"""`mlxspec serve`: an OpenAI-compatible HTTP server (Starlette on uvicorn) in front of one Speculator.

One worker thread owns MLX: it loads the model, then decodes up to --max-batch requests together (continuous
batching, batching.py: one batched target forward a step, each request exact on its own; 1 runs them one at a
time in arrival order), keeping the prompt cache between them so a resent conversation prefills only its new
turn. The HTTP handlers check, tokenize, queue and relay; a full queue answers 503, and a client that goes away
stops its generation at the next step.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
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
from mlxspec.options import MAX_SEED, DecodeOptions
from mlxspec.serve import openai_api as wire
from mlxspec.serve.logprobs import render
from mlxspec.serve.openai_request import CompletionRequest, RequestError, param_named, parse_request
from mlxspec.serve.worker import Job, Worker, shutting_down

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
                "status": "warming up" if self.worker.warming else "ok",
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
        parsed = parse_request(body, kind)
        created = int(time.time())  # this completion's own time, as OpenAI's responses carry
        tokens, options = await run_in_threadpool(self.prepare, parsed)
        if parsed.n > 1 and parsed.stream:
            reply = wire.Reply(
                parsed.kind, self.new_id(parsed.kind), created, self.config.model_id, parsed.include_usage
            )
            jobs = self.submit_choices(parsed.n, tokens, options)
            return StreamingResponse(self.stream_choices(jobs, reply), media_type="text/event-stream")
        if parsed.n > 1:
            return JSONResponse(await self.several(parsed, tokens, options, created, request))
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
        got = await self.collect(job, first, request, parsed.kind)
        return JSONResponse(wire.completion(reply, *got) if got else {})

    def new_id(self, kind: str) -> str:
        return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"

    def submit_choices(self, n: int, tokens: list[int], options) -> list[Job]:
        """n jobs, rows decoded together: choice i with seed + i (each a random seed when none is given), so a
        seeded request repeats all its choices. A refusal (a full queue) cancels the ones already queued."""
        loop = asyncio.get_running_loop()
        seeds = [None if options.seed is None else (options.seed + i) % (MAX_SEED + 1) for i in range(n)]
        jobs = [Job(tokens, options.updated(seed=seed), loop) for seed in seeds]
        try:
            for job in jobs:
                self.worker.submit(job)
        except RequestError:
            for job in jobs:
                job.cancelled.set()
            raise
        return jobs

    async def stream_choices(self, jobs: list[Job], reply: wire.Reply) -> AsyncIterator[str]:
        """n choices streamed as their rows produce them, each chunk naming its choice's index."""
        waiting = {asyncio.ensure_future(job.events.get()): i for i, job in enumerate(jobs)}
        started, stats, offsets = set(), {}, [0] * len(jobs)
        try:
            while waiting:
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for future in done:
                    i = waiting.pop(future)
                    kind, payload = future.result()
                    if kind == "error":
                        yield sse(payload.body())
                        return
                    if kind == "done":
                        stats[i] = payload
                        continue
                    if i not in started and reply.kind == "chat":
                        yield sse(wire.role_chunk(reply, i))
                    started.add(i)
                    logprobs = None
                    if payload.logprobs is not None:
                        tokenizer = self.worker.speculator.tokenizer
                        logprobs = render(reply.kind, payload.tokens, payload.logprobs, tokenizer, offsets[i])
                    offsets[i] += len(payload.text)
                    if payload.text or logprobs:
                        yield sse(wire.chunk(reply, payload.text, None, logprobs, index=i))
                    if payload.finish_reason:
                        yield sse(wire.chunk(reply, None, payload.finish_reason, index=i))
                    waiting[asyncio.ensure_future(jobs[i].events.get())] = i
            if reply.include_usage:
                yield sse(wire.usage_chunk(reply, stats[0], [stats[i] for i in range(1, len(jobs))]))
            yield sse("[DONE]")
        finally:
            for future in waiting:
                future.cancel()
            for job in jobs:
                job.cancelled.set()

    async def several(self, parsed: CompletionRequest, tokens: list[int], options, created: int, request) -> dict:
        """n choices (submit_choices), each collected whole."""
        jobs = self.submit_choices(parsed.n, tokens, options)
        try:
            choices = [
                await self.collect(job, await self.next_event(job, request), request, parsed.kind) for job in jobs
            ]
        finally:
            for job in jobs:  # a no-op for finished rows; the others (a refusal or an error above) stop
                job.cancelled.set()
        if None in choices:
            return {}  # disconnected
        return wire.completions(
            wire.Reply(parsed.kind, self.new_id(parsed.kind), created, self.config.model_id), choices
        )

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
            raise RequestError(str(error), param=param_named(str(error), where)) from None
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

    async def collect(self, job: Job, event, request: Request, kind: str) -> tuple[str, str | None, Any, Any] | None:
        """(text, finish reason, stats, logprobs or None) of a job from its first event on; None once the client is
        gone (the worker stops at its next step)."""
        pieces, finish, tokens, entries = [], None, [], []
        while event is not None:
            what, payload = event
            if what == "error":
                raise payload
            if what == "done":
                wanted = job.options.logprobs is not None
                logprobs = render(kind, tokens, entries, self.worker.speculator.tokenizer) if wanted else None
                return "".join(pieces), finish, payload, logprobs
            pieces.append(payload.text)
            tokens, entries = tokens + payload.tokens, entries + (payload.logprobs or [])
            finish = payload.finish_reason or finish
            event = await self.next_event(job, request)
        return None

    async def stream(self, job: Job, reply: wire.Reply, event) -> AsyncIterator[str]:
        """Server-sent events; a client that disconnects cancels this generator, which cancels the job."""
        first, offset = True, 0
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
                logprobs = None
                if payload.logprobs is not None:
                    tokenizer = self.worker.speculator.tokenizer
                    logprobs = render(reply.kind, payload.tokens, payload.logprobs, tokenizer, offset)
                    offset += len(payload.text)
                if payload.text or logprobs or (first and reply.kind == "text"):
                    yield sse(wire.chunk(reply, payload.text, None, logprobs))
                first = False
                if payload.finish_reason:
                    yield sse(wire.chunk(reply, None, payload.finish_reason))
                event = await job.events.get()
        finally:
            job.cancelled.set()  # a no-op once the job is done
