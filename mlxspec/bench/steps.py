"""Progress of a benchmark's runs with the time left, one line per finished run on stderr (pipes and logs too)."""

from __future__ import annotations

import sys
import time


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


class Steps:
    """`Steps(total, "bench serve")`, then `.done("what just ran")` after each run: prints [i/total], the time spent
    and an estimate of the time left (the mean run so far times the runs left)."""

    def __init__(self, total: int, what: str, stream=None):
        self.total, self.what, self.count = max(1, total), what, 0
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        print(f"# {what}: {self.total} runs", file=self.stream, flush=True)

    def done(self, label: str) -> None:
        self.count += 1
        spent = time.perf_counter() - self.start
        left = spent / self.count * (self.total - self.count)
        tail = f", about {_duration(left)} left" if self.count < self.total else ""
        print(f"  [{self.count}/{self.total}] {label} ({_duration(spent)} so far{tail})", file=self.stream, flush=True)


def machine() -> str:
    """The machine a result was measured on, for its report."""
    import os
    import platform

    from mlxspec.platform import blas_in_use

    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, {blas_in_use()} BLAS"


def heldout_files():
    """The lines of each held-out stdlib file this Python has (models/heldout_files.txt), one list at a time: the
    workloads of `bench serve` and `bench agent-loop`."""
    import sysconfig
    from pathlib import Path

    from mlxspec.loading import MODELS_DIR

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in (MODELS_DIR / "heldout_files.txt").read_text().split():
        path = stdlib / name
        if path.exists():
            yield path.read_text(errors="replace").splitlines(keepends=True)
