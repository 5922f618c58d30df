"""The verify kernel's weight formats against this machine's memory: GiB/s of weight bytes read per second for float32,
bfloat16, and the affine formats a GGUF converts into (groups of 32: 4-bit with float32 scales as Q4_K becomes,
5-bit and 8-bit with float16 scales as Q5_0 and Q8_0/Q6_K become), at M = 1, 4, 5 and 8 rows, on the real models'
shapes, beside a STREAM-like read of one large array by numpy (one thread) and MLX's own quantized_matmul at M = 1.
Rows marked "x int8" are the same weights against int8 activations (`--activations int8`, lossy, opt-in).

    python scripts/bench_qmatmul.py [--repeats 15]

Medians of interleaved repeats (every format and M once per round), so a busy spell falls on all alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
import numpy as np

from mlxspec.kernels.verify import cpu_backend

SHAPES = ((262144, 640), (151936, 1536), (8960, 1536), (1536, 8960))
ROWS = (1, 4, 5, 8)


def read_bandwidth(repeats: int) -> float:
    """GiB/s of one numpy thread summing a 1 GiB array: what one core reads from memory."""
    data = np.ones(1 << 28, dtype=np.float32)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - start)
    return data.nbytes / statistics.median(times) / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    backend, status = cpu_backend()
    if backend is None:
        raise SystemExit(f"bench_qmatmul: no verify kernel ({status})")
    print(f"memory read (numpy, one thread): {read_bandwidth(5):.1f} GiB/s; kernel threads: {backend.threads}")
    for n, k in SHAPES:
        w = mx.random.normal((n, k))
        formats = {"float32": (w,), "bfloat16": (w.astype(mx.bfloat16),)}
        for bits, scales in ((4, mx.float32), (5, mx.float16), (8, mx.float16)):
            q, s, b = mx.quantize(w, group_size=32, bits=bits)
            formats[f"{bits}-bit"] = (q, s.astype(scales), b.astype(scales))
            formats[f"{bits}-bit x int8"] = formats[f"{bits}-bit"]
        mx.eval(formats)
        times: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.repeats):
            for name, parts in formats.items():
                for m in ROWS:
                    x = mx.random.normal((m, k)).astype(parts[0].dtype if len(parts) == 1 else mx.float32)
                    mx.eval(x)
                    start = time.perf_counter()
                    if len(parts) == 1:
                        mx.eval(backend.matmul(x, parts[0]))
                    elif name.endswith("int8"):
                        mx.eval(backend.module.verify_qmatmul(x, *parts, 32, int(name[0]), int8_activations=True))
                    else:
                        mx.eval(backend.qmatmul(x, *parts, 32, int(name[0])))
                    times.setdefault((name, m), []).append(time.perf_counter() - start)
        print(f"{n} x {k}:")
        for name, parts in formats.items():
            nbytes = sum(p.nbytes for p in parts)
            speeds = [nbytes / statistics.median(times[(name, m)]) / 2**30 for m in ROWS]
            v5 = statistics.median(times[(name, 5)]) / statistics.median(times[(name, 1)])
            cells = " ".join(f"M={m}: {s:5.1f}" for m, s in zip(ROWS, speeds))
            print(f"  {name:14s} {cells} GiB/s  v(5) = {v5:.2f}")
        q = formats["4-bit"]
        x = mx.random.normal((1, k))
        start = time.perf_counter()
        mx.eval(mx.quantized_matmul(x, *q, group_size=32, bits=4))
        mlx_seconds = time.perf_counter() - start
        print(f"  MLX's own quantized_matmul, 4-bit, M=1: {sum(p.nbytes for p in q) / mlx_seconds / 2**30:.1f} GiB/s")


if __name__ == "__main__":
    main()
