"""Medusa heads' held-out accuracy at each checkpoint a run left in a directory (step_N.safetensors), as JSON lines.

python scripts/medusa_curve.py runs/medusa_curve models/medusa > models/training_logs/medusa_curve.jsonl
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

from mlxspec.drafting.heads.medusa import CONFIG_FILE, MedusaConfig, MedusaHeads
from mlxspec.drafting.lookup.corpus import split_files
from mlxspec.loading import DEFAULT_TARGET, load_model
from mlxspec.train.medusa import token_stream, topk_accuracy


def main() -> None:
    snapshots, final = Path(sys.argv[1]), Path(sys.argv[2])
    target = load_model(DEFAULT_TARGET)
    config = json.loads((final / CONFIG_FILE).read_text())
    heads = MedusaHeads(MedusaConfig(**config))
    heldout = token_stream(split_files()[1], target.tokenizer)
    windows = [heldout[i : i + 256] for i in range(0, len(heldout) - 256, 256)]
    rng = np.random.default_rng(0)  # the 64 windows train-medusa evaluates on (seed 0)
    picked = [windows[i] for i in sorted(rng.choice(len(windows), min(64, len(windows)), False))]
    steps = sorted(int(re.findall(r"\d+", p.stem)[0]) for p in snapshots.glob("step_*.safetensors"))
    for step in steps:
        heads.load_weights(str(snapshots / f"step_{step}.safetensors"))
        accuracy = topk_accuracy(heads, target, picked, max_rank=1)
        print(json.dumps({"step": step, "topk_accuracy": accuracy}), flush=True)


if __name__ == "__main__":
    main()
