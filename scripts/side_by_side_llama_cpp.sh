#!/bin/bash
# mlxspec against llama.cpp on the same GGUF files, interleaved by round: per round mlxspec's modes on Gemma 3 270M,
# llama.cpp's on it, then both on Qwen2.5-Coder-1.5B-Instruct with its 0.5B draft. The same 2 held-out code prompts
# (128 tokens), 64 tokens each, greedy; both time the whole completion (prompt and generation).
#
#   python scripts/fetch_real_model.py --pair
#   (mkdir -p /tmp/peer && cd /tmp/peer && npm install node-llama-cpp@3.21.1)
#   bash scripts/side_by_side_llama_cpp.sh OUT_DIR [ROUNDS] [PEER_DIR]
set -euo pipefail
OUT=${1:?give an output folder}
ROUNDS=${2:-2}
PEER=${3:-/tmp/peer}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
REAL=$ROOT/.real
PROMPTS=$ROOT/docs/results/code-prompts-2.jsonl
QWEN_MODES="mlxspec plain,mlxspec lookup k=4,mlxspec draft k=4,mlxspec draft k=auto,mlxspec lookup+draft k=4"
mkdir -p "$OUT"
cd "$ROOT"
for round in $(seq 1 "$ROUNDS"); do
  mlxspec bench --model "$REAL/gemma-3-270m" --only "mlxspec plain,mlxspec lookup k=auto" --temp 0 \
    --prompts "$PROMPTS" --num-prompts 2 --max-tokens 64 --repeats 1 --json "$OUT/gemma-mlxspec-$round.json"
  (cd "$PEER" && node "$ROOT/scripts/peer_llama_cpp.mjs" "$REAL/gemma-3-270m-q4_k_m.gguf" "$PROMPTS" 64 1 2) \
    > "$OUT/gemma-llama-$round.jsonl"
  mlxspec bench --model "$REAL/qwen2.5-coder-1.5b-instruct" --draft "$REAL/qwen2.5-coder-0.5b-instruct" \
    --only "$QWEN_MODES" -k 4 --temp 0 --prompts "$PROMPTS" --num-prompts 2 --max-tokens 64 --repeats 1 \
    --json "$OUT/qwen-mlxspec-$round.json"
  (cd "$PEER" && node "$ROOT/scripts/peer_llama_cpp.mjs" "$REAL/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" \
    "$PROMPTS" 64 1 2 "$REAL/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf") > "$OUT/qwen-llama-$round.jsonl"
done
