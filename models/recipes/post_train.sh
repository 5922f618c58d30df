#!/usr/bin/env bash
# After models/recipes/train_all.sh's training: export, evaluate, train and compare Medusa heads (corpus vs self-distilled
# data), ship the better heads, and write the model card. About 20 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 PYTHONUNBUFFERED=1
[ "${SKIP_EXPORT:-}" ] || bash models/recipes/export_models.sh
mkdir -p models/training_logs
cp runs/target/log.jsonl models/training_logs/target.jsonl
cp runs/draft/log.jsonl models/training_logs/draft.jsonl
[ "${SKIP_EVAL:-}" ] || python scripts/eval_models.py
steps=${MEDUSA_STEPS:-120}
for data in corpus self-distill; do
  mlxspec train-medusa --out "runs/medusa-$data" --steps "$steps" --data "$data" 2> "runs/medusa-$data.log"
  tail -4 "runs/medusa-$data.log"
  mlxspec bench --medusa "runs/medusa-$data" --modes medusa --temp 0 --temp 0.7 --repeats 1 --num-prompts 8 \
    --max-tokens 64 --json "runs/medusa-$data-bench.json" | tee "runs/medusa-$data-bench.txt"
done
python - <<'PY'
import json, shutil
from pathlib import Path
def tau(data):
    results = json.loads(Path(f"runs/medusa-{data}-bench.json").read_text())["results"]["0.0"]
    return next(r["tokens_per_target_call"] for r in results if r["mode"].startswith("mlxspec medusa k="))
scores = {data: tau(data) for data in ("corpus", "self-distill")}
best = max(scores, key=scores.get)
print(f"greedy tau of the Medusa chain: {scores}; shipping {best}")
shutil.rmtree("models/medusa", ignore_errors=True)
Path("models/medusa").mkdir(parents=True)
for name in ("medusa.safetensors", "medusa_config.json"):
    shutil.copy(f"runs/medusa-{best}/{name}", f"models/medusa/{name}")
import os
meta = {"medusa_args": f"--steps {os.environ.get('MEDUSA_STEPS', '120')} --data {best}", "medusa_tau": scores}
Path("models/training_logs/meta.json").write_text(json.dumps(meta, indent=1) + "\n")
PY
python models/recipes/model_card.py
du -sh models
