#!/usr/bin/env bash
# Convert the trained HF checkpoints into the shipped mlx-lm directories with mlx-lm's own converter:
# bf16 target and draft, and a 4-bit target (group 64), as real deployments quantize the target.
#   bash models/recipes/export_models.sh [RUNS_DIR] [MODELS_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-runs}
models=${2:-models}
export_dir="$runs/export"
rm -rf "$export_dir"
mkdir -p "$export_dir" "$models"
python -m mlx_lm convert --hf-path "$runs/target/hf" --mlx-path "$export_dir/target" --dtype bfloat16
python -m mlx_lm convert --hf-path "$runs/draft/hf" --mlx-path "$export_dir/draft" --dtype bfloat16
# bf16 scales and biases: float32 ones cost 0.7 MiB of the 40 MiB models/ budget, and load as float32 on the CPU
python -m mlx_lm convert --hf-path "$runs/target/hf" --mlx-path "$export_dir/target-4bit" -q --q-bits 4 --q-group-size 64 \
  --dtype bfloat16
for name in target draft target-4bit; do
  rm -f "$export_dir/$name/README.md"  # the converter's hub card; models/README.md is the model card
  # transformers 5 writes tokenizer_class "TokenizersBackend", which transformers 4 cannot load; keep the portable one.
  cp "$runs/tokenizer/tokenizer_config.json" "$export_dir/$name/tokenizer_config.json"
  python models/recipes/shard_weights.py "$export_dir/$name" --max-mb 16  # no file over 16 MiB in the repository
  rm -rf "${models:?}/$name"
  mv "$export_dir/$name" "$models/$name"
done
du -sh "$models"/*
