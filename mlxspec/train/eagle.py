"""`mlxspec train-heads --kind eagle`: train an EAGLE head on a frozen target, on its own continuations.

Each step runs the frozen target over a batch of windows for its features f and its distributions p, then the head
`unroll` times: depth 1 reads the true features, depth s reads what depth s-1 predicted (training-time test, as in
EAGLE-3), so the head learns to draft from its own guesses as it must at inference. The loss is the KL divergence
from the target's distribution of the token the head predicts, plus a smooth-L1 pull of the predicted feature
towards the true one (EAGLE's regression term).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from mlxspec.decoding.target_features import forward_with_hidden
from mlxspec.drafting.heads.feature_head import FeatureHead, HeadOnTarget, new_eagle_head, save_head
from mlxspec.drafting.heads.files import (
    check_checkpoint_identity,
    checkpoint_state,
    warmup_cosine,
)
from mlxspec.drafting.lookup.corpus import split_files
from mlxspec.errors import UserError
from mlxspec.loading import LoadedModel
from mlxspec.train.loop import train_steps
from mlxspec.train.medusa import check_lr, check_window, self_distilled_stream, token_stream

MAX_DEPTH = 6  # depths whose held-out agreement the config records


@dataclass
class EagleTrainConfig:
    steps: int = 2000
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 1e-3
    warmup: int = 50
    seed: int = 0
    unroll: int = 3  # depths trained per step (1: teacher forcing only, as EAGLE-1)
    feature_weight: float = 1.0  # weight of the smooth-L1 feature loss beside the KL term
    distill_sequences: int = 1024
    eval_windows: int = 32
    data: str = "self-distill"  # or "corpus"

    def validate(self, context_length: int | None = None) -> None:
        check_lr(self.lr)
        if not 1 <= self.unroll <= MAX_DEPTH:
            raise UserError(f"--unroll {self.unroll} must be 1..{MAX_DEPTH}")
        if self.seq_len < self.unroll + 8:
            raise UserError(f"--seq-len {self.seq_len} is too short to train; use at least {self.unroll + 8}")
        check_window(self.seq_len, self.data, context_length)


def unrolled_mask(length: int, depths: int) -> mx.array:
    """[depths*length, depths*length] bool: which keys each query of an unrolled head pass may read.

    Rows and keys are depth-major: depth s (1-based) row t is the head at position t on its s-th draft step.
    Depth 1 row t reads depth-1 keys j <= t (the true context). Depth s row t extends the true context up to
    t-s+1 with its own chain: depth r's key at position t-s+r for r = 2..s, exactly what its cache would hold.
    """
    t = mx.arange(length)[:, None]
    j = mx.arange(length)[None, :]
    rows = []
    for s in range(1, depths + 1):
        blocks = [j <= t - s + 1]
        for r in range(2, depths + 1):
            blocks.append((j == t - s + r) if r <= s else mx.zeros((length, length), dtype=mx.bool_))
        rows.append(mx.concatenate(blocks, axis=1))
    return mx.concatenate(rows, axis=0)


def unrolled_logits(
    wired: HeadOnTarget, tokens: mx.array, features: mx.array, depths: int
) -> tuple[mx.array, mx.array]:
    """tokens [B, T] (x_{t+1} at row t), features [B, T, D] (f_t) -> (logits [S, B, T, V], normed outputs
    [S, B, T, D]) of depths 1..S. Depth s reads depth s-1's prediction of f_t (its row t-1), so depths run in turn,
    each over the keys of all depths so far; every depth's row t sits at position t (cache offset 0)."""
    length = features.shape[1]
    mask = unrolled_mask(length, depths)
    embeds = wired.embed(tokens)
    cache = _UnrollCache()
    feats, logits, normed_outs = features, [], []
    for s in range(depths):
        cache.mask = mask[s * length : (s + 1) * length, : (s + 1) * length]
        out = wired.head(embeds, feats, cache.mask, cache)
        normed = wired.norm(out)
        logits.append(wired.lm_head(normed))
        normed_outs.append(normed)
        produced = normed if wired.head.config.feed_normed else out
        feats = mx.concatenate([features[:, :1], produced[:, :-1]], axis=1)
    return mx.stack(logits), mx.stack(normed_outs)


class _UnrollCache:
    """Keys and values of every depth so far, for the unrolled training pass (attention reads what `mask` allows)."""

    def __init__(self):
        self.keys = self.values = None
        self.offset = 0  # every depth's rows are rotated from position 0: row t is position t at each depth
        self.mask = None

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            self.keys = mx.concatenate([self.keys, keys], axis=2)
            self.values = mx.concatenate([self.values, values], axis=2)
        return self.keys, self.values

    def make_mask(self, *args, **kwargs):
        return self.mask

    @property
    def state(self):
        return self.keys, self.values


def head_loss(
    wired: HeadOnTarget, tokens: mx.array, features: mx.array, target_logits: mx.array, cfg: EagleTrainConfig
) -> tuple[mx.array, mx.array]:
    """(loss [], per-depth KL [S]) on windows tokens [B, T] with the target's features and logits at each row.

    Row t of the head reads x_{t+1} and f_t and predicts f_{t+1} and the target's distribution at t+1."""
    logits, normed = unrolled_logits(wired, tokens[:, 1:], features[:, :-1], cfg.unroll)
    logits, normed = logits[:, :, :-1], normed[:, :, :-1]  # the last row has no next feature to compare with
    want = mx.softmax(target_logits[:, 1:-1].astype(mx.float32), axis=-1)
    kl = (want * (mx.log(want + 1e-9) - nn.log_softmax(logits, axis=-1))).sum(-1).mean(axis=(1, 2))  # [S]
    pull = nn.losses.smooth_l1_loss(normed, mx.broadcast_to(features[:, 1:-1], normed.shape), reduction="none")
    pull = pull.mean(axis=(1, 2, 3))
    weights = mx.array([0.8**s for s in range(cfg.unroll)])
    return ((kl + cfg.feature_weight * pull) * weights).sum() / weights.sum(), kl


def depth_agreement(wired: HeadOnTarget, target: LoadedModel, windows: list[np.ndarray], start: int) -> list[float]:
    """[depth 1..6] greedy acceptance per depth, teacher-forced: on windows whose tokens from `start` on are the
    target's own greedy continuation, how often the head's s-th chained draft equals the target's token, given that
    the s-1 before it were right (so their tokens are the window's), drafting from the head's own features."""
    hits, counts = np.zeros(MAX_DEPTH), np.zeros(MAX_DEPTH)
    for window in windows:
        x = mx.array(window)[None]
        hidden, logits = forward_with_hidden(target.model, x, None)
        draft_logits, _ = unrolled_logits(wired, x[:, 1:], hidden[:, :-1], MAX_DEPTH)
        drafted = np.array(mx.argmax(draft_logits[:, 0], axis=-1))  # [S, T-1]: depth s+1 at row t guesses x_{t+2}
        greedy = np.array(mx.argmax(logits[0], axis=-1))  # [T]: the target's token after each position
        for s in range(MAX_DEPTH):
            # The chain ending at row t started at row t-s; its input tokens x_{t-s+1..t+1} must be greedy ones.
            rows = np.arange(max(start + s, s), len(window) - 1)
            hits[s] += (drafted[s, rows] == greedy[rows + 1]).sum()
            counts[s] += len(rows)
    return (hits / np.maximum(counts, 1)).tolist()


def distilled_stream(
    target: LoadedModel,
    stream: np.ndarray,
    cfg: EagleTrainConfig,
    sequences: int,
    seed: int,
    cached: Path,
    log: Callable[[str], None],
    label: str,
    temperature: float = 0.0,
    openings: tuple[list[int], ...] = (),
) -> np.ndarray:
    """The target's continuations (greedy, or sampled at `temperature`) of `sequences` prompts (`openings` first,
    then corpus windows), cached in `cached` (resumable runs reuse it)."""
    if cached.exists():
        return np.load(cached)
    from mlxspec.train.medusa import MedusaTrainConfig

    settings = MedusaTrainConfig(seq_len=cfg.seq_len, seed=seed, distill_sequences=sequences)
    data = self_distilled_stream(target, stream, settings, log, label, temperature, openings)
    np.save(cached, data)
    return data


def training_streams(
    target: LoadedModel, cfg, out_dir: Path, log: Callable[[str], None]
) -> tuple[np.ndarray, np.ndarray]:
    """(training tokens, held-out tokens) for a head trainer (EAGLE, DFlash): the stdlib's training files, or with
    cfg.data "self-distill" the target's continuations of them; the held-out files always self-distilled. Both
    cached in out_dir, so a resumed run reuses them."""
    train_files, heldout_files = split_files()
    out_dir.mkdir(parents=True, exist_ok=True)
    stream = token_stream(train_files, target.tokenizer)
    if cfg.data == "self-distill":
        distilled = out_dir / "distilled.npy"
        sequences = cfg.distill_sequences
        stream = distilled_stream(target, stream, cfg, sequences, cfg.seed + 1, distilled, log, "training data")
    heldout_stream = token_stream(heldout_files, target.tokenizer)
    heldout = distilled_stream(
        target, heldout_stream, cfg, cfg.eval_windows, 7, out_dir / "heldout.npy", log, "held-out data"
    )
    return stream, heldout


def train_eagle(
    target: LoadedModel, out_dir: Path, cfg: EagleTrainConfig, log: Callable[[str], None] = print
) -> FeatureHead:
    mx.random.seed(cfg.seed)
    head = new_eagle_head(target.config, target.path)
    ckpt = out_dir / "checkpoint"
    state = checkpoint_state(ckpt)
    check_checkpoint_identity(state, _identity(head), out_dir)
    stream, heldout = training_streams(target, cfg, out_dir, log)
    if len(stream) <= cfg.seq_len:
        raise UserError(f"--seq-len {cfg.seq_len} is longer than the whole training text ({len(stream)} tokens)")
    target.model.freeze()
    wired = HeadOnTarget(head, target.model)
    optimizer = optim.AdamW(learning_rate=warmup_cosine(cfg.lr, cfg.warmup, cfg.steps), weight_decay=0.0)

    def loss_fn(model, tokens, features, target_logits):
        return head_loss(wired, tokens, features, target_logits, cfg)

    step_fn = nn.value_and_grad(head, loss_fn)

    def one_step(rng: np.random.Generator) -> tuple[mx.array, mx.array]:
        starts = rng.integers(0, len(stream) - cfg.seq_len, cfg.batch_size)
        tokens = mx.array(np.stack([stream[s : s + cfg.seq_len] for s in starts]))
        features, target_logits = forward_with_hidden(target.model, tokens, None)
        features, target_logits = mx.stop_gradient(features), mx.stop_gradient(target_logits)
        (loss, kl), grads = step_fn(head, tokens, features, target_logits)
        optimizer.update(head, grads)
        mx.eval(head.parameters(), optimizer.state, loss, kl)
        return loss, kl

    def describe(kl: mx.array, done: int, elapsed: float) -> str:
        kls = " ".join(f"{v:.3f}" for v in kl.tolist())
        return f"KL/depth {kls} {done * cfg.batch_size * cfg.seq_len / elapsed:,.0f} tok/s, "

    def agreement_now_and_then(state: dict) -> None:
        if state["step"] % 500 == 0 and state["step"] < cfg.steps:  # the last step's is measured once, below
            log_agreement(wired, target, heldout, cfg, state, out_dir, log)

    checkpoint = (ckpt, "head.safetensors", out_dir)
    train_steps(
        head, optimizer, cfg, state, _identity(head), checkpoint, one_step, describe, log, agreement_now_and_then
    )
    head.config.acceptance = log_agreement(wired, target, heldout, cfg, state, out_dir, log)
    head.config.training = {**asdict(cfg), "seconds": round(state.get("seconds", 0.0))}
    save_head(head, out_dir)
    return head


def log_agreement(
    wired: HeadOnTarget,
    target: LoadedModel,
    heldout: np.ndarray,
    cfg: EagleTrainConfig,
    state: dict,
    out_dir: Path,
    log: Callable[[str], None],
) -> list[float]:
    """The head's held-out greedy acceptance by depth: logged, and appended to curve.jsonl."""
    agreement = depth_agreement(wired, target, _windows(heldout, cfg.seq_len), start=64)
    by_depth = " ".join(f"{a:.3f}" for a in agreement)
    log(f"held-out greedy acceptance by depth 1..{MAX_DEPTH} at step {state['step']}: {by_depth}")
    with open(out_dir / "curve.jsonl", "a") as f:
        f.write(json.dumps({"step": state["step"], "seconds": state["seconds"], "acceptance": agreement}) + "\n")
    return agreement


def _windows(stream: np.ndarray, length: int) -> list[np.ndarray]:
    return [stream[i : i + length] for i in range(0, len(stream) - length + 1, length)]


def _identity(head: FeatureHead) -> dict:
    return {"kind": "eagle", "base_model_identity": head.config.base_model_identity}
