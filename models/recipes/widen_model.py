"""Save a function-preserving widening of a model as an mlx-lm model directory (the bench bed, on disk).

python models/recipes/widen_model.py --widen 24x768 --out /tmp/target-24x768      # the embedded target by default
mlxspec bench --model /tmp/target-24x768 --draft models/draft               # or: mlxspec bench --widen 24x768
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from mlx_lm.utils import save_config, save_model

from mlxspec.bench.widen import WidenSpec, widen
from mlxspec.loading import DEFAULT_TARGET, load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(DEFAULT_TARGET))
    parser.add_argument("--widen", required=True, help="LAYERSxWIDTH, e.g. 24x768")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    if args.out.exists():
        parser.error(f"{args.out} exists; pass a new directory")
    source = load_model(args.model)
    model, config = widen(source.model, source.config, WidenSpec.parse(args.widen))
    args.out.mkdir(parents=True)
    save_model(args.out, model)
    save_config(config, args.out / "config.json")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (source.path / name).exists():
            shutil.copy(source.path / name, args.out / name)
    print(f"saved {args.widen} widening of {source.path} to {args.out}")


if __name__ == "__main__":
    main()
