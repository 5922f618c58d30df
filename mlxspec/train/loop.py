"""The training loop the head trainers (EAGLE, EAGLE-3, DFlash) share: resume, step until cfg.steps with a progress
line and an ETA, stop on a non-finite loss, and checkpoint every CHECKPOINT_EVERY steps and at the end."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxspec.drafting.heads.files import resume_checkpoint, save_checkpoint
from mlxspec.errors import UserError

CHECKPOINT_EVERY = 100


def train_steps(
    module: nn.Module,
    optimizer,
    cfg,
    state: dict,
    identity: dict,
    checkpoint: tuple[Path, str, Path],
    step: Callable[[np.random.Generator], tuple[mx.array, mx.array]],
    describe: Callable[[mx.array, int, float], str],
    log: Callable[[str], None],
    on_checkpoint: Callable[[dict], None] | None = None,
) -> None:
    """Train `module` from state["step"] to cfg.steps. checkpoint: (its directory, the weights file name, the --out
    directory). step(rng) runs one optimizer step and returns (loss, what describe shows); describe(that, steps
    done this run, seconds this run) is the progress line's middle. on_checkpoint(state) runs after each save."""
    ckpt, weights_file, out_dir = checkpoint
    if state["step"]:
        resume_checkpoint(module, optimizer, ckpt, weights_file, out_dir)
        log(f"resumed at step {state['step']}")
    state.update(identity, seconds=state.get("seconds", 0.0))
    rng = np.random.default_rng(cfg.seed + state["step"])
    start, first_step = time.perf_counter(), state["step"]
    while state["step"] < cfg.steps:
        loss, shown = step(rng)
        if not math.isfinite(loss.item()):
            raise UserError(f"the loss became {loss.item()} at step {state['step'] + 1}; lower --lr")
        state["step"] += 1
        elapsed, done = time.perf_counter() - start, state["step"] - first_step
        eta = (cfg.steps - state["step"]) * elapsed / done
        log(f"step {state['step']}/{cfg.steps} loss {loss.item():.3f} {describe(shown, done, elapsed)}ETA {eta:.0f} s")
        if state["step"] % CHECKPOINT_EVERY == 0 or state["step"] == cfg.steps:
            state["seconds"] = state.get("seconds", 0.0) + time.perf_counter() - start
            start, first_step = time.perf_counter(), state["step"]
            save_checkpoint(module, optimizer, ckpt, weights_file, state)
            if on_checkpoint is not None:
                on_checkpoint(state)
