"""Split a model directory's weights into safetensors shards of at most --max-mb (mlx-lm loads model*.safetensors).

python models/recipes/shard_weights.py models/target --max-mb 16
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import mlx.core as mx


def shard(model_dir: Path, max_bytes: int) -> None:
    files = sorted(model_dir.glob("model*.safetensors"))
    weights: dict[str, mx.array] = {}
    for f in files:
        weights.update(mx.load(str(f)))
    shards: list[dict[str, mx.array]] = [{}]
    size = 0
    for name in sorted(weights):
        nbytes = weights[name].nbytes
        if size + nbytes > max_bytes and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][name] = weights[name]
        size += nbytes
    for f in files:
        f.unlink()
    weight_map = {}
    for i, part in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors" if len(shards) > 1 else "model.safetensors"
        mx.save_safetensors(str(model_dir / name), part, metadata={"format": "mlx"})
        weight_map.update({k: name for k in part})
    total = sum(v.nbytes for v in weights.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=4) + "\n")
    print(f"{model_dir}: {len(shards)} shard(s)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--max-mb", type=float, default=16)
    args = parser.parse_args()
    shard(args.model_dir, int(args.max_mb * 2**20))
