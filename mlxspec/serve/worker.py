"""The worker thread of `mlxspec serve`: it loads the Speculator and runs requests, alone or batched."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from mlxspec.errors import UserError
from mlxspec.options import DecodeOptions
from mlxspec.serve.openai_request import RequestError


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
        self.warming = True  # until the first runs' measurements are made (Speculator.warm_up): /health says so
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
        if self._error is None:
            self._warm_up()
        if self._error is None and self.max_batch > 1:
            self._batched()
        while self._error is None:
            job = self.jobs.get()
            self.busy = True
            try:
                self.run(job)
            finally:
                self.busy = False

    def _warm_up(self) -> None:
        """Measure now what the first request would wait on (a cost curve took 83 s there); requests queue
        meanwhile. A failure here is reported and left to the first request to meet again."""
        try:
            self.speculator.warm_up()
        except Exception as error:  # noqa: BLE001 (the server still serves; a request meets the error in its answer)
            print(f"mlxspec: warming up failed ({' '.join(str(error).split())})", file=sys.stderr, flush=True)
        finally:
            self.warming = False
            print("mlxspec: warmed up; requests are served now", file=sys.stderr, flush=True)

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
            left = [row for row in rows.rows if jobs[id(row)].cancelled.is_set() or self.closing.is_set()]
            for row in left:  # a client gone, or the server stopping: its row leaves now
                rows.drop(row)
            self._end_all(rows, jobs, left)
            self._end_all(rows, jobs, rows.round())

    def _end_all(self, rows, jobs: dict, ended: list) -> None:
        """Count the rows still decoding first, then tell the ended rows' handlers: a client answered at once may
        ask again at once, and submit() must see the rows its last request freed (n choices need them all)."""
        self.busy, self.decoding = bool(rows.rows), len(rows.rows)
        for row in ended:
            self._end(jobs.pop(id(row)), row)

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
