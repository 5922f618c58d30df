"""Verification cost v(n) of the widened bench target with and without the verify kernel, per weight format.

For float32, bfloat16 and 4-/8-bit (group 64) copies of the embedded target widened to LAYERSxWIDTH, times one
target forward over n = 1, 2, 4, 8, 16, 24, 32, 33 tokens at context 256 (median of 7, costs._time_forward) with MLX's
matmuls, with the kernel's matmuls (attention left to MLX), and with the kernel's matmuls and attention
(verify_kernel.routed_view), and prints ms and v(n) = cost(n) / cost(1).

    python scripts/bench_verify_kernel.py [--widen 24x768] [--formats f32,bf16,q4,q8]
"""

from __future__ import annotations

import argparse

import mlx.core as mx
import mlx.nn as nn

from mlxspec.bench.widen import WidenSpec, widen
from mlxspec.decoding.costs import _time_forward
from mlxspec.kernels import verify as verify_kernel
from mlxspec.loading import DEFAULT_TARGET, load_model
from mlxspec.platform import blas_in_use

SIZES = (1, 2, 4, 8, 16, 24, 32, 33)  # 33: one row past the kernel, MLX's matmul in both


def converted(model: nn.Module, fmt: str) -> nn.Module:
    if fmt == "bf16":
        model.set_dtype(mx.bfloat16)
    elif fmt in ("q4", "q8"):
        nn.quantize(model, group_size=64, bits=int(fmt[1]))
    mx.eval(model.parameters())
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widen", default="24x768")
    parser.add_argument("--formats", default="f32,bf16,q4,q8")
    args = parser.parse_args()
    backend, why = verify_kernel.cpu_backend()
    if backend is None:
        raise SystemExit(f"the verify kernel is unavailable: {why}")
    source = load_model(DEFAULT_TARGET)
    threads = backend.threads
    print(f"# target widened to {args.widen}; context 256; median of 7; {blas_in_use()} BLAS; kernel threads {threads}")
    print(f"{'format':7s} {'matmul':7s} " + " ".join(f"{f'n={n} ms':>9s}" for n in SIZES) + "   v(2..33)")
    for fmt in args.formats.split(","):
        model, _ = widen(source.model, source.config, WidenSpec.parse(args.widen))
        model = converted(model, fmt)
        for name, use, attention in (("mlx", None, False), ("kernel", backend, False), ("+attn", backend, True)):
            view = verify_kernel.routed_view(model, use, attention)
            costs = [_time_forward(view, n, 256, 7) for n in SIZES]
            ratios = "/".join(f"{c / costs[0]:.2f}" for c in costs[1:])
            print(f"{fmt:7s} {name:7s} " + " ".join(f"{1e3 * c:9.1f}" for c in costs) + f"   {ratios}")
        del model


if __name__ == "__main__":
    main()
