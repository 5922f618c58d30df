"""Run as a script (by test_verify_attention.py, under OpenBLAS): do the embedded target's logits for a row depend
on how many rows were verified with it? Prints one JSON object: differing logits per row count through the routed
view, with the kernel's attention, or with `mlx-attention` as argument the attention left to mlx-lm (the state
before the attention kernel: the power check)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlxspec.kernels import attention, verify
from mlxspec.loading import load_model
from mlxspec.platform import blas_in_use

ROOT = Path(__file__).resolve().parent.parent
DRAFTED = [5, 17, 99, 3, 8, 11, 42, 7, 5, 17, 99, 3, 8, 11, 42, 7]


def differing_logits(view, prompt: mx.array, rows: int) -> int:
    """Logits that differ between one `rows`-row verify forward and the same tokens decoded one at a time."""
    together, alone = make_prompt_cache(view), make_prompt_cache(view)
    view(prompt, cache=together)
    view(prompt, cache=alone)
    tokens = mx.array([DRAFTED[:rows]])
    full = view(tokens, cache=together)
    single = mx.concatenate([view(tokens[:, i : i + 1], cache=alone) for i in range(rows)], axis=1)
    return int((full != single).sum().item())


def main() -> None:
    if sys.argv[1:] == ["mlx-attention"]:  # this process only: the routed attention declines every call
        attention.KernelAttention.kernel_arguments = lambda self, *args: None
    loaded = load_model(ROOT / "models" / "target")
    backend, why = verify.cpu_backend()
    if backend is None:
        sys.exit(f"no verify kernel: {why}")
    text = (ROOT / "mlxspec" / "decoding" / "engine.py").read_text()
    prompt = mx.array(loaded.tokenizer.encode(text)[:300])[None]
    view = verify.routed_view(loaded.model, backend)
    differing = {rows: differing_logits(view, prompt, rows) for rows in (2, 4, 8, 16)}
    print(json.dumps({"blas": blas_in_use(), "differing": differing}))


if __name__ == "__main__":
    main()
