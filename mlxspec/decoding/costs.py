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
# v3: the draft timed as a chain runs it (a cold first forward, then warm ones): older stored curves are measured again
CURVE_VERSION = "v3"
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


def _forward_timer(model: nn.Module, context: int):
    """A function timing one forward over n new tokens after `context` tokens, then undoing it (the cache is
    trimmed, recurrent state restored), so calls for any sizes can interleave on one cache."""
    cache = make_prompt_cache(model)
    model(mx.zeros((1, context), mx.int32), cache=cache)
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
    target: nn.Module, draft: nn.Module | None, sizes=(1, 2, 4, 8, 16, 32), context: int = 256, repeats: int = 7
) -> CostCurve:
    """The median of `repeats` timings per size, taken in interleaved rounds (every size, and a chain of draft
    forwards, once per round), so a burst of load falls on all sizes alike rather than on whichever ran then.

    The draft runs DRAFT_CHAIN one-token forwards back to back, as a step drafts: the first, right after the
    target's forward, is cold (the widened bed's 1.3M draft: 3.0 ms against 1.4 ms warm), and its excess is
    paid once per drafting step (draft_block), not per token."""
    from mlxspec.progress import Progress

    sizes = sorted(sizes)
    progress = Progress("measuring this device's verification cost", repeats + 1)
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
    **kwargs,
) -> CostCurve:
    """The cost curve for this device, BLAS, kernel and model pair, measured once and then read from the cache.

    A stored curve that lacks one of the requested sizes is measured again rather than extrapolated, and so is one
    measured on a busy machine (spread over SPREAD_LIMIT), up to MAX_ATTEMPTS times, keeping the quietest: one
    noisy measurement never decides for good. `refresh` (tune --remeasure) measures again whatever is stored."""
    key = _key(kernel, target_path, draft_path)
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
    curve = measure_curve(target, draft, **kwargs)
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


PROBE_EVERY = 8  # a paused controller drafts every this many steps (a drafting one decodes plainly), at first
MAX_PROBE_EVERY = 64  # the interval doubles after each probe while the mode holds, up to this
WARMUP_STEPS = 2  # steps whose timing is not counted
STEP_MEMORY = 0.8  # forgetting of the measured cost scales, per step since each was last measured


class DraftLengthController:
    """Chooses each step's draft length from the running acceptance rate and the measured cost curve.

    pause=True (what Speculator uses for every drafter): where no length pays at the running acceptance, decode
    plainly, drafting every PROBE_EVERY steps to keep measuring acceptance (the interval doubling, up to
    MAX_PROBE_EVERY, while the pause holds). pause=False drafts at least one token every step.

    The curve is measured once and leaves out what a step costs besides the forwards (acceptance, the drafter's
    bookkeeping), which on a small target is a visible share, and a busy spell since. So with pause, the
    controller also times the steps themselves (`observe`): each step's seconds over the curve's cost of that step,
    for drafting and for plain steps. Their ratio scales the drafting steps' cost when choosing k, so where drafting
    steps run dearer than the curve says, k shrinks or drafting pauses. While drafting it takes a plain step now
    and then (the same growing interval), so both stay measured. A step's time is compared, not its time per token:
    how many tokens one step keeps swings with acceptance, which the long-memory alpha measures instead."""

    def __init__(
        self, curve: CostCurve, max_k: int, prior_alpha: float = 0.6, memory: float = 0.9, pause: bool = False
    ):
        self.curve, self.max_k, self.memory, self.pause = curve, max_k, memory, pause
        self.timed = True  # False: step timings never pause drafting (the lengths follow the text alone)
        self.paused, self.mode_steps, self.probe_interval, self.observed_steps = False, 0, PROBE_EVERY, 0
        self.cost_scale: dict[bool, float] = {}  # measured step seconds over the curve's: drafting (True), plain
        self.last_observed: dict[bool, int] = {}  # the observed step each mode was last timed at
        self.committed_plain = False  # plain_next promised the coming step is plain (its forward is queued)
        # Acceptance counts with exponential forgetting; the prior counts as two steps' worth.
        self.successes, self.failures = 2 * prior_alpha, 2 * (1 - prior_alpha)
        # Even perfect acceptance cannot pay for verification: decode plainly.
        self.can_win = best_draft_length(curve, 1.0, max_k) > 0

    @property
    def alpha(self) -> float:
        return self.successes / (self.successes + self.failures)

    @property
    def drafting_scale(self) -> float:
        """Drafting steps' measured cost over the curve's, relative to plain steps' (1 until both are measured)."""
        scale = self.cost_scale
        return scale[True] / scale[False] if True in scale and False in scale else 1.0

    def best_length(self, rows: int = 1) -> int:
        scale = self.drafting_scale if self.pause else 1.0
        return best_draft_length(self.curve, self.alpha, self.max_k, rows, scale)

    def next_length(self, rows: int = 1) -> int:
        """This step's draft length, with `rows` sequences decoding together: as the batch fills, the verify
        forward's tokens grow by rows per draft token, so k shrinks, and drafting pauses where no length pays."""
        if not self.can_win:
            return 0
        if self.committed_plain:  # plain_next promised it: the engine has queued this step's forward
            self.committed_plain = False
            self.mode_steps += 1
            return 0
        predicted = self.best_length(rows)
        paused = self._paused(predicted)
        if not self.pause:
            return max(1, predicted)  # never below one draft token: with none, alpha would stop being measured
        self.mode_steps += 1
        if self.mode_steps % self.probe_interval == 0:  # a probe of the other mode keeps both measured
            self.probe_interval = min(2 * self.probe_interval, MAX_PROBE_EVERY)  # and grows while the mode holds
            self.mode_steps = 0
            return max(1, best_draft_length(self.curve, self.alpha, self.max_k, rows)) if paused else 0
        return 0 if paused else predicted

    def _paused(self, predicted: int) -> bool:
        """Whether no length pays (by the curve scaled by the steps' measured cost); a change of mode restarts
        the probing at PROBE_EVERY."""
        paused = self.pause and predicted == 0
        if paused != self.paused:
            self.paused, self.mode_steps, self.probe_interval = paused, 0, PROBE_EVERY
        return paused

    def plain_next(self) -> bool:
        """Whether the coming step will be plain for sure (paused, and no probe due); True commits it, so the
        engine may queue that step's forward now, as plain decoding does."""
        if not self.pause or not self.can_win or self.committed_plain:
            return False
        if not self._paused(self.best_length()):
            return False
        if (self.mode_steps + 1) % self.probe_interval == 0:
            return False
        self.committed_plain = True
        return True

    def observe(self, drafted: int, seconds: float) -> None:
        """A step's wall time and its draft length (0: plain): its cost over the curve's, per mode, with
        forgetting. The first WARMUP_STEPS steps (compilation, the prompt's last token) are not counted."""
        self.observed_steps += 1
        if not self.timed or self.observed_steps <= WARMUP_STEPS:
            return
        mode = drafted > 0
        ratio = seconds / max(self.curve.step_cost(drafted), 1e-9)
        old = self.cost_scale.get(mode)
        # An estimate fades with the steps since it was measured, not with its own count: a probe after a long
        # pause mostly replaces what a busy moment measured, so a noisy spell cannot hold a pause for good.
        memory = STEP_MEMORY ** (self.observed_steps - self.last_observed.get(mode, self.observed_steps - 1))
        self.cost_scale[mode] = ratio if old is None else memory * old + (1 - memory) * ratio
        self.last_observed[mode] = self.observed_steps

    def update(self, drafted: int, accepted: int) -> None:
        """A chain stops at its first rejection: `accepted` successes, then one failure unless all were accepted."""
        if drafted:
            self.successes = self.memory * self.successes + accepted
            self.failures = self.memory * self.failures + (accepted < drafted)


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
        draft.model if draft else None,
        target.path,
        draft.path if draft else None,
        refresh=refresh,
        kernel=backend.name if backend is not None else "none",
        sizes=sizes,
    )


def verify_cost_line(target: LoadedModel, draft: LoadedModel | None, max_tokens: int, kernel: str = "auto") -> str:
    """v(n): the cost of verifying n tokens relative to one, from this device's cached curve (measured once)."""
    sizes = tuple(range(1, max(max_tokens, 2) + 1))
    curve = model_curve(target, draft, sizes, kernel=kernel)
    costs = ", ".join(f"v({n})={curve.target_cost(n) / curve.target_cost(1):.2f}" for n in sizes[1:])
    return f"# one target token {1e3 * curve.target_cost(1):.2f} ms; verifying n tokens costs {costs}"
