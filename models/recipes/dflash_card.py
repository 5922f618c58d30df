"""Write models/dflash/README.md, the shipped DFlash drafter's model card, from what was measured.

Reads the drafter's config.json (its recipe, training time, and the teacher-forced acceptance by block row that
train-heads measured on held-out greedy continuations) and a JSON file from `mlxspec bench acceptance` (tau and
alpha by depth of real generation on held-out prompts, chains and DDTrees, T=0 and T=0.7).

    mlxspec bench acceptance --dflash models/dflash --depth 7 --no-draft-model --json dflash.json
    python models/recipes/dflash_card.py --acceptance dflash.json --machine "Linux x86-64, 2 cores, ..."
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mlxspec.loading import MODELS_DIR


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", default=str(MODELS_DIR / "dflash"))
    parser.add_argument("--acceptance", required=True, help="JSON written by `mlxspec bench acceptance`")
    parser.add_argument("--machine", required=True, help="where it was trained and measured, in words")
    parser.add_argument("--command", default="", help="the train-heads command that made it")
    parser.add_argument("--total-minutes", type=float, default=0, help="wall time with distillation, if known")
    parser.add_argument(
        "--measured-by",
        default="mlxspec bench acceptance --dflash models/dflash --depth 7 --no-draft-model",
        help="the acceptance_by_depth.py command that wrote --acceptance",
    )
    args = parser.parse_args()
    folder = Path(args.drafter)
    config = json.loads((folder / "config.json").read_text())
    ours = config.get("mlxspec", {})
    training = ours.get("training", {})
    rows = json.loads(Path(args.acceptance).read_text())
    size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    lines = [
        "# The embedded DFlash drafter",
        "",
        f"A DFlash block drafter for the embedded target (`models/target`), written in z-lab's format by "
        f"`mlxspec train-heads --kind dflash`: {config['num_hidden_layers']} layers of width "
        f"{config['hidden_size']} (MLP {config['intermediate_size']}), taps of target layers "
        f"{config['dflash_config']['target_layer_ids']}, blocks of {config['dflash_config']['block_size']} "
        f"(`-k` up to {config['dflash_config']['block_size'] - 1}), {size / 2**20:.1f} MiB in bf16. It shares the "
        "target's embedding and LM head, and carries the target's fingerprint, which `--dflash` checks.",
        "",
        f"Trained on {args.machine} in {training.get('seconds', 0) / 60:.0f} minutes of training-loop wall time"
        + (f" ({args.total_minutes:.0f} with the self-distillation and the feature pass)" if args.total_minutes else "")
        + (f" by `{args.command}`" if args.command else "")
        + f": {training.get('steps')} steps of {training.get('batch_size')} windows x {training.get('anchors')} "
        f"anchors, windows of {training.get('seq_len')} tokens from {training.get('distill_sequences')} "
        f"self-distilled sequences, KL to the target with position decay gamma {training.get('gamma')}, "
        f"lr {training.get('lr')}.",
        "",
        "## Acceptance in generation (held-out stdlib prompts)",
        "",
        "tau: tokens per target call; alpha_d: the share of steps keeping draft d among those that kept d-1.",
        f"Measured by `{args.measured_by}` on the same host.",
        "",
        "| mode | tau | alpha by depth |",
        "|---|---|---|",
    ]
    for name, result in rows.items():
        alphas = " ".join(f"{a:.2f}" for a in result["alpha_by_depth"])
        lines.append(f"| {name} | {result['tau']:.2f} | {alphas} |")
    by_row = ours.get("acceptance_by_row", [])
    lines += [
        "",
        "## Teacher-forced acceptance by block row (held-out greedy continuations)",
        "",
        "Row i's draft accepted when rows 1..i-1 were, at every 4th position of 32 held-out windows; measured by "
        "train-heads at the end of training.",
        "",
        "| row | " + " | ".join(str(i + 1) for i in range(len(by_row))) + " | tau |",
        "|---|" + "---|" * (len(by_row) + 1),
        "| alpha | " + " | ".join(f"{a:.2f}" for a in by_row) + f" | {ours.get('tau', 0):.2f} |",
        "",
    ]
    (folder / "README.md").write_text("\n".join(lines))
    print(f"wrote {folder / 'README.md'}")


if __name__ == "__main__":
    main()
