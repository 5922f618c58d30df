"""One verify-kernel build, loaded from its .so, for comparing builds: `bits OUT.npz` dumps its outputs (2- to 8-bit
affine, Q4_K and Q5_K, M = 1..32) for a bitwise check against another build's; `speed` prints GiB/s of weight
bytes at M = 1 and 5 on the real models' shapes (median of 7), `rows` the same at M = 1, 2, 3, 4, 5 and 8 (the
verification sizes); `prefill` prints GFLOP/s at M = 128 on the 1.5B's shapes, a prompt chunk's work. Run builds in
alternation, in separate processes (one .so a process), e.g.

    for r in 1 2 3; do for b in old new; do
      python scripts/bench_kernel_builds.py /tmp/$b.so speed | sed "s/^/$b /"
    done; done
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_gguf_blocks import random_blocks  # noqa: E402

from mlxspec.gguf.blocks import k_quantized  # noqa: E402
from mlxspec.k_quants import PARTS  # noqa: E402

rng = np.random.default_rng(0)


def load_build(path: str):
    spec = importlib.util.spec_from_file_location("mlxspec._verify_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def affine(n: int, k: int, bits: int, group: int = 64, dtype: mx.Dtype = mx.float32):
    """A random affine layer; dtype that of its scales and biases (a GGUF's Q4_0/Q5_0/Q8_0 convert to float16)."""
    w = mx.array(rng.integers(0, 2**32, (n, k * bits // 32), dtype=np.uint32))
    s = mx.array(rng.standard_normal((n, k // group)).astype(np.float32) * 0.01).astype(dtype)
    b = mx.array(rng.standard_normal((n, k // group)).astype(np.float32) * 0.01).astype(dtype)
    mx.eval(w, s, b)
    return ("affine", k, (w, s, b, group, bits)), w.nbytes + s.nbytes + b.nbytes


def k_quant(n: int, k: int, type_name: str = "Q4_K"):
    held = k_quantized(random_blocks(type_name, n, k, rng), type_name, (n, k))
    parts = [mx.array(getattr(held, part)) for part in PARTS]
    parts[3], parts[4] = parts[3].astype(mx.float32), parts[4].astype(mx.float32)  # as loading widens them
    mx.eval(*parts)
    return ("kquant", k, (*parts, held.bits)), sum(part.nbytes for part in parts)


def product(module, layer, x: mx.array) -> mx.array:
    kind, _, args = layer
    call = module.verify_qmatmul if kind == "affine" else module.verify_kquant_matmul
    return call(x, *args, stream=mx.cpu)


def dump_bits(module, out: str) -> None:
    layers = {
        "a4": affine(300, 640, 4),
        "a8": affine(257, 576, 8),
        "a5": affine(130, 512, 5, 32),
        "a2": affine(70, 384, 2),
        "a3": affine(90, 320, 3, 32),
        "a6": affine(50, 256, 6),
        "a5h": affine(70, 640, 5, 32, mx.float16),  # 20 groups a row: 16 widened at once, then 4
        "a8h": affine(40, 2048, 8, 32, mx.float16),
        "a4b": affine(33, 1024, 4, 32, mx.bfloat16),
        "k4": k_quant(200, 512),
        "k5": k_quant(130, 768, "Q5_K"),
    }
    results = {}
    for name, (layer, _) in layers.items():
        for m in range(1, 33):
            x = mx.array(np.random.default_rng(m).standard_normal((m, layer[1])).astype(np.float32))
            results[f"{name}-{m}"] = np.array(product(module, layer, x))
    np.savez(out, **results)
    print(len(results), "cases")


def median_seconds(module, layer, x: mx.array, repeats: int) -> float:
    """One product's median time after a warm-up call."""
    mx.eval(product(module, layer, x))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(product(module, layer, x))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def time_shapes(module, sizes: tuple[int, ...] = (1, 5)) -> None:
    shapes = {
        "aff8 151936x1536": affine(151936, 1536, 8),
        "aff8 262144x640": affine(262144, 640, 8),
        "kq4 8960x1536": k_quant(8960, 1536),
        "kq4 1536x8960": k_quant(1536, 8960),
        "aff4 151936x1536": affine(151936, 1536, 4),
        "aff4 262144x640": affine(262144, 640, 4),
        "aff5 4864x896": affine(4864, 896, 5, 32),  # the 0.5B draft's MLP (Q5_0)
        "aff5 2048x640": affine(2048, 640, 5, 32, mx.float16),  # Gemma 3 270M's MLP (Q5_0)
        "aff8 640x2048": affine(640, 2048, 8, 32, mx.float16),  # its Q8_0 down projections
    }
    for name, (layer, nbytes) in shapes.items():
        for m in sizes:
            seconds = median_seconds(module, layer, mx.ones((m, layer[1]), dtype=mx.float32), 7)
            print(f"{name} M={m} {nbytes / seconds / 2**30:.2f}")


def time_prefill(module, m: int = 128) -> None:
    shapes = {
        "kq4 8960x1536": k_quant(8960, 1536),  # the 1.5B's gate and up projections
        "kq4 1536x8960": k_quant(1536, 8960),  # its down projection (Q4_K layers)
        "aff8 1536x8960": affine(1536, 8960, 8, 32),  # its down projection (Q6_K layers, held at 8 bits)
        "kq4 1536x1536": k_quant(1536, 1536),  # its query and output projections
    }
    for name, (layer, _) in shapes.items():
        n = int(name.split()[1].split("x")[0])
        seconds = median_seconds(module, layer, mx.array(rng.standard_normal((m, layer[1])).astype(np.float32)), 5)
        print(f"{name} M={m} {2 * m * n * layer[1] / seconds / 1e9:.1f} GFLOP/s")


if __name__ == "__main__":
    build = load_build(sys.argv[1])
    if sys.argv[2] == "bits":
        dump_bits(build, sys.argv[3])
    elif sys.argv[2] == "prefill":
        time_prefill(build)
    elif sys.argv[2] == "rows":  # the verification sizes: v(n) per format
        time_shapes(build, (1, 2, 3, 4, 5, 8))
    else:
        time_shapes(build)
