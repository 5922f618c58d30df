"""Perplexity of a GGUF's conversion at its own bits against the file's float dequantization, on held-out text.

    python scripts/perplexity.py MODEL.gguf [--tokens 2048] [--window 512] [--text FILE ...] [--int8]

The float model is built from the file itself (the gguf package's dequantization, llama.cpp's transforms undone,
float32); the converted one is what `mlxspec generate --model MODEL.gguf` loads (exact block types exact, Q6_K
re-quantized to 8 bits). Both score the same tokens in windows; the default text is mlxspec's own README and
docs, written after either model was trained. `--int8` also scores the conversion with int8 activations
(`--kernel int8`). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlxspec.gguf.architectures import architecture_of, mlx_name, undo_transforms  # noqa: E402
from mlxspec.gguf.convert import converted_dir  # noqa: E402
from mlxspec.gguf.header import read_header  # noqa: E402
from mlxspec.gguf.weights import float_values, raw_blocks  # noqa: E402
from mlxspec.kernels.verify import cpu_backend, int8_backend, routed_view  # noqa: E402
from mlxspec.loading import load_model  # noqa: E402

DEFAULT_TEXT = [ROOT / "README.md", ROOT / "docs" / "how-it-works.md", ROOT / "docs" / "planner.md"]


def float_model(path: Path, config: dict):
    """The file's model in float32, every tensor dequantized by the gguf package."""
    from mlx_lm.utils import _get_classes

    header = read_header(path)
    arch = architecture_of(header)
    config = {k: v for k, v in config.items() if k != "quantization"}
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    data = np.memmap(path, dtype=np.uint8, mode="r")
    weights = []
    for tensor in header.tensors:
        values = float_values(header, tensor, raw_blocks(data, header, tensor))
        name = mlx_name(tensor.name, arch)
        weights.append((name, mx.array(undo_transforms(name, values, arch, config))))
    model.load_weights(model.sanitize(dict(weights)).items() if hasattr(model, "sanitize") else weights)
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def mean_nll(model, tokens: list[int], window: int) -> float:
    total, count = 0.0, 0
    for start in range(0, len(tokens) - 1, window):
        chunk = mx.array(tokens[start : start + window + 1])[None]
        logits = model(chunk[:, :-1]).astype(mx.float32)
        nll = mx.logsumexp(logits, axis=-1) - mx.take_along_axis(logits, chunk[:, 1:, None], axis=-1)[..., 0]
        total += nll.sum().item()
        count += nll.size
    return total / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--text", type=Path, nargs="*", default=DEFAULT_TEXT)
    parser.add_argument("--converted", type=Path, help="its conversion, if made elsewhere (fetch_real_model.py)")
    parser.add_argument("--int8", action="store_true", help="also score it with int8 activations (--kernel int8)")
    args = parser.parse_args()
    folder = args.converted or converted_dir(args.gguf)
    converted = load_model(folder)
    text = "\n\n".join(p.read_text() for p in args.text)
    tokens = converted.tokenizer.encode(text)[: args.tokens + 1]
    backend = cpu_backend()[0]  # both through the kernel, as generation runs them (MLX's CPU ops are far slower)
    own_bits = mean_nll(routed_view(converted.model, backend, attention=False), tokens, args.window)
    int8 = None
    if args.int8:
        int8 = mean_nll(routed_view(converted.model, int8_backend(), attention=False), tokens, args.window)
    del converted
    reference = float_model(args.gguf, json.loads((folder / "config.json").read_text()))
    floats = mean_nll(routed_view(reference, backend, attention=False), tokens, args.window)
    result = {
        "model": args.gguf.name,
        "tokens": len(tokens) - 1,
        "perplexity_float": math.exp(floats),
        "perplexity_own_bits": math.exp(own_bits),
        "change": math.exp(own_bits - floats) - 1,
        "weights": json.loads((folder / "gguf_source.json").read_text()).get("weights"),
    }
    if int8 is not None:
        result |= {"perplexity_int8": math.exp(int8), "change_int8": math.exp(int8 - floats) - 1}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
