"""Held-out quality of the shipped models, computed with MLX on exactly what users load.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 python scripts/eval_models.py

For each model: mean next-token loss (nats/token) over every held-out stdlib file, in 512-token windows; and the
teacher-forced top-1 agreement of draft and target (the fraction of positions where their argmaxes are equal).
The 4-bit target is scored on every 6th window only: MLX's CPU quantized matmul costs grow with rows, so its full
pass takes over 10 minutes on 2 cores. Writes models/eval.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from mlxspec.drafting.lookup.corpus import read_text, split_files
from mlxspec.loading import load_model

WINDOW = 512


def heldout_windows(tokenizer) -> list[list[int]]:
    _, heldout = split_files()
    stream: list[int] = []
    eos = tokenizer.eos_token_id
    for path in heldout:
        text = read_text(path)
        if text:
            stream += tokenizer.encode(text) + [eos]
    return [
        stream[i : i + WINDOW + 1] for i in range(0, len(stream) - 1, WINDOW) if len(stream[i : i + WINDOW + 1]) > 1
    ]


def window_stats(model, window: list[int]) -> tuple[float, mx.array]:
    """(sum of losses over the window, argmax predictions)."""
    x = mx.array(window)
    logits = model(x[None, :-1])[0].astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    loss = -mx.take_along_axis(logprobs, x[1:, None], axis=-1).sum()
    return loss, mx.argmax(logits, axis=-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=Path, default=Path("models"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    names = [n for n in ("target", "target-4bit", "draft") if (args.models / n / "config.json").exists()]
    loaded = {n: load_model(args.models / n) for n in names}
    windows = heldout_windows(loaded["target"].tokenizer)
    num_tokens = sum(len(w) - 1 for w in windows)
    print(f"{len(windows)} held-out windows, {num_tokens:,} predicted tokens")

    results: dict = {"heldout_tokens": num_tokens, "models": {}}
    predictions: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for name, lm in loaded.items():
        start = time.perf_counter()
        total = 0.0
        subset = windows[::6] if name == "target-4bit" else windows
        scored = sum(len(w) - 1 for w in subset)
        for window in subset:
            loss, argmax = window_stats(lm.model, window)
            mx.eval(loss, argmax)
            total += loss.item()
            predictions[name].append(np.array(argmax))
        params = sum(v.size for _, v in tree_flatten(lm.model.parameters()))
        results["models"][name] = {
            "heldout_loss": total / scored,
            "scored_tokens": scored,
            "stored_parameters": int(params),
            "seconds": time.perf_counter() - start,
        }
        print(f"{name:12s} loss {total / scored:.4f} nats/token over {scored:,} tokens")

    if "draft" in predictions:
        for name in ("target", "target-4bit"):
            if name in predictions:
                draft = predictions["draft"][::6] if name == "target-4bit" else predictions["draft"]
                same = sum(int((a == b).sum()) for a, b in zip(draft, predictions[name]))
                count = sum(len(a) for a in predictions[name])
                results[f"agreement_draft_{name}"] = same / count
                print(f"top-1 agreement draft vs {name}: {same / count:.4f}")
        results["loss_gap_draft_minus_target"] = (
            results["models"]["draft"]["heldout_loss"] - results["models"]["target"]["heldout_loss"]
        )
        print(f"loss gap (draft - target): {results['loss_gap_draft_minus_target']:.4f} nats/token")
    out = args.out or args.models / "eval.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
