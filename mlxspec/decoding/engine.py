"""The speculative step: draft, verify in one target forward, accept, roll back. One host sync per step."""

from __future__ import annotations

import time
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

from mlxspec.cache.recurrent import Snapshot, snapshot
from mlxspec.cache.rollback import CacheSpec, rollback, rollback_room
from mlxspec.decoding.draft import Draft, Drafter
from mlxspec.decoding.forward import DraftRequest, EngineState, ForwardRequest, Phases, Ranks, StepResult, drive
from mlxspec.decoding.keys import PositionKeys
from mlxspec.decoding.prefill import fill_target, prepare_drafter
from mlxspec.decoding.processors import Processor, process_rows, token_logprobs
from mlxspec.decoding.replay import DeferredReplay
from mlxspec.decoding.sampling import SamplingConfig, first_token_allowed
from mlxspec.decoding.tree_attention import keep_tree_path, tree_verification
from mlxspec.decoding.verify import target_samples, verify_nodes, verify_sampled_chain


def to_host(values: mx.array) -> list[int]:
    """The engine's host sync: one per step, two on sharded ranks (distributed.same_draft); tests count calls."""
    return values.tolist()


class SpeculativeEngine:
    """Target-side state of speculative decoding: the target cache, the token not yet fed, and the random key."""

    def __init__(
        self,
        target: nn.Module,
        drafter: Drafter | None,
        sampling: SamplingConfig,
        num_draft: int = 4,
        seed: int = 0,
        acceptance: str = "coupled",
        processors: list[Processor] | None = None,
        processor_window: int = 20,
        logprobs: int | None = None,
        kv_bits: int | None = None,
        context_length: int | None = None,
        prefill_chunk: int = 512,
        max_nodes: int | None = None,
        controller=None,
        max_merged_replay: int | None = None,
        cache: list | None = None,
    ):
        self.target = target
        self.drafter = drafter
        self.sampling = sampling
        self.num_draft = num_draft if drafter is not None else 0
        self.context_length = context_length
        self.prefill_chunk = prefill_chunk
        self.controller = controller  # draft_length.DraftLengthController: picks each step's draft length
        self.profile: dict[str, float] | None = None  # set to {} to time draft/verify/accept/bookkeeping
        self.first_token_mask: mx.array | None = None  # token healing: [V] allowed first tokens, one plain step
        self._mark_time = 0.0
        # `cache`: a target cache kept from an earlier run (prompt_cache.py), built for the same CacheSpec.
        self.cache_spec = CacheSpec(rollback_room(drafter, num_draft, max_nodes), kv_bits)
        self.cache = cache if cache is not None else self.cache_spec.make(target)
        # Recurrent layers cannot be trimmed: they roll back by snapshot and deferred replay (replay.py).
        merged = self.num_draft + 1 if max_merged_replay is None else max_merged_replay
        self.deferred = DeferredReplay(self.cache, merged)
        self.recurrent = self.deferred.recurrent
        self.forward_widths: dict[int, int] = {}  # tokens per target forward -> how many forwards
        # Plain steps queue their next forward before the sync; a redrawn `short` top-p row (sampling.py) rolls it
        # back, which a recurrent cache cannot: there plain steps rank the whole vocabulary instead.
        self.rollback_ok = not self.recurrent
        self.sorted_fallbacks = 0  # steps redone with the whole vocabulary ranked (a top-p set past the candidates)
        # Every draw of the target's tokens, and of coupled drafts, is keyed by output position (keys.py);
        # `key` splits per step only for Leviathan/Chen's draws under acceptance="residual"
        self.position_keys = PositionKeys(seed, draws=2 if sampling.xtc else 1)
        assert acceptance in ("coupled", "residual"), acceptance  # "auto" is resolved by build_engine
        self.coupled = acceptance == "coupled"
        self.key = mx.random.key(seed)
        self.generated = 0  # tokens emitted so far: the output position the next target row decides
        # Penalties and a logit bias (processors.py), applied to every target row with the tokens before it
        self.processors = processors or []
        self.processor_window = processor_window
        self.logprobs = logprobs  # None, or how many alternatives to report with each token's log-probability
        self._logits: mx.array | None = None  # this step's processed target rows, kept for logprobs
        self.pending: list[int] = []
        # Tokens the target cache holds. Kept here, not read off the cache: recurrent layers (ArraysCache) have no
        # offset, and plain decoding runs on them too.
        self.position = 0
        self.history: list[int] = []  # every committed token: the prompt, then each step's tokens
        self.mid_step = False  # True while a step runs: an exception there leaves the caches unusable
        # Rows decoding together now (a batch driver's count; 1 alone): beside others a plain step queues no forward
        # ahead (it would miss the batched one), and k is chosen for the batch's total tokens.
        self.rows: Callable[[], int] = lambda: 1
        self.may_draft: Callable[[], bool] = lambda: True  # False: the batch governor has adaptive rows go plain
        self.row_steps = 0  # the sum over steps of the rows that decoded together (its mean goes to usage)
        self.prompt_snapshot: tuple[int, Snapshot] | None = None  # recurrent targets: the state after prefill
        self.target_calls = 0
        # Medusa, feature heads and block drafters draft from the target's features (final hidden states or tapped
        # layers' outputs), so the target forward returns them.
        self.wants_hidden = drafter is not None and drafter.uses_target_hidden
        self.taps: tuple[int, ...] = tuple(drafter.target_taps) if self.wants_hidden else ()
        self._hidden: mx.array | None = None
        self._prefetched: mx.array | None = None  # [1, V] lazy logits of a queued plain forward (see _plain_step)
        self.drafter_behind = False  # its prefill waits for its first draft (Drafter.prefill_may_wait)
        # A target sharded over ranks (distributed.Sharding): every rank verifies rank 0's drafts and emits its outcome.
        self.ranks: Ranks | None = None

    def prefill(self, prompt: list[int], reused: int = 0, drafter_reused: int = 0) -> None:
        """Feed all but the last prompt token; the last one is verified together with the first draft.

        reused: the target cache already holds prompt[:reused] (kept from an earlier run); drafter_reused: the
        drafter's state already covers that many (see Drafter.reusable)."""
        drive(self.prefill_phases(prompt, reused, drafter_reused))

    def prefill_phases(self, prompt: list[int], reused: int = 0, drafter_reused: int = 0) -> Phases:
        """prefill, one forward request per chunk (a batch driver runs them between other rows' steps)."""
        self.mid_step = True  # until the prompt is in: an exception in between leaves the caches half-fed
        self.history = list(prompt)
        taps = self.taps if self.wants_hidden else None
        filled = yield from fill_target(self.target, self.cache, prompt[reused:-1], reused, self.prefill_chunk, taps)
        self.position, self.pending = filled.position, [prompt[-1]]
        if self.recurrent:  # free (references): a later prompt sharing this one's prefix may start from here
            self.prompt_snapshot = (self.position, snapshot(self.recurrent))
        if self.drafter is not None:
            may_wait = self.controller is not None
            self.drafter_behind = prepare_drafter(self.drafter, self.history, drafter_reused, may_wait)
            if self.wants_hidden:  # every prompt row but the pending token's (none for a one-token prompt)
                self.drafter.set_hidden(filled.hidden)
        self.mid_step = False

    def kept_state(self) -> EngineState | None:
        """The state a finished or stopped run hands to the prompt cache; None after a step that failed midway (its
        caches may hold a half-fed forward)."""
        if self.mid_step:
            return None
        self.settle()
        return EngineState(
            list(self.history),
            self.position,
            self.cache,
            self.cache_spec,
            bool(self.recurrent),
            self.prompt_snapshot,
            self.drafter,
        )

    def room(self) -> int | None:
        """Positions left in the target's context once the pending token is fed: drafts may use them, and a
        negative value means no further token fits."""
        if self.context_length is None:
            return None
        return self.context_length - self.position - len(self.deferred.tokens) - len(self.pending)

    def _mark(self, phase: str, *arrays) -> None:
        """Profiling only: finish `arrays`, charge the time since the last mark to `phase` (adds syncs)."""
        if self.profile is None:
            return
        mx.eval([a for a in arrays if a is not None])
        now = time.perf_counter()
        self.profile[phase] = self.profile.get(phase, 0.0) + now - self._mark_time
        self._mark_time = now

    def step(self, max_new_tokens: int) -> StepResult:
        """One draft-verify-accept round emitting between 1 and (draft depth + 1) tokens, at most max_new_tokens."""
        return drive(self.step_phases(max_new_tokens))

    def step_phases(self, max_new_tokens: int) -> Phases:
        """step, yielding its draft and its target forward as requests (batch.py batches those of many rows)."""
        self.mid_step = True
        self._mark_time = started = time.perf_counter()
        draft_key = accept_key = None
        if not self.sampling.greedy and not self.coupled:  # Leviathan/Chen's own draws, split per step
            self.key, draft_key, accept_key = mx.random.split(self.key, 3)
        rows = self.rows()
        self.row_steps += rows
        budget = self.num_draft if self.controller is None else min(self.num_draft, self.controller.next_length(rows))
        budget = min(budget, max_new_tokens - 1)
        if self.controller is not None and not self.may_draft():
            budget = 0  # an adaptive row in a batch whose rounds run faster plain (batching.DraftingGovernor)
        if self.first_token_mask is not None:
            budget = 0  # the constrained first token is decoded plainly
        assert budget == 0 or self._prefetched is None  # a forward is queued only for a plain step (_next_is_plain)
        if self.room() is not None:
            budget = min(budget, self.room())
        if budget > 0 and self.controller is not None:  # after plain steps: what the drafter has not seen yet
            if self.drafter_behind:  # its deferred prefill, over everything committed so far
                self.drafter.prefill(self.history)
            self.drafter_behind = False
            self.drafter.catch_up()
            self._mark_time = started = time.perf_counter()  # a one-off, not what this step length costs
        draft = (yield DraftRequest(self.drafter, budget, self._draft_keys(budget, draft_key))) if budget > 0 else None
        if draft is not None and self.room() is not None and draft.tokens.shape[0] > self.room():
            draft = None  # no room in the context to verify it: decode one token instead
        if budget > 0 and self.ranks is not None:  # (every rank has the same budget: it follows emitted tokens)
            draft = self.ranks.same_draft(draft, self.cache_spec.max_rollback)
        self._mark("draft", None if draft is None else draft.tokens)
        if draft is None:
            result = yield from self._plain_step(max_new_tokens)
        elif draft.probs is not None and not self.coupled:
            result = yield from self._verify_sampled_chain(draft, accept_key)
        else:  # a coupled sampled draft is kept exactly where it equals the target's own draw
            result = yield from self._verify_deterministic(draft)
        self.target_calls += 1
        self.generated += len(result.tokens)
        if self.logprobs is not None:
            result.logprobs = token_logprobs(self._logits, [0, *result.path], result.tokens, self.logprobs)
        if self.controller is not None:
            self.controller.update(result.drafted, result.accepted)
            if rows == 1:  # beside other rows the wall time is the whole round's, not this row's step
                self.controller.observe(result.drafted if draft is not None else 0, time.perf_counter() - started)
        self.history.extend(result.tokens)  # committed: the drafter reads them from here
        if self.drafter is not None and not self.drafter_behind:
            self.drafter.accept(result.tokens, result.proposed)
            if self.wants_hidden:  # the hidden states of the kept rows: the fed token's, then the kept drafts'
                self.drafter.set_hidden(self._hidden[mx.array([0, *result.path], dtype=mx.int32)])
        self._mark("bookkeeping")
        self.mid_step = False
        return result

    def _target_logits(self, draft: Draft | None, alone: bool = False) -> Phases:
        """[N, V] target logits after the pending token and each drafted node; feeds them all to the cache."""
        if self.deferred.needs_own_forward():
            self._feed_replay_alone()
        fed, skip = self.deferred.ahead_of(self.pending)
        inputs = mx.array(fed, dtype=mx.int32)
        if draft is not None:
            inputs = mx.concatenate([inputs, draft.tokens])
        taps = self.taps if self.wants_hidden else None
        alone = alone or bool(self.recurrent) or self.ranks is not None or self.first_token_mask is not None
        logits, hidden = yield ForwardRequest(self.target, inputs, self.cache, taps, alone=alone)
        if self.wants_hidden:
            self._hidden = hidden[skip:]
        self._count_forward(inputs.shape[0])
        self.position += inputs.shape[0]
        logits = logits[skip:]  # the replayed rows predict tokens already emitted
        if self.first_token_mask is not None:
            logits, self.first_token_mask = first_token_allowed(logits, self.first_token_mask), None
        return self._processed(logits, draft)

    def _processed(self, logits: mx.array, draft: Draft | None) -> mx.array:
        """The rows with the penalties and logit bias applied, each with the history and its drafted path."""
        if self.processors:
            logits = process_rows(self.processors, logits, self.history, draft, self.processor_window)
        self._logits = logits
        return logits

    def settle(self) -> None:
        """Feed any deferred replay now, so the target cache holds every token but the pending one."""
        if self.deferred.tokens:
            self._feed_replay_alone()
            mx.eval([c.state for c in self.cache])

    def _count_forward(self, width: int) -> None:
        self.forward_widths[width] = self.forward_widths.get(width, 0) + 1

    def _feed_replay_alone(self) -> None:
        width = self.deferred.feed_alone(self.target)
        if self.ranks is not None:  # sharded: one forward per evaluation keeps the ranks' messages in one order
            mx.eval([c.state for c in self.cache])
        self._count_forward(width)
        self.position += width

    def _draft_keys(self, budget: int, draft_key: mx.array | None) -> mx.array | None:
        return self.position_keys.draft_keys(self.sampling.greedy, self.coupled, self.generated, budget, draft_key)

    def _row_keys(self, depths: list[int] | tuple[int, ...], coins: bool = False) -> mx.array | None:
        return self.position_keys.row_keys(self.sampling, self.generated, depths, coins)

    def _plain_step(self, max_new_tokens: int) -> Phases:
        """One token with no draft. When the next step will be plain too, its forward is queued on this step's
        lazy token before the sync, so graph building overlaps computing (as mlx-lm's generate_step does)."""
        if self._prefetched is not None:  # queued by the step before, which had not committed its token yet
            logits = self._processed(self._prefetched, None)
        else:
            logits = yield from self._target_logits(None)
        self._mark("verify", logits)
        keys, coins = self._row_keys([0]), self._row_keys([0], coins=True)
        self._logits = logits[-1:]
        token, short = target_samples(logits[-1:], self.sampling, keys, not self.rollback_ok, coins)
        self._mark("target probs", token)
        self._prefetched = None
        free = None if self.context_length is None else self.context_length - self.position
        if max_new_tokens > 1 and (free is None or free > 0) and self._next_is_plain():
            self._prefetched = self.target(token[None], cache=self.cache)[0]
            self.position += 1
            self._count_forward(1)
            mx.async_eval(self._prefetched)
        value, redraw = self._host(mx.concatenate([token, short[None].astype(mx.int32)]))
        if redraw:  # rare: the token came from too few ranked candidates; the queued forward fed it, so undo that
            self.sorted_fallbacks += 1
            if self._prefetched is not None:
                self._prefetched = None
                self._roll_back(1)
            value = self._host(target_samples(logits[-1:], self.sampling, keys, True, coins)[0])[0]
        self._mark("accept")
        self.pending = [] if self._prefetched is not None else [value]
        return StepResult([value], 0, 0, [], [])

    def _host(self, values: mx.array) -> list[int]:
        return to_host(values if self.ranks is None else self.ranks.agree(values))

    def _roll_back(self, num_tokens: int) -> None:
        rollback(self.cache, num_tokens)
        self.position -= max(0, num_tokens)

    def _keep(self, num_drafted: int, kept: list[int]) -> None:
        """After verifying a chain of num_drafted tokens, keep the tokens fed ahead of it and the `kept` drafts.

        An attention cache trims the rest. A recurrent one rewinds to before the forward, and what it should have
        kept is fed again at the front of the next one."""
        rejected = num_drafted - len(kept)
        if rejected == 0:
            return
        if not self.recurrent:
            self._roll_back(rejected)
            return
        self.position -= self.deferred.rewind(num_drafted, kept)

    def _next_is_plain(self) -> bool:
        """Whether the next step is certain to be plain decoding, so its forward can be queued now: no drafter, one
        that cannot pay, or a paused controller that promises it (plain_next commits the promise)."""
        if self.wants_hidden or self.first_token_mask is not None or self.ranks is not None or self.rows() > 1:
            return False  # (sharded: a queued forward would feed this rank's token before the ranks agree on it)
        if self.drafter is None or (self.controller is not None and not self.controller.can_win):
            return True
        return self.controller is not None and self.controller.plain_next()

    def _verify_sampled_chain(self, draft: Draft, key: mx.array) -> Phases:
        num_draft = draft.tokens.shape[0]
        logits = yield from self._target_logits(draft)
        self._mark("verify", logits)
        verdict = verify_sampled_chain(draft, logits, self.sampling, key, self._host, self._mark)
        self.sorted_fallbacks += verdict.redrawn
        self._mark("accept")
        kept = verdict.proposed[: verdict.accepted]
        self._keep(num_draft, kept)
        self.pending = [verdict.next_token]
        path = list(range(1, verdict.accepted + 1))
        return StepResult(kept + [verdict.next_token], num_draft, verdict.accepted, verdict.proposed, path)

    def _verify_deterministic(self, draft: Draft) -> Phases:
        """A deterministic chain or tree (greedy drafts, prompt lookup, top-k trees, Medusa), verified node by node.

        A chain needs no tree machinery: the causal mask is its ancestor mask and rollback is moving the offset."""
        shape, prefix = draft.tree, self.position
        if shape.is_chain:
            logits = yield from self._target_logits(draft)
        else:
            assert not self.recurrent, "trees need per-branch recurrent state; the API drafts chains for these"
            with tree_verification(self.target, self.cache, shape, prefix):  # alone: the model is patched meanwhile
                logits = yield from self._target_logits(draft, alone=True)
        self._mark("verify", logits)
        keys, coins = self._row_keys(shape.depths), self._row_keys(shape.depths, coins=True)
        verdict = verify_nodes(draft, self.pending, logits, self.sampling, keys, self._host, self._mark, coins)
        self.sorted_fallbacks += verdict.redrawn
        self._mark("accept")
        path = shape.path_to(verdict.accepted)
        if shape.is_chain:
            self._keep(shape.size - 1, verdict.proposed[: verdict.accepted])
        else:
            keep_tree_path(self.cache, prefix, [0, *path])
            self.position = prefix + 1 + len(path)
        self.pending = [verdict.next_token]
        tokens = [verdict.proposed[i - 1] for i in path] + [verdict.next_token]
        return StepResult(tokens, shape.size - 1, len(path), verdict.proposed, path)
