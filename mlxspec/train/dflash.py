"""`mlxspec train-heads --kind dflash`: train a DFlash block drafter for any target, on its own continuations.

Data: the target's greedy continuations of stdlib prompts (self-distillation), cut into windows; the target's taps
and final hidden states for every window are computed in one pass before training and cached in memory (float16).
Each step draws `anchors` random anchors per window; the block at anchor a is [x_a, MASK x (B-1)] at positions
a..a+B-1, reading the context rows before a. All blocks of a batch run as one forward, a mask keeping each block
to its own context. Block row i predicts the token at a+i; its loss is the KL divergence from the target's
distribution there, weighted by exp(-(i-1)/gamma) (DFlash's position decay). Checkpoints every 100 steps resume;
the result is written in z-lab's format (dflash_files.save_dflash), with the base model's fingerprint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from mlxspec.decoding.target_features import (
    decoder_layers,
    final_norm,
    forward_with_hidden,
    output_head,
    target_embedding_rows,
    text_model,
)
from mlxspec.drafting.dflash.files import default_target_layers, save_dflash
from mlxspec.drafting.dflash.model import DFlashConfig, DFlashDraftModel
from mlxspec.drafting.heads.files import (
    base_model_identity,
    check_checkpoint_identity,
    checkpoint_state,
    warmup_cosine,
)
from mlxspec.errors import UserError
from mlxspec.loading import LoadedModel
from mlxspec.model_files import text_config
from mlxspec.train.eagle import training_streams
from mlxspec.train.loop import train_steps
from mlxspec.train.medusa import DISTILL_PROMPT, check_lr, check_window

WEIGHTS_FILE = "drafter.safetensors"  # the checkpoint's; the finished drafter is model.safetensors


@dataclass
class DFlashTrainConfig:
    steps: int = 1500
    batch_size: int = 8  # windows per step
    anchors: int = 32  # blocks per window
    seq_len: int = 256
    block_size: int = 8
    layers: int = 2
    intermediate_size: int = 512
    taps: tuple[int, ...] = ()  # () spreads one per draft layer (z-lab's default), plus the last layer
    gamma: float = 4.0
    lr: float = 1e-3
    warmup: int = 50
    seed: int = 0
    distill_sequences: int = 1024
    eval_windows: int = 32
    data: str = "self-distill"

    def validate(self, context_length: int | None = None) -> None:
        check_lr(self.lr)
        if not 2 <= self.block_size <= 33:
            raise UserError(f"--block-size {self.block_size} must be 2..33 (the token fed and up to 32 drafts)")
        if self.seq_len < self.block_size + 8:
            raise UserError(
                f"--seq-len {self.seq_len} is too short for blocks of {self.block_size}; "
                f"use at least {self.block_size + 8}"
            )
        check_window(self.seq_len, self.data, context_length)


def new_drafter(target: LoadedModel, cfg: DFlashTrainConfig) -> DFlashDraftModel:
    """A fresh drafter in the target's attention shape, tapping cfg.taps (default: spread, plus the last layer)."""
    own = text_config(target.config)
    layers = own["num_hidden_layers"]
    spread = [min(max(t, 0), layers - 1) for t in default_target_layers(layers, cfg.layers)]  # (tiny targets)
    taps = cfg.taps or tuple(sorted({*spread, layers - 1}))
    bad = next((t for t in taps if not 0 <= t < layers), None)
    if bad is not None:
        raise UserError(f"--taps {bad} is not a layer of the target (0..{layers - 1})")
    heads = own["num_attention_heads"]
    rope = own.get("rope_parameters") or {}
    config = DFlashConfig(
        hidden_size=own["hidden_size"],
        num_hidden_layers=cfg.layers,
        num_attention_heads=heads,
        num_key_value_heads=own.get("num_key_value_heads", heads),
        head_dim=own.get("head_dim") or own["hidden_size"] // heads,
        intermediate_size=cfg.intermediate_size,
        vocab_size=target_embedding_rows(target),
        num_target_layers=layers,
        target_layer_ids=tuple(taps),
        mask_token_id=mask_token(target),
        block_size=cfg.block_size,
        rms_norm_eps=own.get("rms_norm_eps", 1e-6),
        rope_theta=float(rope.get("rope_theta", own.get("rope_theta", 10000.0))),
        max_position_embeddings=own.get("max_position_embeddings", 4096),
        mlxspec={"base_model": target.path.name, "base_model_identity": base_model_identity(target.path)},
    )
    return DFlashDraftModel(config)


def mask_token(target: LoadedModel) -> int:
    """The MASK id: the tokenizer's end-of-text token, which never sits inside a block of running text (a model
    whose vocabulary has room past the tokenizer's would use an unused id; z-lab's use an added <|MASK|>)."""
    eos = getattr(target.tokenizer, "eos_token_id", None)
    return int(eos) if isinstance(eos, int) else 0


def cache_features(
    target: LoadedModel, windows: np.ndarray, taps: tuple[int, ...], log: Callable[[str], None], what: str
) -> tuple[np.ndarray, np.ndarray]:
    """(taps [N, T, n*D], final hidden [N, T, D]) in float16 for every window: one pass of the frozen target."""
    tapped, final = [], []
    last = len(decoder_layers(target.model)) - 1
    norm = final_norm(target.model)
    for i in range(0, len(windows), 8):
        batch = mx.array(windows[i : i + 8])
        # one forward: the taps, and the last layer's output, whose norm is the final hidden state
        features, _ = forward_with_hidden(target.model, batch, None, (*taps, last))
        tapped.append(np.array(features[..., : -features.shape[-1] // (len(taps) + 1)].astype(mx.float16)))
        final.append(np.array(norm(features[..., -features.shape[-1] // (len(taps) + 1) :]).astype(mx.float16)))
        if (i // 8) % 25 == 0 or i + 8 >= len(windows):
            log(f"target features of the {what}: {min(i + 8, len(windows))}/{len(windows)} windows")
    return np.concatenate(tapped), np.concatenate(final)


def block_states(
    model: DFlashDraftModel, target: LoadedModel, windows: mx.array, taps: mx.array, anchors: mx.array
) -> tuple[mx.array, mx.array, mx.array]:
    """Every block at `anchors` [S, A] of `windows` [S, T] in one forward: (states [S*A, L-1, D] of rows 1..L-1,
    which predict positions a+1..a+L-1; [S*A] anchors; [S*A] the window each block is in)."""
    S, A = anchors.shape
    L, T = model.config.block_size, windows.shape[1]
    flat = anchors.reshape(-1)
    rows = mx.repeat(mx.arange(S), A)
    block_tokens = mx.full((S * A, L), model.config.mask_token_id, dtype=mx.int32)
    block_tokens[:, 0] = windows[rows, flat]
    block = text_model(target.model).model.embed_tokens(block_tokens)
    readable = mx.arange(T)[None] < flat[:, None]  # each block reads the context rows before its anchor
    mask = mx.concatenate([readable, mx.ones((S * A, L), dtype=mx.bool_)], axis=1)[:, None, None, :]
    states = model.train_forward(block, taps, flat, mx.broadcast_to(mask, (S * A, 1, L, T + L)))
    return states[:, 1:], flat, rows


def block_loss(
    model: DFlashDraftModel,
    target: LoadedModel,
    windows: mx.array,
    taps: mx.array,
    final: mx.array,
    anchors: mx.array,
    gamma: float,
) -> tuple[mx.array, mx.array]:
    """(KL from the target at each block row, weighted by exp(-(i-1)/gamma); [L-1] top-1 agreement by row)."""
    states, flat, rows = block_states(model, target, windows, taps, anchors)
    L = model.config.block_size
    head = output_head(target.model)
    positions = flat[:, None] + mx.arange(L - 1)[None]  # the target predicts a+i from position a+i-1
    teacher = nn.log_softmax(head(final[rows[:, None], positions]).astype(mx.float32), axis=-1)
    student = nn.log_softmax(head(states).astype(mx.float32), axis=-1)
    kl = (mx.exp(teacher) * (teacher - student)).sum(axis=-1)  # [S*A, L-1]
    weights = mx.exp(-mx.arange(L - 1) / gamma)
    loss = (kl * weights).sum(axis=-1).mean() / weights.sum()
    agree = (mx.argmax(student, axis=-1) == mx.argmax(teacher, axis=-1)).astype(mx.float32).mean(axis=0)
    return loss, agree


def acceptance_by_position(
    model: DFlashDraftModel, target: LoadedModel, windows: np.ndarray, taps: np.ndarray
) -> tuple[list[float], float]:
    """Greedy acceptance on held-out greedy continuations (anchors past the corpus prompt, so the true next tokens
    are the target's argmax): (alpha by block row, the chance row i is accepted when the rows before it were;
    tau, tokens per target call for a chain of block_size - 1)."""
    L = model.config.block_size
    anchors = np.arange(DISTILL_PROMPT, windows.shape[1] - L, 4)
    lengths: list[int] = []
    for i in range(0, len(windows), 4):
        tokens = mx.array(windows[i : i + 4])
        grid = mx.array(np.broadcast_to(anchors, (tokens.shape[0], len(anchors))).copy())
        features = mx.array(taps[i : i + 4]).astype(mx.float32)
        states, flat, rows = block_states(model, target, tokens, features, grid)
        drafted = mx.argmax(output_head(target.model)(states), axis=-1)
        truth = tokens[rows[:, None], flat[:, None] + 1 + mx.arange(L - 1)[None]]
        lengths += np.cumprod(np.array(drafted == truth), axis=1).sum(axis=1).tolist()
    counts = np.array(lengths)
    alpha = [float((counts > i).sum() / max(1, (counts >= i).sum())) for i in range(L - 1)]
    return alpha, float(counts.mean() + 1)


def train_dflash(
    target: LoadedModel, out_dir: Path, cfg: DFlashTrainConfig, log: Callable[[str], None] = print
) -> DFlashDraftModel:
    mx.random.seed(cfg.seed)
    model = new_drafter(target, cfg)
    ckpt = out_dir / "checkpoint"
    state = checkpoint_state(ckpt)
    identity = {"kind": "dflash", **_shape(model)}
    check_checkpoint_identity(state, identity, out_dir)
    stream, heldout = training_streams(target, cfg, out_dir, log)
    windows = _windows(stream, cfg.seq_len)
    held_windows = _windows(heldout, cfg.seq_len)
    if len(windows) < cfg.batch_size:
        raise UserError(f"--seq-len {cfg.seq_len} leaves {len(windows)} training windows; pass a shorter one")
    taps_of = tuple(model.config.target_layer_ids)
    target.model.freeze()
    train_taps, train_final = cache_features(target, windows, taps_of, log, "training data")
    held_taps, _ = cache_features(target, held_windows, taps_of, log, "held-out data")
    optimizer = optim.AdamW(learning_rate=warmup_cosine(cfg.lr, cfg.warmup, cfg.steps), weight_decay=0.0)

    def loss_fn(drafter, tokens, taps, final, anchors):
        return block_loss(drafter, target, tokens, taps, final, anchors, cfg.gamma)

    step_fn = nn.value_and_grad(model, loss_fn)
    high = cfg.seq_len - cfg.block_size  # a block's last row must stay inside its window

    def one_step(rng: np.random.Generator) -> tuple[mx.array, mx.array]:
        picked = rng.integers(0, len(windows), cfg.batch_size)
        anchors = mx.array(rng.integers(1, high + 1, (cfg.batch_size, cfg.anchors)))
        taps = mx.array(train_taps[picked]).astype(mx.float32)
        final = mx.array(train_final[picked]).astype(mx.float32)
        (loss, agree), grads = step_fn(model, mx.array(windows[picked]), taps, final, anchors)
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state, loss, agree)
        return loss, agree

    def describe(agree: mx.array, done: int, elapsed: float) -> str:
        return "top-1 by row " + " ".join(f"{a:.2f}" for a in agree.tolist()) + " "

    train_steps(model, optimizer, cfg, state, identity, (ckpt, WEIGHTS_FILE, out_dir), one_step, describe, log)
    alpha, tau = acceptance_by_position(model, target, held_windows, held_taps)
    log(f"held-out greedy acceptance by block row: {' '.join(f'{a:.3f}' for a in alpha)}; tau {tau:.2f}")
    training = {**asdict(cfg), "seconds": round(state.get("seconds", 0.0))}
    save_dflash(model, out_dir, {"acceptance_by_row": alpha, "tau": tau, "training": training})
    return model


def _shape(model: DFlashDraftModel) -> dict:
    config = model.config
    return {
        "layers": config.num_hidden_layers,
        "block_size": config.block_size,
        "taps": list(config.target_layer_ids),
        "base_model_identity": config.mlxspec["base_model_identity"],
    }


def _windows(stream: np.ndarray, length: int) -> np.ndarray:
    count = len(stream) // length
    return stream[: count * length].reshape(count, length)
