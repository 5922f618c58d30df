"""The target forwards a speculative step asks for, as values: so one driver can run a row's forward alone, and a
batch driver (batch.py) can run the forwards of many rows as one batched forward.

A step is a generator (SpeculativeEngine.step_phases) that yields a DraftRequest where it needs its draft
(receiving the Draft) and a ForwardRequest where it needs the target's logits (receiving (logits, hidden)), and
returns its StepResult. `drive` runs one such generator with every forward
alone: that is SpeculativeEngine.step.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, Protocol

import mlx.core as mx
import mlx.nn as nn

from mlxspec.cache.recurrent import Snapshot
from mlxspec.cache.rollback import CacheSpec
from mlxspec.decoding.draft import Draft, Drafter
from mlxspec.decoding.target_features import forward_with_hidden
from mlxspec.kernels.many_rows import prompt_rows

PREFILL, STEP = "prefill", "step"


@dataclass
class ForwardRequest:
    """One forward of one row: `inputs` [L] fed to its own `cache`."""

    model: nn.Module
    inputs: mx.array  # [L] int32
    cache: list
    taps: tuple[int, ...] | None = None  # None: logits only; else the hidden state (() final, or tapped layers)
    alone: bool = False  # must run by itself, now (a tree's mask and positions, recurrent state, a prefill chunk)
    kind: str = STEP  # PREFILL: a prompt chunk (its logits are not read); STEP: a speculative step's forward


@dataclass
class DraftRequest:
    """A step's draft: `drafter.propose(num_tokens, key)`, or computed with other rows' drafts (batch.py)."""

    drafter: Drafter
    num_tokens: int
    key: mx.array | None


Reply = tuple[mx.array, mx.array | None]  # (logits [L, V], hidden [L, D'] or None)
Phases = Generator[ForwardRequest | DraftRequest, Reply | Draft | None, Any]


def answer_alone(request: ForwardRequest | DraftRequest) -> Reply | Draft | None:
    """A forward or a draft request answered by itself."""
    if isinstance(request, DraftRequest):
        return request.drafter.propose(request.num_tokens, request.key)
    return run_alone(request)


def run_alone(request: ForwardRequest) -> Reply:
    """The request's forward by itself, as batch size 1 (a prompt chunk's with its quantized products as GEMMs:
    kernels/many_rows.py)."""
    with prompt_rows(request.kind == PREFILL):
        if request.taps is not None:
            hidden, logits = forward_with_hidden(request.model, request.inputs[None], request.cache, request.taps)
            return logits[0], hidden[0]
        return request.model(request.inputs[None], cache=request.cache)[0], None


def drive(phases: Phases) -> Any:
    """Run a generator of forward requests with every forward alone; its return value."""
    reply = None
    try:
        while True:
            reply = answer_alone(phases.send(reply))
    except StopIteration as done:
        return done.value


@dataclass
class EngineState:
    """What a finished run leaves for the next one (prompt_cache.py): a typed snapshot of the engine, taken with any
    deferred replay fed, so the target cache holds exactly history[:position]."""

    history: list[int]  # every committed token: the prompt, then the generated ones
    position: int  # tokens the target cache holds
    cache: list  # the target cache
    cache_spec: CacheSpec
    recurrent: bool  # the cache has recurrent layers (they are reused whole or from prompt_snapshot, never trimmed)
    prompt_snapshot: tuple[int, Snapshot] | None  # (position, recurrent state) at the end of the prompt's prefill
    drafter: Drafter | None


@dataclass
class StepResult:
    tokens: list[int]  # accepted drafts, then the target's own token
    drafted: int  # tokens (chain) or nodes (tree) proposed
    accepted: int
    proposed: list[int] = field(default_factory=list)  # the drafted node tokens as host ints, BFS order
    path: list[int] = field(default_factory=list)  # kept drafted nodes (rows of this step's forward), root excluded
    # with logprobs asked for: per token, (its log-probability, [(id, log-probability)] of the most likely ones)
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None


def drive_alone(events: Generator) -> Generator:
    """Yield a run's events (Chunks) with each forward request it makes answered alone; closing this closes it."""
    reply = None
    try:
        while True:
            try:
                event = events.send(reply)
            except StopIteration:
                return
            if isinstance(event, (ForwardRequest, DraftRequest)):
                reply = answer_alone(event)
            else:
                reply = None
                yield event
    finally:
        events.close()


class Ranks(Protocol):
    """Ranks that share one sharded target (distributed.Sharding)."""

    def agree(self, values: mx.array) -> mx.array:
        """Rank 0's step outcome on every rank, inside the sync that reads the outcome."""

    def same_draft(self, draft: Draft | None, capacity: int) -> Draft | None:
        """Rank 0's draft (or its lack of one) on every rank, before the target reads it; capacity bounds its
        nodes on every rank alike."""
