"""How much memory a device lets MLX use: presets for common Macs, or the live device."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

from mlxspec.errors import UserError
from mlxspec.platform import GiB

REPORTED = "max_recommended_working_set_size reported by MLX users on such machines; assumes nothing else runs"
ESTIMATED = (
    "an estimate, not a reported figure: 2/3 of RAM below 32 GB, 75% from 32 GB up (the published share); "
    "assumes nothing else runs"
)


@dataclass(frozen=True)
class Device:
    name: str
    ram_bytes: int
    budget_bytes: int  # what MLX may use: the GPU working-set limit on a Mac
    source: str
    backend: str = "gpu"


def _estimate(ram_gb: int) -> int:
    ratio = 2 / 3 if ram_gb < 32 else 0.75
    return int(ram_gb * GiB * ratio)


PRESETS: dict[str, Device] = {
    "m1-8gb": Device("m1-8gb", 8 * GiB, int(5.3 * GiB), REPORTED),
    "m2-8gb": Device("m2-8gb", 8 * GiB, int(5.3 * GiB), REPORTED),
    "m2-16gb": Device("m2-16gb", 16 * GiB, int(10.7 * GiB), REPORTED),
    "m3-16gb": Device("m3-16gb", 16 * GiB, int(10.7 * GiB), REPORTED),
    "m3-pro-18gb": Device("m3-pro-18gb", 18 * GiB, _estimate(18), ESTIMATED),
    "m4-24gb": Device("m4-24gb", 24 * GiB, _estimate(24), ESTIMATED),
    "m1-pro-32gb": Device("m1-pro-32gb", 32 * GiB, int(21.3 * GiB), REPORTED),
    "m3-max-64gb": Device("m3-max-64gb", 64 * GiB, _estimate(64), ESTIMATED),
    "m4-max-128gb": Device("m4-max-128gb", 128 * GiB, _estimate(128), ESTIMATED),
    "m2-ultra-192gb": Device("m2-ultra-192gb", 192 * GiB, _estimate(192), ESTIMATED),
}


MAX_MEMORY = 2**50  # 1 PiB: past it a size is a typo, and MLX's memory limit (a C int64) cannot take 10^29


def parse_size(text: str) -> int:
    """'16GB', '10.7GiB', '512MB', '8g' -> bytes. Decimal units are powers of 10, 'i' units powers of 2."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?)b?\s*", str(text).lower())
    if not match:
        raise UserError(f"memory size '{text}' is not understood; write it like 16GB, 10.7GiB or 512MB")
    value, unit, binary = match.groups()
    power = "kmgt".find(unit) + 1 if unit else 0
    scaled = float(value) * (1024 if binary else 1000) ** power  # inf for 400 digits: refused below, not int()ed
    size = int(scaled) if scaled <= MAX_MEMORY else MAX_MEMORY + 1
    if size <= 0:
        raise UserError(f"memory size '{text}' is zero; give a budget like 8GB")
    if size > MAX_MEMORY:
        raise UserError(f"memory size '{text}' is more than any machine holds (over 1 PiB); give a budget like 8GB")
    return size


def this_backend() -> str:
    """Where MLX computes on this machine, without importing it: the GPU on a Mac (Metal), on Linux the GPU where
    MLX's CUDA build is installed, else the CPU (which computes in float32)."""
    return "gpu" if sys.platform == "darwin" else _mlx_backend_without_importing_it()


def _mlx_backend_without_importing_it() -> str:
    """ "gpu" where MLX's CUDA build is installed, else "cpu": read from the installed distributions, so a plan on
    Linux never imports MLX."""
    from importlib.metadata import distributions

    names = (d.metadata.get("Name", "") or "" for d in distributions())
    return "gpu" if any(name.lower().startswith("mlx-cuda") for name in names) else "cpu"


def live_device() -> Device:
    """The machine this runs on: Apple's working-set limit where MLX reports it (macOS asks Metal, through MLX),
    else 3/4 of physical RAM (Linux: without importing MLX)."""
    if sys.platform != "darwin":
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        note = "3/4 of physical RAM (no GPU working-set limit here)"
        return Device("this machine", ram, int(ram * 0.75), note, _mlx_backend_without_importing_it())
    import mlx.core as mx

    info = mx.device_info() if hasattr(mx, "device_info") else {}
    ram = info.get("memory_size") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if info.get("max_recommended_working_set_size"):
        return Device(
            "this machine",
            ram,
            info["max_recommended_working_set_size"],
            "mx.device_info()['max_recommended_working_set_size']",
        )
    backend = "cpu" if mx.default_device().type == mx.DeviceType.cpu else "gpu"
    return Device("this machine", ram, int(ram * 0.75), "3/4 of physical RAM (no GPU working-set limit here)", backend)


def resolve_device(preset: str | None = None, memory: str | None = None) -> Device:
    if memory and preset:
        raise UserError(f"--memory {memory} and --device {preset} are two budgets; pass one of them")
    if memory:
        size = parse_size(memory)
        return Device(
            f"{memory} budget",
            size,
            size,
            f"--memory as given ({size / GiB:.2f} GiB), all of it usable; a Mac lets MLX use less than its RAM "
            "(a 16 GB Mac: --device m2-16gb, 10.7 GiB)",
            this_backend(),  # computing where this machine computes, as generate --memory-budget plans
        )
    if preset:
        if preset not in PRESETS:
            raise UserError(f"device '{preset}' is unknown; choose one of {', '.join(PRESETS)} or pass --memory 16GB")
        return PRESETS[preset]
    return live_device()
