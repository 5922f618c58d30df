"""`mlxspec train-heads --kind hydra`: Hydra heads (drafting/heads/hydra.py) on a frozen target, distilled to its own
distribution.

Two choices the Medusa trainer's plateau (head 1 top-1 0.143 against the corpus) pointed to:
- Each head reads the token before the one it guesses (teacher-forced here: the true tokens of the window).
- The labels are the target's own next-token distributions at every position (a soft cross-entropy), on the
  target's own continuations, greedy and, for `sampled_share` of them, sampled at T=0.7, as the EAGLE-3 trainer
  makes them (the same files, so a run can reuse them). The heads learn what the target will say, not what the
  corpus said.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from mlxspec.decoding.target_features import output_head, text_model
from mlxspec.drafting.heads.files import base_model_identity, check_checkpoint_identity, checkpoint_state, warmup_cosine
from mlxspec.drafting.heads.hydra import HydraHeads
from mlxspec.drafting.heads.medusa import MedusaConfig, save_medusa
from mlxspec.errors import UserError
from mlxspec.loading import LoadedModel
from mlxspec.train.eagle3 import eagle3_streams
from mlxspec.train.loop import train_steps
from mlxspec.train.medusa import HEAD_DECAY, check_lr, check_room_for_heads, check_window

MAX_RANK = 8  # ranks whose accuracy is recorded: the sparse tree's estimates


@dataclass
class HydraTrainConfig:
    num_heads: int = 4
    steps: int = 600
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 1e-3
    warmup: int = 20
    seed: int = 0
    data: str = "self-distill"  # Hydra heads learn the target's own text only
    distill_sequences: int = 1024
    sampled_share: float = 0.5  # of the self-distilled sequences, this share sampled at T=0.7
    english_share: float = 0.0  # of them, this share continues English prompts (the rest code)
    eval_windows: int = 32

    def validate(self, context_length: int | None = None) -> None:
        check_lr(self.lr)
        check_room_for_heads(self.seq_len, self.num_heads)
        check_window(self.seq_len, "self-distill", context_length)


def distill_loss(heads: HydraHeads, hidden, embedded, target_logits, base_head, weights) -> tuple[mx.array, mx.array]:
    """(the weighted mean over heads, each head's mean) of the soft cross-entropy against the target's
    distribution: head d's row t guesses x_{t+d+1}, whose law is the target's logits at t+d."""
    outs = heads.teacher_forced(hidden, embedded, base_head)
    length = outs[0].shape[1]
    per_head = []
    for d, logits in enumerate(outs, start=1):
        teacher = mx.softmax(target_logits[:, d : d + length], axis=-1)
        per_head.append(-(teacher * nn.log_softmax(logits, axis=-1)).sum(axis=-1).mean())
    per_head = mx.stack(per_head)
    return (per_head * weights).sum() / weights.sum(), per_head


def greedy_topk_accuracy(heads: HydraHeads, target: LoadedModel, windows: list[np.ndarray]) -> list[list[float]]:
    """[head][rank]: how often the head's rank-r guess is the target's greedy token, teacher-forced on windows."""
    base_head, embed = output_head(target.model), text_model(target.model).model.embed_tokens
    hits, count = np.zeros((heads.config.num_heads, MAX_RANK)), 0
    for window in windows:
        x = mx.array(window)[None]
        hidden = text_model(target.model).model(x)
        greedy = mx.argmax(base_head(hidden), axis=-1)[0]  # [T]: the target's choice after each position
        outs = heads.teacher_forced(hidden, embed(mx.concatenate([x[:, 1:], x[:, :1]], axis=1)), base_head)
        length = outs[0].shape[1]
        for d, logits in enumerate(outs, start=1):
            order = mx.argsort(-logits[0], axis=-1)[:, :MAX_RANK]
            hits[d - 1] += np.array((order == greedy[d : d + length, None]).sum(axis=0))
        count += length
    return (hits / max(count, 1)).tolist()


def train_hydra(target: LoadedModel, out_dir: Path, cfg: HydraTrainConfig, log: Callable[[str], None] = print):
    mx.random.seed(cfg.seed)
    stream, heldout, _ = eagle3_streams(target, cfg, out_dir, log)
    if len(stream) <= cfg.seq_len:
        raise UserError(f"--seq-len {cfg.seq_len} is longer than the whole training text ({len(stream)} tokens)")
    config = MedusaConfig(
        cfg.num_heads,
        target.config["hidden_size"],
        target.config["vocab_size"],
        True,
        target.path.name,
        base_model_identity(target.path),
        data="self-distill",
        style="hydra",
    )
    heads = HydraHeads(config)
    identity = {"kind": "hydra", "num_heads": cfg.num_heads, "base_model_identity": config.base_model_identity}
    ckpt = out_dir / "checkpoint"
    state = checkpoint_state(ckpt)
    check_checkpoint_identity(state, identity, out_dir)
    target.model.freeze()
    inner, base_head = text_model(target.model).model, output_head(target.model)
    optimizer = optim.AdamW(learning_rate=warmup_cosine(cfg.lr, cfg.warmup, cfg.steps), weight_decay=0.0)
    weights = mx.array([HEAD_DECAY**i for i in range(cfg.num_heads)])
    step_fn = nn.value_and_grad(heads, lambda model, *a: distill_loss(model, *a, base_head, weights))

    def one_step(rng: np.random.Generator) -> tuple[mx.array, mx.array]:
        starts = rng.integers(0, len(stream) - cfg.seq_len - 1, cfg.batch_size)
        tokens = mx.array(np.stack([stream[s : s + cfg.seq_len + 1] for s in starts]))
        hidden = mx.stop_gradient(inner(tokens[:, :-1]))
        target_logits = mx.stop_gradient(base_head(hidden))
        embedded = mx.stop_gradient(inner.embed_tokens(tokens[:, 1:]))  # row t: the token after position t
        (loss, per_head), grads = step_fn(heads, hidden, embedded, target_logits)
        optimizer.update(heads, grads)
        mx.eval(heads.parameters(), optimizer.state, loss, per_head)
        return loss, per_head

    windows = [heldout[i : i + cfg.seq_len] for i in range(0, len(heldout) - cfg.seq_len + 1, cfg.seq_len)]
    curve = out_dir / "curve.jsonl"

    def record(state: dict) -> None:
        accuracy = greedy_topk_accuracy(heads, target, windows[:8])
        with curve.open("a") as f:
            f.write(json.dumps({"step": state["step"], "top1": [round(a[0], 4) for a in accuracy]}) + "\n")

    train_steps(
        heads,
        optimizer,
        cfg,
        state,
        identity,
        (ckpt, "heads.safetensors", out_dir),
        one_step,
        lambda per_head, done, elapsed: f"CE/head {' '.join(f'{v:.3f}' for v in per_head.tolist())}, ",
        log,
        on_checkpoint=record,
    )
    heads.config.topk_accuracy = greedy_topk_accuracy(heads, target, windows)
    save_medusa(heads, out_dir)
    for d, accuracy in enumerate(heads.config.topk_accuracy, start=1):
        log(f"head {d} (token t+{d + 1}): top-1 {accuracy[0]:.3f}  top-5 {sum(accuracy[:5]):.3f} (target's greedy)")
    return heads
