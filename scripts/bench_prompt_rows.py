"""A prompt's prefill through the verify kernel in 32-row chunks against prompt rows by GEMM (the weights widened to
float32, MLX's matmul), interleaved in one process, with the largest difference of the caches' keys:

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 OPENBLAS_THREAD_TIMEOUT=4 \\
        python scripts/bench_prompt_rows.py .real/qwen2.5-coder-1.5b-instruct --tokens 128 --rounds 3

(mlxspec's CLI re-executes under that BLAS itself; a script must be started under it.)
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlxspec.kernels import verify as verify_kernel
from mlxspec.kernels.many_rows import prompt_rows
from mlxspec.loading import load_model
from mlxspec.platform import blas_in_use


def prefill_seconds(view, tokens: mx.array, widen: bool) -> tuple[float, list]:
    cache = make_prompt_cache(view)
    start = time.perf_counter()
    with prompt_rows(widen):
        view(tokens, cache=cache)
    mx.eval([c.state for c in cache])
    return time.perf_counter() - start, cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    backend, why = verify_kernel.resolve("on")
    view = verify_kernel.routed_view(load_model(args.model).model, backend)
    tokens = mx.array([[(i * 7919) % 5000 + 100 for i in range(args.tokens)]])
    times: dict[bool, list[float]] = {False: [], True: []}
    difference, keys = 0.0, []
    for _ in range(args.rounds):
        for widen in (False, True):
            seconds, cache = prefill_seconds(view, tokens, widen)
            times[widen].append(seconds)
            if widen:
                difference = max(float(mx.abs(c.state[0] - k).max()) for c, k in zip(cache, keys))
            else:
                keys = [c.state[0] for c in cache]
    print(f"# {args.model}, {args.tokens} prompt tokens, {args.rounds} interleaved rounds, BLAS {blas_in_use()}")
    for widen, label in ((False, "kernel, 32-row chunks"), (True, "prompt rows by GEMM")):
        runs = ", ".join(f"{s:.2f}" for s in times[widen])
        median = statistics.median(times[widen])
        print(f"{label:24s} median {median:.2f} s ({runs}): {args.tokens / median:.1f} prompt tok/s")
    ratio = statistics.median(times[False]) / statistics.median(times[True])
    print(f"speedup {ratio:.2f}x; largest key difference {difference:.2e}")


if __name__ == "__main__":
    main()
