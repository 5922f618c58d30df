"""`mlxspec train-heads --kind eagle3`: an EAGLE-3 head for a frozen target, written in SafeAILab's format.

As EAGLE-3 trains it: three target taps (low, middle, high) joined by `fc`; the training-time test, depth s reading
depth s-1's own output (train/eagle.py's unrolled mask); no feature regression, only the KL divergence to the
target's distribution over a reduced draft vocabulary, the `draft_vocab` most frequent tokens of the training data.
The data are the target's own continuations, greedy and, for `sampled_share` of them, sampled at T=0.7: the
shipped EAGLE head only tied the draft model at T=0.7, and depth-1 acceptance under sampling is what limits it.
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

from mlxspec.decoding.target_features import forward_with_hidden, text_model
from mlxspec.drafting.eagle3.files import default_aux_layers, save_eagle3
from mlxspec.drafting.eagle3.model import Eagle3Config, Eagle3Head
from mlxspec.drafting.heads.files import (
    base_model_identity,
    check_checkpoint_identity,
    checkpoint_state,
    warmup_cosine,
)
from mlxspec.errors import UserError
from mlxspec.loading import LoadedModel
from mlxspec.model_files import text_config
from mlxspec.train.eagle import MAX_DEPTH, EagleTrainConfig, _UnrollCache, _windows, distilled_stream, unrolled_mask
from mlxspec.train.loop import train_steps
from mlxspec.train.medusa import token_stream

SAMPLED_TEMPERATURE = 0.7


@dataclass
class Eagle3TrainConfig(EagleTrainConfig):
    draft_vocab: int = 0  # 0: a quarter of the target's vocabulary
    sampled_share: float = 0.5  # of the self-distilled sequences, this share sampled at T=0.7
    feature_weight: float = 0.0  # EAGLE-3 has no feature regression
    english_share: float = 0.0  # of the self-distilled sequences, this share continues English prompts
    target_rows: bool = False  # the output layer: the target's own rows of the draft vocabulary (FR-Spec), frozen

    def validate(self, context_length: int | None = None) -> None:
        super().validate(context_length)
        if not 0.0 <= self.sampled_share <= 1.0:
            raise UserError(f"--sampled-share {self.sampled_share} must be between 0 and 1")
        if not 0.0 <= self.english_share <= 1.0:
            raise UserError(f"--english-share {self.english_share} must be between 0 and 1")


def aux_layers_for(num_layers: int) -> tuple[int, ...]:
    """The layers whose inputs are tapped: EAGLE's rule (2, L//2, L-3), or, where it collides on a small target,
    low, middle and high spread over layers 1..L-1."""
    if num_layers < 4:
        raise UserError(f"EAGLE-3 taps the inputs of three layers 1..L-1; a target of {num_layers} layers has too few")
    rule = default_aux_layers(num_layers)
    if len(set(rule)) == 3:
        return rule
    return 1, num_layers // 2, num_layers - 1


def draft_vocabulary(streams: list[np.ndarray], vocab: int, size: int) -> np.ndarray:
    """The `size` most frequent token ids, ascending (ties: the lower id), each stream weighing the same whatever
    its length: the self-distilled data, and the corpora they were prompted from. A few hundred thousand tokens of
    training data name only a few thousand distinct tokens; the corpora (the stdlib's 3M tokens, the reference's
    prose) fill a 32k hot vocabulary with what text of each kind uses, as FR-Spec ranks by corpus frequency."""
    share = np.zeros(vocab)
    for stream in streams:
        if len(stream):
            share += np.bincount(stream, minlength=vocab)[:vocab] / len(stream)
    order = np.lexsort((np.arange(vocab), -share))
    return np.sort(order[:size])


def new_eagle3_head(target: LoadedModel, draft_ids: np.ndarray, target_rows: bool = False) -> Eagle3Head:
    own = text_config(target.config)
    hidden, heads = int(own["hidden_size"]), int(own["num_attention_heads"])
    config = Eagle3Config(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=int(own.get("num_key_value_heads") or heads),
        head_dim=hidden // heads,  # SafeAILab's rule, so their loader reads ours
        intermediate_size=int(own["intermediate_size"]),
        vocab_size=int(own["vocab_size"]),
        draft_vocab_size=len(draft_ids),
        rms_norm_eps=float(own.get("rms_norm_eps", 1e-6)),
        rope_theta=float(own.get("rope_theta") or (own.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
        max_position_embeddings=int(own.get("max_position_embeddings") or 4096),
        aux_layer_ids=aux_layers_for(int(own["num_hidden_layers"])),
        # Each tap RMS-normed before fc (the speculators variant): Gemma's residual stream grows from RMS 37 at
        # layer 2 to 641 at layer 15 (peaks of 86k), and raw taps that size drown what the layer adds.
        fc_norm=True,
        base_model=target.path.name,
        mlxspec={
            "base_model_identity": base_model_identity(target.path),
            **({"lm_head": "target"} if target_rows else {}),
        },
    )
    head = Eagle3Head(config)
    ids = mx.array(draft_ids, dtype=mx.int32)
    head.set_vocabulary_map(ids - mx.arange(ids.shape[0], dtype=mx.int32))
    if target_rows:
        head.borrow_output_rows(target.model)
    return head


def unrolled(head: Eagle3Head, embed, tokens: mx.array, taps: mx.array, depths: int) -> mx.array:
    """tokens [B, T] (x_{t+1} at row t), taps [B, T, 3F] (of position t) -> draft-vocabulary logits [S, B, T, Vd]
    of depths 1..S, depth s reading depth s-1's output as its feature (training-time test)."""
    length = taps.shape[1]
    mask = unrolled_mask(length, depths)
    embeds = embed(tokens)
    first = head.project_taps(taps)
    cache, feats, logits = _UnrollCache(), first, []
    for s in range(depths):
        cache.mask = mask[s * length : (s + 1) * length, : (s + 1) * length]
        out = head.midlayer(embeds, feats, cache.mask, cache)
        normed = head.norm(out)
        logits.append(head.lm_head(normed))
        produced = normed if head.config.norm_output else out
        feats = mx.concatenate([first[:, :1], produced[:, :-1]], axis=1)
    return mx.stack(logits)


def eagle3_loss(
    head: Eagle3Head, embed, tokens: mx.array, taps: mx.array, draft_logits: mx.array, depths: int
) -> tuple[mx.array, mx.array]:
    """(loss, KL per depth [S]): the KL divergence from the target's distribution restricted to the draft
    vocabulary (`draft_logits`: the target's logits of the draft tokens, renormalized there as speculators trains)
    at every depth, depth s weighted 0.8^s."""
    logits = unrolled(head, embed, tokens[:, 1:], taps[:, :-1], depths)[:, :, :-1]
    want = mx.softmax(draft_logits[:, 1:-1].astype(mx.float32), axis=-1)
    kl = (want * (mx.log(want + 1e-9) - nn.log_softmax(logits, axis=-1))).sum(-1).mean(axis=(1, 2))
    weights = mx.array([0.8**s for s in range(depths)])
    return (kl * weights).sum() / weights.sum(), kl


def depth_agreement(head: Eagle3Head, embed, target: LoadedModel, windows: list[np.ndarray], start: int) -> list[float]:
    """[depth 1..6] teacher-forced greedy acceptance on held-out greedy continuations (as train/eagle.py measures
    the EAGLE head), the draft's choice mapped to target ids."""
    hits, counts = np.zeros(MAX_DEPTH), np.zeros(MAX_DEPTH)
    ids = np.array(head.draft_to_target)
    for window in windows:
        x = mx.array(window)[None]
        taps, logits = forward_with_hidden(target.model, x, None, head.config.target_taps)
        drafted = ids[np.array(mx.argmax(unrolled(head, embed, x[:, 1:], taps[:, :-1], MAX_DEPTH)[:, 0], axis=-1))]
        greedy = np.array(mx.argmax(logits[0], axis=-1))
        for s in range(MAX_DEPTH):
            rows = np.arange(max(start + s, s), len(window) - 1)
            hits[s] += (drafted[s, rows] == greedy[rows + 1]).sum()
            counts[s] += len(rows)
    return (hits / np.maximum(counts, 1)).tolist()


def eagle3_streams(target: LoadedModel, cfg: Eagle3TrainConfig, out_dir: Path, log: Callable[[str], None]):
    """(training tokens: greedy and sampled continuations of code and, for `english_share` of them, English
    prompts; held-out greedy continuations of held-out code; the corpora prompted from), the continuations cached
    in out_dir."""
    from mlxspec.drafting.lookup.corpus import split_files

    train_files, heldout_files = split_files()
    out_dir.mkdir(parents=True, exist_ok=True)
    corpora = {"code": (token_stream(train_files, target.tokenizer), ())}
    if cfg.english_share > 0:
        from mlxspec.train.english import OPENINGS, english_stream

        openings = tuple(target.tokenizer.encode(text) for text in OPENINGS)
        corpora["english"] = (english_stream(target.tokenizer), openings)
    sampled = round(cfg.distill_sequences * cfg.sampled_share)
    parts = []
    for kind, count, seed, temperature in (
        ("greedy", cfg.distill_sequences - sampled, 1, 0.0),
        ("sampled", sampled, 2, SAMPLED_TEMPERATURE),
    ):
        english = round(count * cfg.english_share) if "english" in corpora else 0
        for name, share, offset in (("code", count - english, 0), ("english", english, 2)):
            if share == 0:
                continue
            stream, openings = corpora[name]
            label = f"training data ({name}, {kind}{f' at T={temperature}' if temperature else ''})"
            cached = out_dir / (f"{kind}.npy" if name == "code" else f"{name}-{kind}.npy")
            parts.append(
                distilled_stream(
                    target,
                    stream,
                    cfg,
                    share,
                    cfg.seed + seed + offset,
                    cached,
                    log,
                    label,
                    temperature,
                    openings[:share],
                )
            )
    heldout = distilled_stream(
        target,
        token_stream(heldout_files, target.tokenizer),
        cfg,
        cfg.eval_windows,
        7,
        out_dir / "heldout.npy",
        log,
        "held-out data",
    )
    return np.concatenate(parts), heldout, [stream for stream, _ in corpora.values()]


class TargetFeatures:
    """The frozen target's taps and final hidden state for every training window, computed once (float32: Gemma's
    residual stream overflows float16; cached in out_dir), so that a training step costs the head alone: the
    target's logits of the draft vocabulary are the final hidden state times its output rows (a 262k-token output
    layer is most of a small target's forward)."""

    def __init__(self, target: LoadedModel, windows: np.ndarray, taps: tuple[int, ...], out_dir: Path, log) -> None:
        from mlxspec.decoding.target_features import final_norm

        cached = out_dir / "features.npz"
        if cached.exists():
            saved = np.load(cached)
            if saved["taps"].shape[:2] == windows.shape:
                self.taps, self.final = saved["taps"], saved["final"]
                return
        last = int(text_config(target.config)["num_hidden_layers"]) - 1
        norm, taps_out, finals = final_norm(target.model), [], []
        for i in range(0, len(windows), 8):
            rows, _ = forward_with_hidden(target.model, mx.array(windows[i : i + 8]), None, (*taps, last))
            width = rows.shape[-1] // (len(taps) + 1)
            tapped, final = rows[..., : len(taps) * width], norm(rows[..., len(taps) * width :])
            mx.eval(tapped, final)
            taps_out.append(np.array(tapped.astype(mx.float32)))
            finals.append(np.array(final.astype(mx.float32)))
            log(f"target features: {min(i + 8, len(windows))}/{len(windows)} windows")
        self.taps, self.final = np.concatenate(taps_out), np.concatenate(finals)
        np.savez(cached, taps=self.taps, final=self.final)


def draft_vocabulary_logits(final: mx.array, rows: mx.array, cap: float | None) -> mx.array:
    """The target's logits of the draft vocabulary from its final hidden state and the rows of its output layer."""
    logits = final.astype(rows.dtype) @ rows.T
    return mx.tanh(logits / cap) * cap if cap else logits


def train_eagle3(
    target: LoadedModel, out_dir: Path, cfg: Eagle3TrainConfig, log: Callable[[str], None] = print
) -> Eagle3Head:
    from mlxspec.decoding.target_features import output_cap, output_rows

    mx.random.seed(cfg.seed)
    stream, heldout, corpora = eagle3_streams(target, cfg, out_dir, log)
    if len(stream) <= cfg.seq_len:
        raise UserError(f"--seq-len {cfg.seq_len} is longer than the whole training text ({len(stream)} tokens)")
    vocab = int(text_config(target.config)["vocab_size"])
    size = min(vocab, cfg.draft_vocab or max(1, vocab // 4))
    head = new_eagle3_head(target, draft_vocabulary([stream, *corpora], vocab, size), cfg.target_rows)
    identity = {"kind": "eagle3", "base_model_identity": head.config.mlxspec["base_model_identity"], "vocab": size}
    identity["target_rows"] = cfg.target_rows
    ckpt = out_dir / "checkpoint"
    state = checkpoint_state(ckpt)
    check_checkpoint_identity(state, identity, out_dir)
    target.model.freeze()
    embed = text_model(target.model).model.embed_tokens
    windows = np.stack(_windows(stream, cfg.seq_len))
    features = TargetFeatures(target, windows, head.config.target_taps, out_dir, log)
    rows, cap = output_rows(target.model, head.draft_to_target), output_cap(target.model)
    optimizer = optim.AdamW(learning_rate=warmup_cosine(cfg.lr, cfg.warmup, cfg.steps), weight_decay=0.0)
    step_fn = nn.value_and_grad(head, lambda model, *a: eagle3_loss(model, embed, *a, cfg.unroll))

    def one_step(rng: np.random.Generator) -> tuple[mx.array, mx.array]:
        picked = np.sort(rng.choice(len(windows), min(cfg.batch_size, len(windows)), replace=False))
        tokens = mx.array(windows[picked])
        taps = mx.array(features.taps[picked]).astype(rows.dtype)
        draft_logits = draft_vocabulary_logits(mx.array(features.final[picked]), rows, cap)
        (loss, kl), grads = step_fn(head, tokens, taps, draft_logits)
        optimizer.update(head, grads)
        mx.eval(head.parameters(), optimizer.state, loss, kl)
        return loss, kl

    def describe(kl: mx.array, done: int, elapsed: float) -> str:
        return "KL/depth " + " ".join(f"{v:.3f}" for v in kl.tolist()) + ", "

    train_steps(head, optimizer, cfg, state, identity, (ckpt, "head.safetensors", out_dir), one_step, describe, log)
    acceptance = depth_agreement(head, embed, target, _windows(heldout, cfg.seq_len), start=64)
    log(f"held-out greedy acceptance by depth 1..{MAX_DEPTH}: " + " ".join(f"{a:.3f}" for a in acceptance))
    head.config.mlxspec.update(
        acceptance=acceptance, training={**asdict(cfg), "seconds": round(state.get("seconds", 0.0))}
    )
    save_eagle3(head, out_dir)
    (out_dir / "curve.jsonl").open("a").write(json.dumps({"step": state["step"], "acceptance": acceptance}) + "\n")
    return head
