"""`mlxspec bench verify-cost --formats`: each weight format the target holds, read by the kernel, against this
machine's memory. Per format, the target's largest layer of that format is timed alone at M = 1..n rows: GiB/s of
its weight bytes (codes, scales and biases) and v(n), its time at n rows over one. Beside them a STREAM-like read
that the command times itself: numpy summing a 1 GiB array, one thread and as many threads as the kernel runs.

Every format and row count is timed once per round, rounds interleaved, medians reported, so a busy spell on a
shared machine falls on all alike.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

READ_BYTES = 1 << 30
WEIGHT_PARTS = ("weight", "scales", "biases", "sub_scales", "sub_mins", "super_scales", "super_mins")


@dataclass(frozen=True)
class FormatLayer:
    format: str  # "float32", "4-bit affine g32 (float16 scales)", "4-bit K-quant"
    name: str  # its module path
    rows: int  # N
    columns: int  # K
    nbytes: int
    call: object  # x [M, K] -> [M, N]


def read_bandwidth(threads: int, repeats: int = 5) -> float:
    """GiB/s of `threads` numpy threads each summing its share of a 1 GiB float32 array (numpy's sum releases the
    GIL, so the threads read at once)."""
    data = np.ones(READ_BYTES // 4, dtype=np.float32)
    parts = np.array_split(data, threads)
    times = []
    for _ in range(repeats):
        workers = [threading.Thread(target=np.sum, args=(part,)) for part in parts]
        start = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        times.append(time.perf_counter() - start)
    return data.nbytes / statistics.median(times) / 2**30


def format_of(layer: nn.Module) -> str | None:
    """A layer's weight format as the kernel reads it, or None for a layer with no weight matrix."""
    if "sub_scales" in layer:
        return f"{layer.bits}-bit K-quant"
    if "scales" in layer:
        scales = str(layer.scales.dtype).removeprefix("mlx.core.")
        return f"{layer.bits}-bit affine g{layer.group_size} ({scales} scales)"
    weight = layer.get("weight") if isinstance(layer, (nn.Linear, nn.Embedding)) else None
    return None if weight is None or weight.ndim != 2 else str(weight.dtype).removeprefix("mlx.core.")


def input_columns(layer: nn.Module) -> int:
    """K of a routed layer: its packed codes (affine or K-quant) hold 32 / bits values a uint32."""
    return layer.weight.shape[1] * 32 // layer.bits if hasattr(layer, "bits") else layer.weight.shape[1]


def largest_layers(view: nn.Module) -> list[FormatLayer]:
    """The largest layer of each format in a routed view (kernels/verify.py), as a matmul over rows of x."""
    best: dict[str, FormatLayer] = {}
    for name, layer in view.named_modules():
        kind = format_of(layer)
        if kind is None:
            continue
        nbytes = sum(layer[part].nbytes for part in WEIGHT_PARTS if part in layer)
        rows = layer.weight.shape[0]
        columns = input_columns(layer)
        call = layer.as_linear if hasattr(layer, "as_linear") else layer
        if kind not in best or nbytes > best[kind].nbytes:
            best[kind] = FormatLayer(kind, name, rows, columns, nbytes, call)
    return sorted(best.values(), key=lambda f: -f.nbytes)


def time_formats(layers: list[FormatLayer], sizes: tuple[int, ...], repeats: int) -> dict:
    """{format: {rows: median seconds}}, every (format, rows) once per round."""
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(repeats):
        for layer in layers:
            for m in sizes:
                x = mx.random.normal((m, layer.columns))
                mx.eval(x)
                start = time.perf_counter()
                mx.eval(layer.call(x))
                times.setdefault((layer.format, m), []).append(time.perf_counter() - start)
    return {layer.format: {m: statistics.median(times[(layer.format, m)]) for m in sizes} for layer in layers}


def run_format_cost(view: nn.Module, sizes: tuple[int, ...], repeats: int, threads: int, echo=print) -> dict:
    """Measure and print the table; the report holds the read bandwidths and, per format, GiB/s and v(n)."""
    one, many = read_bandwidth(1), read_bandwidth(threads)
    echo(f"memory read (numpy sum of 1 GiB): {one:.1f} GiB/s on 1 thread, {many:.1f} GiB/s on {threads}")
    layers = largest_layers(view)
    medians = time_formats(layers, sizes, repeats)
    echo(f"each format's largest layer, alone, median of {repeats} interleaved rounds (GiB/s of its weight bytes):")
    header = " ".join(f"{f'M={m}':>7s}" for m in sizes)
    echo(f"  {'format':36s} {'layer (N x K)':>16s} {header}   v(n) at {', '.join(str(m) for m in sizes[1:])}")
    report = {"read_gib_s": {"1": round(one, 2), str(threads): round(many, 2)}, "formats": {}}
    for layer in layers:
        seconds = medians[layer.format]
        speeds = {m: layer.nbytes / seconds[m] / 2**30 for m in sizes}
        curve = {m: seconds[m] / seconds[sizes[0]] for m in sizes}
        cells = " ".join(f"{speeds[m]:7.1f}" for m in sizes)
        shape = f"{layer.rows} x {layer.columns}"
        share = speeds[sizes[0]] / many
        echo(f"  {layer.format:36s} {shape:>16s} {cells}   {', '.join(f'{curve[m]:.2f}' for m in sizes[1:])}"
             f"   (M=1: {share:.0%} of the read)")  # fmt: skip
        report["formats"][layer.format] = {
            "layer": layer.name,
            "shape": [layer.rows, layer.columns],
            "bytes": layer.nbytes,
            "gib_s": {str(m): round(speeds[m], 3) for m in sizes},
            "v": {str(m): round(curve[m], 3) for m in sizes},
        }
    return report
