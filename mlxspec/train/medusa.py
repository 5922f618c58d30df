"""`mlxspec train-medusa`: train Medusa heads on a frozen target, on corpus text or the target's own continuations."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from mlxspec.decoding.target_features import output_head
from mlxspec.drafting.heads.files import (
    base_model_identity,
    checkpoint_state,
    resume_checkpoint,
    save_checkpoint,
    warmup_cosine,
)
from mlxspec.drafting.heads.medusa import CONFIG_FILE, MedusaConfig, MedusaHeads, save_medusa
from mlxspec.drafting.lookup.corpus import read_text, split_files
from mlxspec.errors import UserError
from mlxspec.loading import LoadedModel

DISTILL_PROMPT = 64  # corpus tokens each self-distilled sequence starts from; the target continues them
HEAD_DECAY = 0.8  # later heads are harder; weight their loss less, as Medusa does


@dataclass
class MedusaTrainConfig:
    num_heads: int = 4
    steps: int = 400
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 1e-3
    warmup: int = 20
    seed: int = 0
    data: str = "corpus"  # or "self-distill"
    distill_sequences: int = 512
    eval_windows: int = 64
    shared_lm_head: bool = True

    def validate(self, context_length: int | None = None) -> None:
        """Refuse values that would crash or waste a run (a 100000-token window asks for hundreds of GB)."""
        check_lr(self.lr)
        check_room_for_heads(self.seq_len, self.num_heads)
        check_window(self.seq_len, self.data, context_length)


def check_room_for_heads(seq_len: int, num_heads: int) -> None:
    """Medusa and Hydra heads: a window must hold a target for the deepest head."""
    if seq_len < num_heads + 2:
        raise UserError(f"--seq-len {seq_len} leaves no targets for {num_heads} heads; use at least {num_heads + 2}")


def check_lr(lr: float) -> None:
    """Every trainer's learning rate: a finite number above 0."""
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise UserError(f"--lr {lr} must be a finite number above 0; 1e-3 is a good start")


def check_window(seq_len: int, data: str, context_length: int | None) -> None:
    """Every trainer's window: inside the model's context, with room for self-distillation's continuation."""
    if context_length is not None and seq_len > context_length:
        raise UserError(f"--seq-len {seq_len} is past the model's context of {context_length}; use at most that")
    check_distill_length(data, seq_len)


def check_distill_length(data: str, seq_len: int) -> None:
    """Self-distillation continues a DISTILL_PROMPT-token corpus prompt to seq_len tokens: there must be room."""
    if data == "self-distill" and seq_len <= DISTILL_PROMPT:
        raise UserError(
            f"--seq-len {seq_len} leaves no room for the target's continuation after its {DISTILL_PROMPT}-token "
            f"prompt (--data self-distill); use at least {DISTILL_PROMPT + 1}, or --data corpus"
        )


def prepare_out_dir(out_dir: str | Path, config_file: str = CONFIG_FILE, model_dir: Path | None = None) -> None:
    """Make --out, refusing an empty name, a file, the model's own directory (heads written there would change the
    model's fingerprint), an unwritable place, or finished heads that training would overwrite."""
    if not str(out_dir).strip():
        raise UserError(f"--out '{out_dir}' names no directory; pass one for the heads (it is created if missing)")
    out_dir = Path(out_dir)
    if model_dir is not None and out_dir.resolve().is_relative_to(model_dir.resolve()):
        raise UserError(
            f"--out '{out_dir}' is inside the model directory '{model_dir}'; heads written there would change the "
            "model itself: pass a directory of their own"
        )
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out '{out_dir}' is a file; pass a directory (it is created if missing)")
    if (out_dir / config_file).exists() and not (out_dir / "checkpoint" / "state.json").exists():
        raise UserError(f"--out '{out_dir}' already holds trained heads; pass a new directory or remove them first")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".mlxspec-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"cannot write to --out '{out_dir}': {exc.strerror}") from None


def check_resume(state: dict, config: MedusaConfig, out_dir: Path) -> None:
    """A checkpoint resumes only the run it came from: same heads, LM-head layout and base model."""
    for key, want in (
        ("num_heads", config.num_heads),
        ("shared_lm_head", config.shared_lm_head),
        ("base_model_identity", config.base_model_identity),
    ):
        if key in state and state[key] != want:
            what = "another base model" if key == "base_model_identity" else f"{key} {state[key]}"
            raise UserError(
                f"the checkpoint in '{out_dir}' was made with {what}, not this run's; "
                "pass a new --out or the settings it was made with"
            )


def token_stream(files: list[Path], tokenizer) -> np.ndarray:
    ids: list[int] = []
    for path in files:
        text = read_text(path)
        if text:
            ids += tokenizer.encode(text) + [tokenizer.eos_token_id]
    return np.asarray(ids, dtype=np.int32)


def self_distilled_stream(
    target: LoadedModel,
    stream: np.ndarray,
    cfg: MedusaTrainConfig,
    log: Callable[[str], None],
    label: str = "training data",
    temperature: float = 0.0,
    openings: tuple[list[int], ...] = (),
) -> np.ndarray:
    """The target's own continuations of corpus prompts (greedy, or sampled at `temperature`): what its heads
    will be asked to predict. `openings`: whole prompts that come first; random corpus windows fill the rest.

    Generated in batches with mlx-lm's batch_generate, which amortizes the per-call cost many sequences share.
    """
    from mlx_lm.generate import batch_generate
    from mlx_lm.sample_utils import make_sampler

    sampling = {}
    if temperature > 0:
        sampling["sampler"] = make_sampler(temperature)
        mx.random.seed(cfg.seed + 2)  # sampled data are reproducible too

    rng = np.random.default_rng(cfg.seed + 1)
    prompt_len, gen_len = DISTILL_PROMPT, cfg.seq_len - DISTILL_PROMPT
    starts = rng.integers(0, len(stream) - prompt_len, max(0, cfg.distill_sequences - len(openings)))
    prompts = [list(p) for p in openings] + [stream[s : s + prompt_len].tolist() for s in starts]
    pieces = []
    for i in range(0, len(prompts), 64):
        batch = prompts[i : i + 64]
        result = batch_generate(
            target.model, target.tokenizer, batch, max_tokens=gen_len, return_token_ids=True, **sampling
        )
        pieces += [np.asarray(p + out, dtype=np.int32) for p, out in zip(batch, result.token_ids)]
        log(f"self-distilling the {label}: {min(i + 64, len(prompts))}/{len(prompts)} sequences")
    return np.concatenate(pieces)


def head_losses(heads: MedusaHeads, hidden: mx.array, tokens: mx.array, base_head) -> mx.array:
    """Cross-entropy of each head; head i (1-based) predicts tokens[t + i + 1] from hidden[t]. -> [H]"""
    logits = heads(hidden, base_head)  # [H, B, T, V]
    losses = []
    for i in range(heads.config.num_heads):
        shift = i + 2
        losses.append(nn.losses.cross_entropy(logits[i][:, :-shift], tokens[:, shift:], reduction="mean"))
    return mx.stack(losses)


def topk_accuracy(heads: MedusaHeads, target: LoadedModel, windows: list[np.ndarray], max_rank: int = 8):
    """[head][rank]: how often the head's rank-r token is the true token, over held-out windows."""
    base_head = output_head(target.model)
    hits = np.zeros((heads.config.num_heads, max_rank))
    counts = np.zeros(heads.config.num_heads)
    for window in windows:
        x = mx.array(window)[None]
        logits = heads(target.model.model(x), base_head)[:, 0]  # [H, T, V]
        order = mx.argsort(-logits, axis=-1)[..., :max_rank]
        mx.eval(order)
        order = np.array(order)
        for i in range(heads.config.num_heads):
            shift = i + 2
            labels = window[shift:]
            hits[i] += (order[i, : len(window) - shift] == labels[:, None]).sum(axis=0)
            counts[i] += len(labels)
    return (hits / counts[:, None]).tolist()


def train_medusa(
    target: LoadedModel, out_dir: Path, cfg: MedusaTrainConfig, log: Callable[[str], None] = print
) -> MedusaHeads:
    mx.random.seed(cfg.seed)
    config = MedusaConfig(
        cfg.num_heads,
        target.config["hidden_size"],
        target.config["vocab_size"],
        cfg.shared_lm_head,
        target.path.name,
        base_model_identity(target.path),
        data=cfg.data,
    )
    ckpt = out_dir / "checkpoint"
    state = checkpoint_state(ckpt)
    check_resume(state, config, out_dir)  # before minutes of tokenizing, not after
    train_files, heldout_files = split_files()
    stream = token_stream(train_files, target.tokenizer)
    if cfg.data == "self-distill":
        cached = out_dir / "distilled.npy"
        if cached.exists():
            stream = np.load(cached)
        else:
            stream = self_distilled_stream(target, stream, cfg, log)
            out_dir.mkdir(parents=True, exist_ok=True)
            np.save(cached, stream)
    heldout = token_stream(heldout_files, target.tokenizer)
    heads = MedusaHeads(config)
    target.model.freeze()
    base_head = output_head(target.model)
    optimizer = optim.AdamW(learning_rate=warmup_cosine(cfg.lr, cfg.warmup, cfg.steps), weight_decay=0.0)
    weights = mx.array([HEAD_DECAY**i for i in range(cfg.num_heads)])

    def loss_fn(model, hidden, tokens):
        return (head_losses(model, hidden, tokens, base_head) * weights).sum() / weights.sum()

    step_fn = nn.value_and_grad(heads, loss_fn)
    if state["step"]:
        resume_checkpoint(heads, optimizer, ckpt, "heads.safetensors", out_dir)
        log(f"resumed at step {state['step']}")
    state.update(
        num_heads=config.num_heads, shared_lm_head=config.shared_lm_head, base_model_identity=config.base_model_identity
    )
    if len(stream) <= cfg.seq_len:
        raise UserError(f"--seq-len {cfg.seq_len} is longer than the whole training text ({len(stream)} tokens)")
    rng = np.random.default_rng(cfg.seed + state["step"])
    start, first_step = time.perf_counter(), state["step"]
    while state["step"] < cfg.steps:
        starts = rng.integers(0, len(stream) - cfg.seq_len, cfg.batch_size)
        tokens = mx.array(np.stack([stream[s : s + cfg.seq_len] for s in starts]))
        hidden = mx.stop_gradient(target.model.model(tokens))
        loss, grads = step_fn(heads, hidden, tokens)
        optimizer.update(heads, grads)
        mx.eval(heads.parameters(), optimizer.state, loss)
        if not math.isfinite(loss.item()):
            raise UserError(
                f"the loss became {loss.item()} at step {state['step'] + 1}; nothing was saved past the last "
                "checkpoint: lower --lr"
            )
        state["step"] += 1
        elapsed = time.perf_counter() - start
        done = state["step"] - first_step  # this session's steps: a resumed run's rate counts only them
        rate = done * cfg.batch_size * cfg.seq_len / elapsed
        eta = (cfg.steps - state["step"]) * elapsed / done
        log(f"step {state['step']}/{cfg.steps} loss {loss.item():.3f} {rate:,.0f} tok/s, ETA {eta:.0f} s")
        if state["step"] % 50 == 0 or state["step"] == cfg.steps:
            save_checkpoint(heads, optimizer, ckpt, "heads.safetensors", state)
    windows = [heldout[i : i + cfg.seq_len] for i in range(0, len(heldout) - cfg.seq_len, cfg.seq_len)]
    rng_eval = np.random.default_rng(cfg.seed)
    picked = [windows[i] for i in sorted(rng_eval.choice(len(windows), min(cfg.eval_windows, len(windows)), False))]
    heads.config.topk_accuracy = topk_accuracy(heads, target, picked)
    save_medusa(heads, out_dir)
    for i, acc in enumerate(heads.config.topk_accuracy):
        log(f"head {i + 1} (token t+{i + 2}): top-1 {acc[0]:.3f}  top-5 {sum(acc[:5]):.3f}")
    return heads
