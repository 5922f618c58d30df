"""Train one model of the embedded family (HF LlamaForCausalLM, PyTorch on CPU) on the stdlib corpus.

Dev-only: needs `pip install -e ".[train]"` (torch==2.13.0, transformers). The runtime never imports torch.

    python models/recipes/train_base.py target --minutes 55        # resumes from runs/target/ckpt.pt if present
    python models/recipes/train_base.py draft --minutes 15

Writes runs/NAME/{ckpt.pt,best.pt,log.jsonl} and, at the end, runs/NAME/hf (the best held-out checkpoint),
which models/recipes/export_models.sh converts with mlx_lm.convert.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from mlxspec.drafting.lookup.corpus import read_text, split_files  # noqa: E402


@dataclass
class ModelShape:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int


@dataclass
class TrainConfig:
    seq_len: int = 512
    batch_size: int = 16
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    max_steps: int = 2000
    eval_every: int = 100
    eval_chunks: int = 48
    seed: int = 0


SHAPES = {
    "target": ModelShape(384, 6, 6, 2, 1024),
    "draft": ModelShape(128, 4, 2, 1, 384),
}
CONTEXT = 512


def llama_config(shape: ModelShape, vocab_size: int, eos_id: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        max_position_embeddings=CONTEXT,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        **asdict(shape),
    )


def token_stream(files: list[Path], tokenizer, cache: Path) -> np.ndarray:
    """All files tokenized and joined by EOS, cached as uint16."""
    if cache.exists():
        return np.load(cache)
    ids: list[int] = []
    for path in files:
        text = read_text(path)
        if text:
            ids.extend(tokenizer.encode(text))
            ids.append(tokenizer.eos_token_id)
    arr = np.asarray(ids, dtype=np.uint16)
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.save(cache, arr)
    return arr


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def heldout_loss(model, heldout: np.ndarray, cfg: TrainConfig) -> float:
    model.eval()
    n = min(cfg.eval_chunks, len(heldout) // (cfg.seq_len + 1))
    # Evenly spaced, fixed windows: the same ones at every evaluation.
    starts = np.linspace(0, len(heldout) - cfg.seq_len - 1, n).astype(np.int64)
    total = 0.0
    for i in range(0, n, cfg.batch_size):
        batch = np.stack([heldout[s : s + cfg.seq_len + 1] for s in starts[i : i + cfg.batch_size]]).astype(np.int64)
        x = torch.from_numpy(batch)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), x[:, 1:], reduction="sum")
        total += loss.item()
    model.train()
    return total / (n * cfg.seq_len)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(SHAPES))
    parser.add_argument("--tokenizer", type=Path, default=Path("runs/tokenizer"))
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--minutes", type=float, default=60.0, help="wall-clock budget of this invocation")
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--patience", type=int, default=5, help="evaluations without improvement before stopping")
    args = parser.parse_args()

    cfg = TrainConfig()
    if args.max_steps:
        cfg.max_steps = args.max_steps
    if args.lr:
        cfg.lr = args.lr
    torch.set_num_threads(args.threads)
    torch.manual_seed(cfg.seed)
    out = args.runs / args.name
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    train_files, heldout_files = split_files()
    train = token_stream(train_files, tokenizer, args.runs / "data" / "train.npy")
    heldout = token_stream(heldout_files, tokenizer, args.runs / "data" / "heldout.npy")
    print(f"train tokens {len(train):,}  heldout tokens {len(heldout):,}", flush=True)

    model = LlamaForCausalLM(llama_config(SHAPES[args.name], len(tokenizer), tokenizer.eos_token_id))
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.name}: {n_params:,} parameters", flush=True)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )

    state = {"step": 0, "best": float("inf"), "bad_evals": 0, "tokens": 0, "seconds": 0.0}
    rng = np.random.default_rng(cfg.seed)
    ckpt = out / "ckpt.pt"
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        state = saved["state"]
        rng.bit_generator.state = saved["rng"]
        print(f"resumed at step {state['step']}", flush=True)

    def save_checkpoint(path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        torch.save(
            {
                "model": model.state_dict(),
                "opt": opt.state_dict(),
                "state": state,
                "rng": rng.bit_generator.state,
                "config": asdict(cfg),
            },
            tmp,
        )
        tmp.replace(path)

    log = open(out / "log.jsonl", "a")
    deadline = time.time() + args.minutes * 60
    t_last = time.time()
    model.train()
    while state["step"] < cfg.max_steps and time.time() < deadline and state["bad_evals"] < args.patience:
        starts = rng.integers(0, len(train) - cfg.seq_len - 1, cfg.batch_size)
        x = torch.from_numpy(np.stack([train[s : s + cfg.seq_len + 1] for s in starts]).astype(np.int64))
        for group in opt.param_groups:
            group["lr"] = lr_at(state["step"], cfg)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), x[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        state["step"] += 1
        state["tokens"] += cfg.batch_size * cfg.seq_len
        now = time.time()
        state["seconds"] += now - t_last
        t_last = now
        if state["step"] % 10 == 0:
            tps = state["tokens"] / max(state["seconds"], 1e-9)
            print(
                f"\rstep {state['step']}/{cfg.max_steps} loss {loss.item():.3f} "
                f"lr {group['lr']:.2e} {tps:,.0f} tok/s {state['seconds'] / 60:.1f} min",
                end="",
                flush=True,
            )
        if state["step"] % cfg.eval_every == 0 or state["step"] == cfg.max_steps:
            val = heldout_loss(model, heldout, cfg)
            improved = val < state["best"]
            state["best"] = min(val, state["best"])
            state["bad_evals"] = 0 if improved else state["bad_evals"] + 1
            record = {
                "step": state["step"],
                "tokens": state["tokens"],
                "minutes": state["seconds"] / 60,
                "train_loss": loss.item(),
                "heldout_loss": val,
            }
            log.write(json.dumps(record) + "\n")
            log.flush()
            print(f"\n  heldout {val:.4f}{' (best)' if improved else ''}", flush=True)
            if improved:
                save_checkpoint(out / "best.pt")
            save_checkpoint(ckpt)
            t_last = time.time()  # evaluation time is not training time
    save_checkpoint(ckpt)

    best = torch.load(out / "best.pt", weights_only=False) if (out / "best.pt").exists() else None
    if best is not None:
        model.load_state_dict(best["model"])
    hf_dir = out / "hf"
    model.save_pretrained(hf_dir, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(args.tokenizer / f, hf_dir / f)
    print(
        f"\nsaved best (heldout {state['best']:.4f}) to {hf_dir}; {state['tokens']:,} tokens, "
        f"{state['seconds'] / 60:.1f} min",
        flush=True,
    )


if __name__ == "__main__":
    main()
