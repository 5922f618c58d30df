"""Measured forward-pass costs and the expected-speedup arithmetic that chooses the draft length.

Verification is "free" only where the target's cost curve over 1, 2, 4, ... tokens is flat. On MLX's stock Linux
CPU wheel (reference BLAS) it grows linearly, and speculation can only lose; the curve shows it.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from mlxspec.cache.recurrent import is_recurrent, leaf_caches, recurrent_leaves, restore, snapshot
from mlxspec.loading import LoadedModel
from mlxspec.platform import blas_in_use, cache_dir

CURVES_FILE = "cost_curves.json"
# v3: the draft timed as a chain runs it (a cold first forward, then warm ones); v4: the draft through the verify
# kernel, as generation now runs it: older stored curves are measured again
CURVE_VERSION = "v4"
DRAFT_CHAIN = 4  # one-token draft forwards timed back to back per round, as a step drafts them


@dataclass
class CostCurve:
    """Median seconds of one forward pass over n new tokens at a fixed context, per n."""

    target: dict[int, float]
    draft_one: float  # one warm draft forward of one token, as a chain's later ones run (0 without a draft model)
    context: int
    blas: str
    # Paid once per drafting step, whatever k: a block drafter's forward (DFlash), or what a draft model's first
    # forward costs beyond a warm one (the target's forward in between evicts its weights from the caches).
    draft_block: float = 0.0
    spread: float = 0.0  # the largest interquartile range over median of any size's timings: how noisy it was
    attempts: int = 1  # measurements taken of this curve (a noisy one is measured again, up to MAX_ATTEMPTS)

    def target_cost(self, n: int) -> float:
        """Interpolated cost of verifying n tokens."""
        sizes = sorted(self.target)
        if n <= sizes[0]:
            return self.target[sizes[0]]
        for low, high in zip(sizes, sizes[1:]):
            if n <= high:
                return self.target[low] + (self.target[high] - self.target[low]) * (n - low) / (high - low)
        last, before = sizes[-1], sizes[-2]
        slope = (self.target[last] - self.target[before]) / (last - before)
        return self.target[last] + slope * (n - last)

    def step_cost(self, k: int, rows: int = 1) -> float:
        """Seconds of one step drafting k tokens in each of `rows` rows (k = 0: plain), then verifying them all in
        one forward."""
        drafting = rows * (k * self.draft_one + (self.draft_block if k else 0.0))
        return drafting + self.target_cost(rows * (k + 1))


def expected_tokens(alpha: float, k: int) -> float:
    """Leviathan et al.: tokens per step with k drafts accepted i.i.d. with probability alpha (bonus included)."""
    if alpha >= 1.0:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_speedup(curve: CostCurve, alpha: float, k: int, rows: int = 1, drafting_scale: float = 1.0) -> float:
    """Tokens per second relative to plain decoding for draft length k (k = 0 is plain decoding), with `rows`
    sequences decoding together (continuous batching): their one verify forward carries rows * (k + 1) tokens and
    each row drafts on its own, so the curve is read at the batch's total tokens, not one sequence's.
    `drafting_scale`: what drafting steps were timed at over the curve's cost, relative to plain steps'."""
    step_seconds = curve.step_cost(k, rows) * (drafting_scale if k else 1.0)
    return rows * expected_tokens(alpha, k) * (curve.target_cost(rows) / rows) / step_seconds


def best_draft_length(curve: CostCurve, alpha: float, max_k: int, rows: int = 1, drafting_scale: float = 1.0) -> int:
    """The k in 0..max_k that maximizes expected speedup at this many rows; 0 means speculation would lose."""
    return max(range(max_k + 1), key=lambda k: expected_speedup(curve, alpha, k, rows, drafting_scale))


PREFILL_CHUNK = 512  # the context is filled this many tokens a forward


def _forward_timer(model: nn.Module, context: int):
    """A function timing one forward over n new tokens after `context` tokens, then undoing it (the cache is
    trimmed, recurrent state restored), so calls for any sizes can interleave on one cache."""
    cache = make_prompt_cache(model)
    for start in range(0, context, PREFILL_CHUNK):  # in chunks: one forward over 66k tokens asked for 39 GB
        model(mx.zeros((1, min(PREFILL_CHUNK, context - start)), mx.int32), cache=cache)
        mx.eval([c.state for c in cache])
    recurrent = recurrent_leaves(cache)

    def timed(n: int) -> float:
        before = snapshot(recurrent)
        start = time.perf_counter()
        mx.eval(model(mx.zeros((1, n), mx.int32), cache=cache))
        seconds = time.perf_counter() - start
        restore(recurrent, before)
        for c in leaf_caches(cache):
            if not is_recurrent(c):
                c.trim(n)
        return seconds

    return timed


def _spread(times: list[float]) -> float:
    """Interquartile range over median: 0 for a quiet machine, 0.3 and more for a busy one."""
    quartiles = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return (quartiles[2] - quartiles[0]) / max(quartiles[1], 1e-12)


def measure_curve(
    target: nn.Module,
    draft: nn.Module | None,
    sizes=(1, 2, 4, 8, 16, 32),
    context: int = 256,
    repeats: int = 7,
    why: str = "",
) -> CostCurve:
    """The median of `repeats` timings per size, taken in interleaved rounds (every size, and a chain of draft
    forwards, once per round), so a burst of load falls on all sizes alike rather than on whichever ran then.

    The draft runs DRAFT_CHAIN one-token forwards back to back, as a step drafts: the first, right after the
    target's forward, is cold (the widened bed's 1.3M draft: 3.0 ms against 1.4 ms warm), and its excess is
    paid once per drafting step (draft_block), not per token."""
    from mlxspec.progress import Progress

    sizes = sorted(sizes)
    what = "measuring this device's verification cost" + (f" {why}" if why else "")
    progress = Progress(what, repeats + 1)
    progress.update(0)  # before the context is filled: on a large target that alone takes minutes
    target_timer = _forward_timer(target, context)
    draft_timer = _forward_timer(draft, context) if draft is not None else None
    times: dict[int, list[float]] = {n: [] for n in sizes}
    draft_times: list[float] = []  # the warm forwards' mean, per round
    first_times: list[float] = []
    for round_ in range(repeats + 1):  # the first round warms kernels up and is not counted
        progress.update(round_)
        for n in sizes:
            seconds = target_timer(n)
            if round_:
                times[n].append(seconds)
        if draft_timer is not None:
            chain = [draft_timer(1) for _ in range(DRAFT_CHAIN)]
            if round_:
                first_times.append(chain[0])
                draft_times.append(statistics.mean(chain[1:]))
    progress.close()
    costs, most = {}, 0.0
    for n in sizes:  # verifying more tokens never costs less: a noisy small size must not make a longer draft free
        most = costs[n] = max(most, statistics.median(times[n]))
    spread = max([_spread(times[n]) for n in sizes] + ([_spread(draft_times)] if draft_times else []))
    draft_one = statistics.median(draft_times) if draft_times else 0.0
    draft_first = statistics.median(first_times) if first_times else 0.0
    return CostCurve(
        costs, draft_one, context, blas_in_use(), draft_block=max(0.0, draft_first - draft_one), spread=round(spread, 4)
    )


def _key(kernel: str, *model_paths: Path | None) -> str:
    # OpenBLAS's thread timeout changes small-call costs by up to a third, so curves are kept per setting, and
    # per verify kernel (its curve is the flat one).
    parts = [
        str(mx.default_device()),
        blas_in_use(),
        os.environ.get("OPENBLAS_THREAD_TIMEOUT", ""),
        kernel,
        CURVE_VERSION,
    ]
    for path in model_paths:
        if path is not None:
            config = Path(path) / "config.json"
            parts.append(hashlib.sha256(config.read_bytes()).hexdigest()[:16] if config.exists() else str(path))
    return "|".join(parts)


SPREAD_LIMIT = 0.25  # a stored curve noisier than this (interquartile range over median) is measured again
MAX_ATTEMPTS = 3  # ... at most this many times in all, keeping the quietest measurement


def max_attempts() -> int:
    """MAX_ATTEMPTS, or $MLXSPEC_CURVE_ATTEMPTS (the test suite measures each curve once: its timings decide
    nothing it checks, and a loaded CI machine would measure every curve three times)."""
    value = os.environ.get("MLXSPEC_CURVE_ATTEMPTS", "")
    return int(value) if value.isascii() and value.isdigit() and int(value) >= 1 else MAX_ATTEMPTS


def cached_curve(
    target: nn.Module,
    draft: nn.Module | None,
    target_path: Path,
    draft_path: Path | None,
    refresh: bool = False,
    kernel: str = "none",
    variants: tuple[str, ...] = (),
    **kwargs,
) -> CostCurve:
    """The cost curve for this device, BLAS, kernel and model pair, measured once and then read from the cache.

    A stored curve that lacks one of the requested sizes is measured again rather than extrapolated, and so is one
    measured on a busy machine (spread over SPREAD_LIMIT), up to MAX_ATTEMPTS times, keeping the quietest: one
    noisy measurement never decides for good. `refresh` (tune --remeasure) measures again whatever is stored.
    `variants`: how loading changed the models' stored weights (a draft re-quantized or its vocabulary cut)."""
    key = "|".join([_key(kernel, target_path, draft_path), *(v for v in variants if v)])
    try:
        stored = json.loads((cache_dir() / CURVES_FILE).read_text())
        stored = stored if isinstance(stored, dict) else {}
    except (OSError, ValueError, RecursionError):
        stored = {}
    kept = _stored_curve(stored.get(key))
    complete = kept is not None and {int(n) for n in kwargs.get("sizes", ())} <= set(kept.target)
    noisy = kept is not None and kept.spread > SPREAD_LIMIT and kept.attempts < max_attempts()
    if complete and not refresh and not noisy:
        return kept
    curve = measure_curve(target, draft, why=_why_measured(kept, complete, noisy, refresh), **kwargs)
    if complete and noisy and not refresh:
        curve = curve if curve.spread <= kept.spread else kept  # the quietest of the attempts
        curve = replace(curve, attempts=kept.attempts + 1)
    stored[key] = asdict(curve)
    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        (cache_dir() / CURVES_FILE).write_text(json.dumps(stored, indent=1))
    except OSError:
        pass  # a read-only home only costs a re-measurement next time
    return curve


def _why_measured(kept: CostCurve | None, complete: bool, noisy: bool, refresh: bool) -> str:
    """Why a curve is measured now, for its progress line: a user who saw it once should not wonder why again."""
    if refresh:
        return "again, as asked"
    if kept is None:
        return f"once, then kept in {cache_dir()}"
    if not complete:
        return "again: the stored curve lacks lengths this run may verify"
    return (
        f"again: the stored one was measured on a busy machine (spread {kept.spread:.2f} > {SPREAD_LIMIT}); "
        f"attempt {kept.attempts + 1} of {max_attempts()}, the quietest is kept"
    )


def _stored_curve(entry) -> CostCurve | None:
    """A stored curve, or None where the entry is missing or not one (a hand-edited or older file)."""
    try:
        curve = CostCurve(
            {int(n): float(t) for n, t in entry["target"].items()},
            float(entry["draft_one"]),
            int(entry["context"]),
            str(entry["blas"]),
            draft_block=float(entry.get("draft_block", 0.0)),
            spread=float(entry.get("spread", 0.0)),
            attempts=int(entry.get("attempts", 1)),
        )
    except (TypeError, KeyError, ValueError, AttributeError):
        return None
    sane = all(t > 0 for t in curve.target.values()) and curve.draft_one >= 0 and curve.draft_block >= 0
    return curve if curve.target and sane else None


def forget_curves() -> bool:
    """Drop every stored cost curve (`tune --remeasure`): each is measured again where it is next used."""
    try:
        (cache_dir() / CURVES_FILE).unlink()
    except FileNotFoundError:
        return False
    return True


def why_drafting_cannot_pay(curve: CostCurve, max_k: int) -> str:
    """The note for a run the curve keeps plain, naming the part that costs too much (the draft, or verifying)."""
    one = curve.target_cost(1)
    draft = curve.draft_one + curve.draft_block
    if draft >= 0.5 * one:
        part = f"one draft forward takes {1e3 * draft:.1f} ms against the target's {1e3 * one:.1f} ms"
    else:
        part = f"verifying {max_k + 1} tokens costs {curve.target_cost(max_k + 1) / one:.1f}x one"
    return (
        f"drafting cannot pay on this device by its measured costs ({part}); decoding plainly. "
        "If the machine was busy when they were measured, `mlxspec tune --remeasure` measures them again"
    )


def model_curve(
    target: LoadedModel,
    draft: LoadedModel | None,
    sizes: tuple[int, ...],
    refresh: bool = False,
    kernel: str = "auto",
) -> CostCurve:
    """The cached cost curve of a target (and a draft model, or None), timed the way generation runs it: through
    the verify kernel's routed view when `kernel` resolves to one."""
    from mlxspec.kernels import verify as verify_kernel

    backend, _ = verify_kernel.resolve(kernel)
    return cached_curve(
        verify_kernel.routed_view(target.model, backend),
        verify_kernel.routed_view(draft.model, backend) if draft else None,  # as generation runs it
        target.path,
        draft.path if draft else None,
        refresh=refresh,
        kernel=backend.name if backend is not None else "none",
        variants=(target.variant, draft.variant if draft else ""),
        sizes=sizes,
    )


def verify_cost_line(target: LoadedModel, draft: LoadedModel | None, max_tokens: int, kernel: str = "auto") -> str:
    """v(n): the cost of verifying n tokens relative to one, from this device's cached curve (measured once)."""
    sizes = tuple(range(1, max(max_tokens, 2) + 1))
    curve = model_curve(target, draft, sizes, kernel=kernel)
    costs = ", ".join(f"v({n})={curve.target_cost(n) / curve.target_cost(1):.2f}" for n in sizes[1:])
    return f"# one target token {1e3 * curve.target_cost(1):.2f} ms; verifying n tokens costs {costs}"
