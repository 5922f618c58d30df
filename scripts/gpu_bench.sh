#!/usr/bin/env bash
# The GPU half of the bench (issue #6), run on a lent CUDA machine with mlx[cuda] carried as wheels.
# The 90 MB mlx-cuda-13 wheel travels in two parts (the transfer limit is 64 MiB per call): an earlier call leaves
# .gpu/cuda13.part_aa on the machine; this one brings .whl/cuda13.part_ab, the small wheels and runs/gpu/ (the 4-bit
# target and the draft). Writes $OUT/gpu_bench.txt and $OUT/gpu_bench.json.
set -euo pipefail
cat .gpu/cuda13.part_aa .whl/cuda13.part_ab > /tmp/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .whl/mlx-0.32.4-*.whl .whl/mlx_lm-*.whl /tmp/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MLXSPEC_NO_OPENBLAS=1
python3 -c "import mlx.core as mx; print(mx.default_device(), mx.device_info())" | tee "$OUT/gpu_bench.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv | tee -a "$OUT/gpu_bench.txt"
python3 -m mlxspec.cli bench --model runs/gpu/target-4bit --draft runs/gpu/draft \
  --num-prompts 4 --max-tokens 96 --repeats 2 -k 2 -k 4 --temp 0 --temp 0.7 \
  --modes mlx-lm,plain,draft,tree,lookup --json "$OUT/gpu_bench.json" 2>&1 | tee -a "$OUT/gpu_bench.txt"
