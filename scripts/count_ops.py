"""Count the MLX primitives in one forward pass of a model (default: the embedded target), by kind.

On the CPU backend, RoPE, RMSNorm and attention run as composite fallbacks, so a small model's forward is hundreds
of ops, each with a fixed dispatch cost; that, not arithmetic, sets the speed of the embedded models here.

    python scripts/count_ops.py [model_dir] [--tokens N]
"""

from __future__ import annotations

import argparse
import collections
import re
import tempfile

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlxspec.loading import DEFAULT_TARGET, load_model


def count_ops(model, tokens: int, context: int = 256) -> collections.Counter:
    cache = make_prompt_cache(model)
    model(mx.zeros((1, context), mx.int32), cache=cache)
    mx.eval([c.state for c in cache])
    out = model(mx.zeros((1, tokens), mx.int32), cache=cache)
    with tempfile.NamedTemporaryFile("r", suffix=".dot") as f:
        mx.export_to_dot(f.name, out)
        return collections.Counter(re.findall(r'label ="([A-Za-z]+)', f.read()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=str(DEFAULT_TARGET))
    parser.add_argument("--tokens", type=int, default=1)
    args = parser.parse_args()
    ops = count_ops(load_model(args.model).model, args.tokens)
    print(f"{sum(ops.values())} ops in one forward over {args.tokens} token(s) at context 256 ({mx.default_device()})")
    for name, n in ops.most_common(12):
        print(f"  {n:5d} {name}")


if __name__ == "__main__":
    main()
