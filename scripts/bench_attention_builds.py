"""One verify-kernel build's row-equivalent attention at one query row, on the real models' head shapes: microseconds
a call (median of 9 rounds of 30 calls), keys read from a longer buffer as a KV cache hands them over. Run builds
in alternation, one .so a process:

    for b in old new; do python scripts/bench_attention_builds.py /tmp/$b.so | sed "s/^/$b /"; done
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time

import mlx.core as mx

SHAPES = ((4, 1, 256, 128), (12, 2, 128, 128), (12, 2, 128, 1024), (14, 2, 64, 512))  # Hq, Hkv, D, keys


def main() -> None:
    spec = importlib.util.spec_from_file_location("_verify_kernel", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cells = []
    for q_heads, kv_heads, dim, keys in SHAPES:
        q = mx.random.normal((1, q_heads, 1, dim))
        buffer = mx.random.normal((1, kv_heads, keys + 64, dim))
        k, v = buffer[:, :, :keys], buffer[:, :, :keys] * 0.5
        mx.eval(q, k, v)
        times = []
        for _ in range(9):
            start = time.perf_counter()
            mx.eval([module.verify_attention(q, k, v, 0.1, None, False, stream=mx.cpu) for _ in range(30)])
            times.append((time.perf_counter() - start) / 30)
        cells.append(f"{q_heads}/{kv_heads} heads x {dim}, {keys} keys: {statistics.median(times) * 1e6:.0f} us")
    print(" | ".join(cells))


if __name__ == "__main__":
    main()
