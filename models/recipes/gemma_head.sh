#!/usr/bin/env bash
# The hot-vocabulary EAGLE-3 head for google/gemma-3-270m (card: models/recipes/gemma_head.md), as
# llama.cpp's GGUF Q4_K_M converted by mlxspec. Resumable: run it again after a stop and it goes on from the last
# checkpoint (the self-distilled data and the target's features are cached in the --out directory).
# About 35 minutes of data generation and 40 of training on 2 cores (2026-12-04).
set -euo pipefail
cd "$(dirname "$0")/../.."
python scripts/fetch_real_model.py                       # .real/gemma-3-270m (the conversion) and its GGUF
out=${1:-.real/gemma-head}
mlxspec train-heads --kind eagle3 --model .real/gemma-3-270m --out "$out" \
  --target-rows --draft-vocab 32768 --english-share 0.5 --sampled-share 0.5 \
  --distill-sequences 512 --seq-len 256 --batch-size 8 --unroll 2 --steps 150 --lr 1e-3
heads="${MLXSPEC_CACHE:-$HOME/.cache/mlxspec}/heads/gemma-3-270m-eagle3"  # where --draft auto weighs it
mkdir -p "$heads"
cp "$out/config.json" "$out/model.safetensors" "$heads/"
echo "the head is in $heads"
