"""A one-line progress report with an ETA on stderr: rewritten in place on a terminal; on a pipe or a log, one plain
line when the work starts and one when it ends, so a long first measurement is never silent."""

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
        self.announced = False

    def update(self, done: int) -> None:
        if not self.live:
            if not self.announced:
                self.announced = True
                self.stream.write(f"mlxspec: {self.what} ({self.total} parts)...\n")
                self.stream.flush()
            return
        elapsed = time.perf_counter() - self.start
        eta = f", ETA {elapsed * (self.total - done) / done:.0f} s" if done else ""
        line = f"mlxspec: {self.what} {done}/{self.total}{eta}"
        self.width = max(self.width, len(line))
        self.stream.write("\r" + line.ljust(self.width))
        self.stream.flush()

    def close(self) -> None:
        if self.announced:
            self.stream.write(f"mlxspec: {self.what}: done in {time.perf_counter() - self.start:.0f} s\n")
            self.stream.flush()
        if self.live and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
