#!/usr/bin/env bash
# Reproduce the embedded model family from scratch (about 80 minutes on 2 CPU cores). Resumable: rerun after a stop.
#   pip install -e ".[train]" && bash scripts/train_all.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f runs/tokenizer/tokenizer.json ] || python scripts/train_tokenizer.py --out runs/tokenizer --vocab-size 4096
python scripts/train_base.py draft --max-steps 800 --lr 3e-3 --minutes 25
python scripts/train_base.py target --max-steps 1000 --lr 2e-3 --minutes 80
bash scripts/export_models.sh
