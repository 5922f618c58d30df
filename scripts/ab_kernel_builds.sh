#!/usr/bin/env bash
# Two builds of the verify kernel, end to end: plain decoding's tok/s on the real beds, each build in turn per round
# (interleaved, so a busy spell falls on both), the texts compared. The builds are .so files (copy
# mlxspec/_verify_kernel*.so aside before rebuilding); the installed one is put back at the end.
#
#   scripts/ab_kernel_builds.sh OLD.so NEW.so [ROUNDS] [TOKENS]   # needs .real/ (scripts/fetch_real_model.py --pair)
#
# MODELS="gemma-3-270m qwen2.5-coder-0.5b-instruct" picks the folders of .real/ to run (default: Gemma and the 1.5B).
set -euo pipefail
cd "$(dirname "$0")/.."
old=$1 new=$2 rounds=${3:-3} tokens=${4:-96}
read -r -a models <<< "${MODELS:-gemma-3-270m qwen2.5-coder-1.5b-instruct}"
installed=$(ls mlxspec/_verify_kernel*.so)
backup=$(mktemp)
cp "$installed" "$backup"
trap 'cp "$backup" "$installed"; rm -f "$backup"' EXIT
prompts=("def parse_csv_line(line: str) -> list[str]:" "import heapq

def dijkstra(graph, start):")
for round in $(seq "$rounds"); do
  for build in old new; do
    cp "${!build}" "$installed"
    for model in "${models[@]}"; do
      for i in "${!prompts[@]}"; do
        line=$(.venv/bin/mlxspec generate --model ".real/$model" --no-draft --max-tokens "$tokens" -v \
               "${prompts[$i]}" 2>&1 >"/tmp/ab-$build-$model-$i.txt" | grep -o 'gen=[0-9.]* tok/s')
        echo "round=$round build=$build model=$model prompt=$i $line"
      done
    done
  done
done
for model in "${models[@]}"; do
  for i in "${!prompts[@]}"; do
    cmp -s "/tmp/ab-old-$model-$i.txt" "/tmp/ab-new-$model-$i.txt" && same=equal || same=DIFFERENT
    echo "text $model prompt=$i: $same"
  done
done
