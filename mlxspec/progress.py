"""A one-line progress report with an ETA, on stderr and only on a terminal: pipes and logs stay clean."""

from __future__ import annotations

import sys
import time


class Progress:
    """`Progress("measuring verification cost", total)`, then `.update(done)` and `.close()`."""

    def __init__(self, what: str, total: int, stream=None):
        self.what, self.total = what, max(1, total)
        self.stream = stream or sys.stderr
        self.live = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = time.perf_counter()
        self.width = 0

    def update(self, done: int) -> None:
        if not self.live:
            return
        elapsed = time.perf_counter() - self.start
        eta = f", ETA {elapsed * (self.total - done) / done:.0f} s" if done else ""
        line = f"mlxspec: {self.what} {done}/{self.total}{eta}"
        self.width = max(self.width, len(line))
        self.stream.write("\r" + line.ljust(self.width))
        self.stream.flush()

    def close(self) -> None:
        if self.live and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
