"""What this machine gives mlxspec: the shipped models, the cache directory, byte units, and which BLAS MLX uses.

Imports no MLX at module level, so `mlxspec plan` and `--help` stay instant.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from pathlib import Path

GiB = 2**30
GB = 10**9

# OpenBLAS workers otherwise spin for about 2^28 cycles after each call, competing on a small CPU with the thread
# that dispatches MLX's ops; waiting 2^4 cycles made every mode 10-30% faster here (docs/benchmarks.md).
OPENBLAS_THREAD_TIMEOUT = "4"
REEXEC_COMMANDS = ("generate", "bench", "train-medusa", "train-heads", "serve", "chat", "tune")


def models_dir() -> Path:
    """The embedded models: inside the installed package (a wheel maps the top-level models/ there), or the
    source checkout's models/ (an editable install or a plain checkout)."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "models", package.parent / "models"):
        if (candidate / "target" / "config.json").exists():
            return candidate
    return package.parent / "models"


def cache_dir() -> Path:
    """Where measured cost curves and corpus tables are kept: $MLXSPEC_CACHE, else ~/.cache/mlxspec."""
    return Path(os.environ.get("MLXSPEC_CACHE") or Path.home() / ".cache" / "mlxspec").expanduser()


def openblas_path() -> Path:
    """Debian's pthread OpenBLAS for this machine's multiarch triplet (x86_64, aarch64, ...)."""
    arch = sysconfig.get_config_var("MULTIARCH") or f"{os.uname().machine}-linux-gnu"
    return Path(f"/usr/lib/{arch}/openblas-pthread/libblas.so.3")


def _is_blas_library(path: str) -> bool:
    """A shared library whose file name is a BLAS (libblas, libopenblas, libmkl_*, libblis), judged by its name
    alone: MLX's JIT kernel libraries have random names that may contain 'mkl' or 'blas' by chance."""
    name = os.path.basename(path).lower()
    if not name.startswith("lib") or ".so" not in name:
        return False
    stem = name[3:].split(".so")[0]
    return stem.startswith(("blas", "openblas", "mkl_", "mkl", "blis", "cblas", "flexiblas"))


def classify_blas(mapped_paths: list[str]) -> str:
    """'openblas', 'other' (MKL, BLIS, a system libblas) or 'reference' (the mlx-cpu wheel's bundled BLAS).

    numpy's own OpenBLAS (libscipy_openblas64_, 64-bit symbols) does not count: MLX never calls it.
    """
    fast = [
        p
        for p in set(mapped_paths)
        if _is_blas_library(p) and "mlx_cpu.libs" not in p and "scipy_openblas" not in os.path.basename(p)
    ]
    if any("openblas" in p.lower() for p in fast):
        return "openblas"
    return "other" if fast else "reference"


@functools.lru_cache(maxsize=1)
def blas_in_use() -> str:
    """Which BLAS MLX's CPU matmuls resolve to, read once per process (it cannot change after MLX loads)."""
    if sys.platform != "linux":
        return "platform"  # macOS: Accelerate, always fast
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "platform"
    return classify_blas([line.split()[-1] for line in maps.splitlines() if "/" in line])


def fast_blas_hint() -> str | None:
    """One line telling a Linux CPU user how to get a fast BLAS, or None where nothing is to be done."""
    import mlx.core as mx

    if mx.default_device().type != mx.DeviceType.cpu or blas_in_use() != "reference":
        return None
    library = openblas_path()
    if library.exists():
        return (
            f"mlxspec: MLX is using reference BLAS; run with LD_PRELOAD={library} "
            f"OPENBLAS_THREAD_TIMEOUT={OPENBLAS_THREAD_TIMEOUT} for ~10x faster verification"
        )
    return (
        "mlxspec: MLX is using reference BLAS; `apt-get install libopenblas0-pthread`, then "
        f"LD_PRELOAD={library} OPENBLAS_THREAD_TIMEOUT={OPENBLAS_THREAD_TIMEOUT}, makes verification ~10x faster"
    )


def reexec_with_openblas(argv: list[str]) -> None:
    """On Linux, rerun compute commands with Debian's OpenBLAS preloaded when it is installed: the mlx-cpu wheel's
    bundled reference BLAS makes verifying k tokens cost k times one. Results are identical (tested); opt out with
    MLXSPEC_NO_OPENBLAS=1. OpenBLAS reads OPENBLAS_THREAD_TIMEOUT only at start, so it is set here too."""
    if sys.platform != "linux" or os.environ.get("MLXSPEC_NO_OPENBLAS") or os.environ.get("_MLXSPEC_REEXEC"):
        return
    if len(argv) < 2 or argv[1] not in REEXEC_COMMANDS:
        return
    library = openblas_path()
    preloaded = "blas" in os.environ.get("LD_PRELOAD", "")
    if preloaded and "OPENBLAS_THREAD_TIMEOUT" in os.environ:
        return
    env = dict(os.environ, _MLXSPEC_REEXEC="1")
    env.setdefault("OPENBLAS_THREAD_TIMEOUT", OPENBLAS_THREAD_TIMEOUT)
    if not preloaded:
        if not os.path.exists(str(library)):
            return
        try:
            import ctypes

            ctypes.CDLL(str(library))  # it must load before we bet the process on it
        except OSError:
            return
        env["LD_PRELOAD"] = f"{library} {os.environ.get('LD_PRELOAD', '')}".strip()
    os.execve(sys.executable, [sys.executable, "-m", "mlxspec", *argv[1:]], env)


def available_memory() -> int | None:
    """Bytes of memory free for a new allocation: Linux's MemAvailable, else the physical total; None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
