#!/usr/bin/env bash
# Reproduce the embedded model family from scratch (about 80 minutes on 2 CPU cores). Resumable: rerun after a stop.
#   pip install -e ".[train]" && bash models/recipes/train_all.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f runs/tokenizer/tokenizer.json ] || python models/recipes/train_tokenizer.py --out runs/tokenizer --vocab-size 4096
python models/recipes/train_base.py draft --max-steps 800 --lr 3e-3 --minutes 25
python models/recipes/train_base.py target --max-steps 1000 --lr 2e-3 --minutes 80
bash models/recipes/export_models.sh
