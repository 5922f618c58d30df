"""The adaptive draft length: each step's k from the running acceptance and the measured cost curve (costs.py),
corrected by what the steps themselves are timed at, pausing drafting where no length pays."""

from __future__ import annotations

from mlxspec.decoding.costs import CostCurve, best_draft_length

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
        self.steps = self.paused_steps = 0  # this run's steps, and those drafting was paused for (not probes)
        # Acceptance counts with exponential forgetting; the prior counts as two steps' worth.
        self.successes, self.failures = 2 * prior_alpha, 2 * (1 - prior_alpha)
        # Even perfect acceptance cannot pay for verification: decode plainly.
        self.can_win = best_draft_length(curve, 1.0, max_k) > 0

    def carry_from(self, earlier: DraftLengthController | None) -> None:
        """Start from what an earlier run of the same drafting learned (its acceptance, its steps' cost scales, its
        mode and probe interval) instead of the prior: a short run otherwise spends its first steps relearning them
        (on the embedded bed a 64-token run drafted from its ninth step on). The scales count as measured at this
        run's start, so they fade as this run's own steps are timed."""
        if earlier is None:
            return
        self.successes, self.failures = earlier.successes, earlier.failures
        self.cost_scale = dict(earlier.cost_scale)
        self.last_observed = {mode: 0 for mode in self.cost_scale}
        self.paused, self.mode_steps, self.probe_interval = earlier.paused, earlier.mode_steps, earlier.probe_interval
        self.steps = self.paused_steps = 0  # (counted per run)

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
        self.steps += 1
        if not self.can_win:
            return 0
        if self.committed_plain:  # plain_next promised it: the engine has queued this step's forward
            self.committed_plain = False
            self.mode_steps += 1
            self.paused_steps += 1
            return 0
        predicted = self.best_length(rows)
        paused = self._paused(predicted)
        if not self.pause:
            return max(1, predicted)  # never below one draft token: with none, alpha would stop being measured
        self.paused_steps += paused
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

    def pause_note(self) -> str:
        """Why this run decoded mostly plainly although it could draft: "" unless drafting paused for most steps
        (-v, --json and the server's usage say it, as they do when a run stays plain)."""
        if not self.can_win or not self.steps or self.paused_steps * 2 < self.steps:
            return ""
        t1 = self.curve.target[min(self.curve.target)]
        why = f"a draft token costs {self.curve.draft_one / t1:.2f} of a target step by this device's stored curve"
        if True in self.cost_scale and False in self.cost_scale:
            why += f", and drafting steps ran at {self.drafting_scale:.2f}x the cost the curve predicts"
        return (
            f"drafting paused for {self.paused_steps} of {self.steps} steps: at alpha {self.alpha:.2f} no draft "
            f"length paid ({why}); pass -k N to draft anyway, or re-measure the curve with `mlxspec tune --remeasure`"
        )

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
