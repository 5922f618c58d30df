"""The serve worker's admission counts, checked at the moment a handler learns its request ended."""

import asyncio

import pytest

pytest.importorskip("mlx")

from mlxspec.serve.openai_request import RequestError  # noqa: E402
from mlxspec.serve.worker import Job, Worker  # noqa: E402


class AskingAgainJob(Job):
    """On "done" (emitted in the worker thread, just before the handler could answer its client), submit `n` more
    jobs at once: what a client answered at once and asking again at once, with n choices, does."""

    def __init__(self, worker: Worker, n: int, tokens, options, loop):
        super().__init__(tokens, options, loop)
        self.worker, self.n, self.refusal, self.followers = worker, n, None, []

    def emit(self, kind, payload=None):
        super().emit(kind, payload)
        if kind == "done":
            try:
                for _ in range(self.n):
                    follower = Job(self.tokens, self.options, self.loop)
                    self.worker.submit(follower)
                    self.followers.append(follower)
            except RequestError as error:
                self.refusal = error
            for follower in self.followers:
                follower.cancelled.set()  # nobody reads them; the worker skips them


def test_rows_a_finished_request_freed_are_free_when_its_handler_hears_of_it():
    import mlxspec

    worker = Worker(mlxspec.load, max_queue=1, max_batch=2)
    worker.start()
    loop = asyncio.new_event_loop()
    try:
        options = worker.speculator.options.updated(max_tokens=3, temperature=0.0)
        first = AskingAgainJob(worker, 3, [1, 2, 3, 4], options, loop)  # 3 = max_batch free rows + max_queue
        worker.submit(first)
        while not first.followers and first.refusal is None:
            loop.run_until_complete(asyncio.sleep(0.02))
        assert first.refusal is None and len(first.followers) == 3
    finally:
        worker.closing.set()
        loop.close()
