#!/usr/bin/env bash
# A second draft for the embedded target with ANOTHER tokenizer: a byte-level BPE of 2048 tokens (the target's has
# 4096) trained on the same stdlib files, and the draft shape trained on it (at most ~25 CPU-minutes). The test bed
# of cross-tokenizer drafting (docs/how-it-works.md); resumable: rerun after a stop.
#   pip install -e ".[train]" && bash models/recipes/train_xtok_draft.sh [RUNS_DIR] [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-runs/xtok}
out=${2:-$runs/draft-mlx}
[ -f "$runs/tokenizer/tokenizer.json" ] || python models/recipes/train_tokenizer.py --out "$runs/tokenizer" --vocab-size 2048
python models/recipes/train_base.py draft --tokenizer "$runs/tokenizer" --runs "$runs" --max-steps 800 --lr 3e-3 --minutes 25
rm -rf "$out"
python -m mlx_lm convert --hf-path "$runs/draft/hf" --mlx-path "$out" --dtype bfloat16
rm -f "$out/README.md"
cp "$runs/tokenizer/tokenizer_config.json" "$out/tokenizer_config.json"
echo "cross-tokenizer draft: $out"
