"""Where one plain decoding step of a converted model goes, on this machine: the whole step, the decoder layers
alone, the output projection alone, and the floor that reading every weight once sets at the rate the output
projection (one matrix-vector product over the largest matrix) reads its own weights.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 python scripts/profile_real_step.py \
        .real/gemma-3-270m [--quantize 4] [--kernel]

--kernel runs the model as mlxspec decodes it on the CPU: its layers and attention through the verify kernel
(`routed_view`), and adds `layer_matmuls_ms`, the decoder layers' projections alone (every routed layer of the
decoder once at one row, in one graph), so that the rest of a layer (norms, rotary, attention, MLX's dispatch)
is `decoder_layers_ms - layer_matmuls_ms`.

Prints one JSON object. Medians of 40 timed repeats after 5 warm-ups, each forced with mx.eval.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import mlx.core as mx
from mlx.utils import tree_flatten

from mlxspec.bench.format_cost import input_columns
from mlxspec.decoding.target_features import output_head, text_model
from mlxspec.kernels.verify import VerifyKQuantLinear, VerifyLinear, VerifyQuantizedLinear, cpu_backend, routed_view
from mlxspec.loading import load_model


def median_seconds(fn, repeats: int = 40, warmup: int = 5) -> float:
    for _ in range(warmup):
        mx.eval(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--quantize", type=int, default=None)
    parser.add_argument("--kernel", action="store_true", help="through the verify kernel, as mlxspec decodes")
    args = parser.parse_args()
    target = load_model(args.model, quantize_bits=args.quantize)
    model = target.model
    if args.kernel:
        backend, status = cpu_backend()
        if backend is None:
            raise SystemExit(f"profile_real_step: no verify kernel ({status})")
        model = routed_view(model, backend)
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    prompt = mx.array([[2] + list(range(1000, 1127))])
    mx.eval(model(prompt, cache=cache))
    token = mx.array([[1234]])

    def step():  # one decoding step at a fixed context: the cache grows by one and is trimmed back
        out = model(token, cache=cache)
        for layer_cache in cache:
            layer_cache.trim(1)
        return out

    def trunk():
        out = text_model(model).model(token, cache=cache)
        for layer_cache in cache:
            layer_cache.trim(1)
        return out

    hidden = mx.random.normal((1, 1, int(target.config["hidden_size"])))
    head = output_head(model)
    weights = dict(tree_flatten(model.parameters()))
    weight_bytes = sum(v.nbytes for v in weights.values())
    projection = median_seconds(lambda: head(hidden))
    layer = text_model(model).lm_head if "lm_head" in text_model(model) else text_model(model).model.embed_tokens
    projection_bytes = sum(v.nbytes for _, v in tree_flatten(layer.parameters()))
    rate = projection_bytes / 2**30 / projection  # GiB/s the matrix-vector product reads weights at
    result = {
        "model": str(args.model),
        "quantize": args.quantize,
        "step_ms": 1000 * median_seconds(step),
        "decoder_layers_ms": 1000 * median_seconds(trunk),
        "output_projection_ms": 1000 * projection,
        "weights_MiB": weight_bytes / 2**20,
        "projection_reads_GiB_per_s": rate,
        "floor_ms": 1000 * weight_bytes / 2**30 / rate,
    }
    if args.kernel:
        result["layer_matmuls_ms"] = 1000 * median_seconds(lambda: layer_matmuls(text_model(model).model))
    print(json.dumps(result, indent=1))


def layer_matmuls(trunk) -> list[mx.array]:
    """Every kernel-routed projection of the decoder layers once, at one row of its own input width."""
    routed = (VerifyLinear, VerifyQuantizedLinear, VerifyKQuantLinear)
    return [
        layer(mx.ones((1, 1, input_columns(layer))))
        for block in trunk.layers
        for _, layer in block.named_modules()
        if isinstance(layer, routed)
    ]


if __name__ == "__main__":
    main()
