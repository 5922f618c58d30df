"""Prompt-cache reuse across generations: the next prompt prefills only what the last run's caches lack.

A server or chat resends the whole conversation every turn. After a run the target cache holds its prompt and the
answer (every committed token but the pending one), and the drafter its own state. The next prompt keeps the longest
common token prefix of the two: attention caches are trimmed to it, which is exact because a KV entry depends only on
the tokens before it. Recurrent layers (SSM, linear attention) cannot be trimmed: they are reused whole when the new
prompt extends everything they hold, else restored to the snapshot taken after the last prompt's prefill when the new
prompt extends that, else recomputed. `Stats.prompt_cache` says which.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxspec.cache.recurrent import copy_prefix, rewind, trim_attention
from mlxspec.cache.rollback import CacheSpec
from mlxspec.decoding.draft import Drafter, common_prefix
from mlxspec.decoding.forward import EngineState

# How the target's state was reused, for Stats.prompt_cache and usage.
COLD = "cold"  # nothing kept shares a prefix with the prompt, or was built for other options
PREFIX = "prefix"  # the kept cache, trimmed to the common prefix (or extended whole)
SNAPSHOT = "snapshot"  # recurrent layers restored to the end of the last prompt
RECOMPUTED = "recomputed"  # a kept cache that could not be cut back to the common prefix: prefilled from scratch


@dataclass
class Reuse:
    """What a new run starts from: `cache` holds prompt[:target_tokens] (None: a fresh one), and `drafter` covers
    prompt[:drafter_tokens] of its own state (0: prefill it)."""

    cache: list | None
    target_tokens: int
    drafter: Drafter | None
    drafter_tokens: int
    how: str


def target_points(
    held: list[int],
    position: int,
    prompt: list[int],
    snapshot_at: int | None,
    recurrent: bool,
    limit: int | None = None,
) -> list[int]:
    """The lengths the kept target cache can be cut back to for `prompt`, at most `limit`, longest first (always
    ending with 0).

    held[:position] is what the cache holds; at most len(prompt) - 1 tokens are reused, since the last prompt token is
    fed with the first draft. Attention-only caches reach any length up to the common prefix."""
    common = min(common_prefix(held[:position], prompt), len(prompt) - 1)
    limit = common if limit is None else limit
    if not recurrent:
        return [min(common, limit), 0]
    points = [position] if common == position else []
    if snapshot_at is not None and snapshot_at <= common:
        points.append(snapshot_at)
    return [p for p in points if p <= limit] + [0]


@dataclass
class Entry:
    state: EngineState  # what a finished (or stopped) run left
    drafter_key: tuple  # DecodeOptions.drafting_key of that run: its drafter continues only under the same key
    arithmetic: str = ""  # the kernel (or MLX's ops) that computed its caches: another one's KV is another model's


def snapshot_at(state: EngineState) -> int | None:
    """Where the end-of-prompt snapshot of the recurrent layers stands (None: none was kept)."""
    return state.prompt_snapshot[0] if state.prompt_snapshot else None


def reachable(state: EngineState, prompt: list[int]) -> int:
    """How many of prompt's tokens the kept target cache could continue from (drafters aside)."""
    held = state.history[: state.position]
    return target_points(held, len(held), prompt, snapshot_at(state), state.recurrent)[0]


class PromptCache:
    """The states of the last `capacity` finished runs (most recent first), kept so a next prompt can continue from
    the caches of the one it shares the longest prefix with: several conversations (clients) interleave without
    evicting each other. Each entry holds a whole KV cache.

    A prompt that continues an entry (extends everything it holds) takes it. One that shares only a prefix with it
    (another conversation under the same chat template, or a regenerated turn) starts from a copy of that prefix
    and leaves the entry for its own conversation, unless the entry is the one this run's state will evict anyway.

    An entry is taken exclusively: `take` removes it, and a run `keep`s its state only once it has finished or
    stopped. So two streams running at once never share a live cache; the second starts from another entry or cold.
    """

    def __init__(self, capacity: int = 1) -> None:
        self.capacity = capacity
        self.entries: list[Entry] = []

    @property
    def latest(self) -> EngineState | None:
        """The most recent run's state (None when empty)."""
        return self.entries[0].state if self.entries else None

    def clear(self) -> None:
        self.entries = []

    def keep(self, state: EngineState | None, drafter_key: tuple, arithmetic: str = "") -> None:
        """Keep a finished run's state (None, from a run that failed mid-step: nothing to keep)."""
        if state is None:
            return
        self.entries = [Entry(state, drafter_key, arithmetic)] + [
            e for e in self.entries if e.state.cache is not state.cache
        ]
        del self.entries[self.capacity :]

    def take(
        self,
        prompt: list[int],
        spec: CacheSpec,
        fresh_drafter: Drafter | None,
        drafter_key: tuple,
        arithmetic: str = "",
    ) -> Reuse:
        """The kept state cut back for `prompt`, or a cold start with `fresh_drafter`. Hands the kept caches over:
        the entry leaves the cache until the new run keeps its own state. Only an entry computed by the same
        `arithmetic` (kernel) serves: `--kernel int8` after a float run would otherwise continue float KV."""
        usable = [e for e in self.entries if e.state.cache_spec == spec and e.arithmetic == arithmetic]
        scored = [(reachable(e.state, prompt), e) for e in usable]
        reach, best = max(scored, key=lambda pair: pair[0], default=(0, None))  # ties: the most recent
        if reach == 0:  # nothing shares a prefix with this prompt: every entry stays for its own conversation
            return Reuse(None, 0, fresh_drafter, 0, COLD)
        continues = reach >= best.state.position  # the prompt extends all the entry holds: its own next turn
        doomed = len(self.entries) >= self.capacity and best is self.entries[-1]  # evicted when this run is kept
        if not (continues or doomed):
            # Another conversation sharing only a prefix (a chat template's, a system prompt): cutting the entry
            # back would destroy its future turns, so this run starts from a copy of the shared prefix instead; where
            # none can be made, it cuts the entry only when the overlap is worth more than what the entry would lose.
            copied = self.copied_prefix(best.state, reach, fresh_drafter)
            if copied is not None:
                return copied
            if reach < best.state.position - reach:
                return Reuse(None, 0, fresh_drafter, 0, COLD)
        self.entries.remove(best)
        state, kept_key = best.state, best.drafter_key
        drafter = state.drafter if kept_key == drafter_key and state.drafter is not None else fresh_drafter
        drafter_tokens = drafter.reusable(prompt) if drafter is not fresh_drafter else 0
        drafter_tokens = max(0, min(drafter_tokens, len(prompt) - 1))
        # A drafter that reads the target's features of every position past what it keeps: both reuse one length,
        # and at least the row before the pending token is recomputed, so the first step has features to draft from.
        joint = drafter is not None and drafter.uses_target_hidden
        if joint:
            drafter_tokens = min(drafter_tokens, max(0, len(prompt) - 2))
        n = target_points(
            state.history,
            state.position,
            prompt,
            snapshot_at(state),
            state.recurrent,
            drafter_tokens if joint else None,
        )[0]
        if joint:
            drafter_tokens = n
        if drafter_tokens == 0:
            drafter = fresh_drafter
        if n == 0:
            return Reuse(None, 0, drafter, drafter_tokens, RECOMPUTED)
        how = PREFIX
        try:
            if state.recurrent and n != state.position:
                rewind(state.cache, state.prompt_snapshot[1], state.position - n)
                how = SNAPSHOT
            elif not state.recurrent:
                trim_attention(state.cache, state.position - n)
        except RuntimeError:  # a sliding window or chunk that has dropped the positions needed: recompute
            if joint:
                return Reuse(None, 0, fresh_drafter, 0, RECOMPUTED)
            return Reuse(None, 0, drafter, drafter_tokens, RECOMPUTED)
        return Reuse(state.cache, n, drafter, drafter_tokens, how)

    @staticmethod
    def copied_prefix(state: EngineState, reach: int, fresh_drafter: Drafter | None) -> Reuse | None:
        """A cold drafter and a copy of the first `reach` positions of the entry's target cache, leaving the entry
        whole; None where the cache cannot be copied (recurrent layers, windows) or the drafter would have to cover
        the reused positions with state it does not have (one that reads the target's features)."""
        joint = fresh_drafter is not None and fresh_drafter.uses_target_hidden
        copied = None if joint or state.recurrent else copy_prefix(state.cache, reach)
        return None if copied is None else Reuse(copied, reach, fresh_drafter, 0, PREFIX)
