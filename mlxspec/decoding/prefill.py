"""The prompt into the caches: the target's, a chunk a forward, and the drafter's, now or at its first draft.

Pure steps over what they are handed; the engine (engine.py) keeps the state they return. The last prompt token is
not fed here: it is verified together with the first draft.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from mlxspec.decoding.draft import Drafter
from mlxspec.decoding.forward import PREFILL, ForwardRequest, Phases


@dataclass(frozen=True)
class TargetPrefill:
    """What filling the target's cache leaves: the tokens the cache holds, and the prompt rows' hidden states
    (when the drafter reads them)."""

    position: int
    hidden: mx.array | None


def fill_target(
    target: nn.Module, cache: list, tokens: list[int], position: int, chunk: int, taps: tuple[int, ...] | None
) -> Phases:
    """Feed `tokens` after the `position` tokens the cache holds, `chunk` tokens a forward (each a request a batch
    driver runs between other rows' steps); returns a TargetPrefill. `taps`: None, or the layers whose outputs
    the drafter reads (every row's hidden states are then kept)."""
    hidden = []
    for start in range(0, len(tokens), chunk):
        piece = mx.array(tokens[start : start + chunk])
        _, rows = yield ForwardRequest(target, piece, cache, taps, alone=True, kind=PREFILL)
        if taps is not None:
            hidden.append(rows)
        mx.eval(hidden[-1:], [c.state for c in cache])
        position += piece.shape[0]
    return TargetPrefill(position, mx.concatenate(hidden) if hidden else None)


def prepare_drafter(drafter: Drafter, history: list[int], reused: int, may_wait: bool) -> bool:
    """Bring the drafter to the committed `history` (it reads the engine's list and keeps no copy): resume from
    the `reused` tokens its state already covers, or prefill. Returns True when the prefill waits for the first
    draft instead (`may_wait`: a controller may keep the run plain, and this drafter's prefill can be deferred)."""
    if reused:
        drafter.resume(history, reused)
        return False
    if may_wait and drafter.prefill_may_wait:
        return True
    drafter.prefill(history)
    return False
