"""Continuous batching: many runs of one Speculator decoding together, one batched target forward a step.

Each row is a run as Speculator.events gives it: its own options (sampling, seed, stops, max_tokens), drafter,
target cache and prompt-cache entry. A round advances every row to its next speculative step's draft, computes the
rows' drafts (greedy draft-model chains together, the rest each alone), advances every row to its target forward,
answers all those forwards with one batched forward (decoding/batch.py), and lets each row accept and roll back on
its own. A row's prompt is fed one chunk per round, between the others' steps, so a long
prompt does not stall the rows already decoding. Rows join between rounds and leave when they finish; an error in
one row (its drafter raising, say) ends that row alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from mlxspec.decoding.batch import propose_all, run_all
from mlxspec.decoding.draft import Draft
from mlxspec.decoding.forward import PREFILL, DraftRequest, ForwardRequest, Reply, run_alone
from mlxspec.results import Chunk, GenerationResult, Stats


@dataclass
class Row:
    events: Generator
    stats: Stats
    on_chunk: Callable[[Chunk], None]
    reply: Reply | Draft | Exception | None = None
    request: ForwardRequest | DraftRequest | None = None  # the draft or step forward this row waits on
    done: bool = False
    error: BaseException | None = None
    pieces: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    finish: str | None = None


WINDOW_ROUNDS = 4  # rounds the governor holds a mode; the first of each is not timed (it finishes the last mode's)
PROBE_EVERY_WINDOWS = 6  # windows between probes of the mode the governor does not run
GOVERNOR_MEMORY = 0.5  # forgetting of the measured tokens per second, per window


class DraftingGovernor:
    """Whether drafting pays for a batch as a whole, measured. The cost curve rows read (costs.expected_speedup) is a
    single row's and misses what each drafting row adds to a round (its draft forwards, run one row after another,
    and its own acceptance). So the governor holds a mode (drafting allowed, or every row decoding plainly) for a
    window of WINDOW_ROUNDS rounds, times the window's tokens per second by batch size, runs the faster mode, and
    probes the other every PROBE_EVERY_WINDOWS windows. A round's tokens come from the forward queued the round
    before, so each window's first round (which finishes the previous mode's forward) is not timed. One row alone
    is left to its own controller (it times its own steps)."""

    def __init__(self) -> None:
        self.rates: dict[tuple[int, bool], float] = {}  # (rows, drafting allowed) -> tokens per second
        self.mode, self.rows, self.round_in_window, self.windows = True, 0, WINDOW_ROUNDS, 0
        self.tokens, self.seconds = 0, 0.0

    def allows(self, rows: int) -> bool:
        """The mode of the coming round with this many rows."""
        if rows <= 1:
            self.rows = rows
            return True
        if rows != self.rows or self.round_in_window >= WINDOW_ROUNDS:
            self._close_window()
            self.rows, self.round_in_window, self.windows = rows, 0, self.windows + 1
            self.mode = self._choose(rows)
        self.round_in_window += 1
        return self.mode

    def _choose(self, rows: int) -> bool:
        drafting, plain = self.rates.get((rows, True)), self.rates.get((rows, False))
        if drafting is None or plain is None:
            return drafting is None  # measure drafting first, then plain
        best = drafting >= plain
        return not best if self.windows % PROBE_EVERY_WINDOWS == 0 else best

    def observe(self, tokens: int, seconds: float) -> None:
        """The round just run: every row stepped (no prompt chunk, no row ending) and it took `seconds`."""
        if self.rows > 1 and self.round_in_window > 1:
            self.tokens, self.seconds = self.tokens + tokens, self.seconds + seconds

    def _close_window(self) -> None:
        if self.seconds > 0 and self.tokens > 0:
            key, rate = (self.rows, self.mode), self.tokens / self.seconds
            old = self.rates.get(key)
            self.rates[key] = rate if old is None else GOVERNOR_MEMORY * old + (1 - GOVERNOR_MEMORY) * rate
        self.tokens, self.seconds = 0, 0.0


class BatchRows:
    """The rows decoding together; `round()` runs one step of every row."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.governor = DraftingGovernor()
        self.drafting = True  # this round's mode (Speculator.events' `may_draft` reads it)

    def count(self) -> int:
        """How many rows decode together now (Speculator.events' `rows`): each row's draft length follows it."""
        return len(self.rows)

    def add(self, events: Generator, stats: Stats, on_chunk: Callable[[Chunk], None] = lambda chunk: None) -> Row:
        row = Row(events, stats, on_chunk)
        self.rows.append(row)
        return row

    def drop(self, row: Row) -> None:
        """Stop a row now (its client left): its run ends as a stopped stream does, keeping its caches."""
        row.events.close()
        row.done = True
        self.rows.remove(row)

    def may_draft(self) -> bool:
        return self.drafting

    def round(self) -> list[Row]:
        """Advance every row by one step (or one prompt chunk); the rows that finished or failed, removed."""
        count = len(self.rows)
        self.drafting = self.governor.allows(count)
        before = sum(len(row.tokens) for row in self.rows)
        start = time.perf_counter()
        waiting = [row for row in self.rows if self._advance(row)]
        # Drafts first, then the forwards. A row whose forward runs alone (a tree's, a recurrent target's) gets it
        # inside _advance, ends its step and asks for its next draft: so draft until every row waits on a forward.
        while drafting := [row for row in waiting if isinstance(row.request, DraftRequest)]:
            for row, draft in zip(drafting, propose_all([row.request for row in drafting])):
                row.reply, row.request = draft, None  # a draft, or the exception its drafter raised
            waiting = [row for row in waiting if row.request is not None or self._advance(row)]
        for row, reply in zip(waiting, run_all([row.request for row in waiting])):
            row.reply, row.request = reply, None
        if len(waiting) == count:  # every row stepped (no prompt chunk, no row ending): a round to compare
            tokens = sum(len(row.tokens) for row in self.rows) - before
            self.governor.observe(tokens, time.perf_counter() - start)
        finished = [row for row in self.rows if row.done]
        self.rows = [row for row in self.rows if not row.done]
        return finished

    def _advance(self, row: Row) -> bool:
        """Run `row` up to its next draft or step forward (True: it waits for it) or to its end (False)."""
        try:
            while True:
                if isinstance(row.reply, Exception):  # its drafter raised: raised in its run, where it asked
                    event = row.events.throw(row.reply)
                else:
                    event = row.events.send(row.reply)
                row.reply = None
                if isinstance(event, Chunk):
                    row.pieces.append(event.text)
                    row.tokens.extend(event.tokens)
                    row.finish = event.finish_reason or row.finish
                    row.on_chunk(event)
                elif isinstance(event, DraftRequest):
                    row.request = event  # the round drafts for every row that asks, together where it can
                    return True
                elif event.alone or event.kind == PREFILL:
                    row.reply = run_alone(event)  # now: a tree's forward runs while the model is patched for it
                    if event.kind == PREFILL:
                        return False  # one prompt chunk a round; the reply is sent next round
                else:
                    row.request = event
                    return True
        except StopIteration:
            row.done = True
        except Exception as error:  # noqa: BLE001 - this row's failure, reported to its owner alone
            row.error, row.done = error, True
            row.events.close()
        return False


def generate_batch(speculator, prompts: list, options: Any = None, max_batch: int | None = None) -> list:
    """Speculator.generate for every prompt, decoded together (at most max_batch at once); results in order.
    `options`: one DecodeOptions for all, or one per prompt. A row that fails raises once all rows are done."""
    from mlxspec.errors import UserError

    if not isinstance(prompts, (list, tuple)):  # a bare string would be decoded one row per character
        raise UserError(f"prompts must be a list of prompts, not {type(prompts).__name__}; for one, pass [prompt]")
    if max_batch is not None and (type(max_batch) is not int or max_batch < 1):
        raise UserError(f"max_batch {max_batch!r} must be a whole number >= 1, or None for every prompt at once")
    per_row = options if isinstance(options, (list, tuple)) else [options] * len(prompts)
    if len(per_row) != len(prompts):
        raise UserError(f"{len(per_row)} options for {len(prompts)} prompts; pass one, or one per prompt")
    runs = [speculator.call_options(o, {}) for o in per_row]  # every row's options checked before any runs
    rows, results, waiting = BatchRows(), {}, list(range(len(prompts)))
    index: dict[int, int] = {}
    limit = max_batch or len(prompts)
    while waiting or rows.rows:
        while waiting and len(rows.rows) < limit:
            i = waiting.pop(0)
            stats = Stats()
            index[id(rows.add(speculator.events(prompts[i], runs[i], stats, rows.count, rows.may_draft), stats))] = i
        for row in rows.round():
            results[index[id(row)]] = row
    failed = next((results[i].error for i in range(len(prompts)) if results[i].error is not None), None)
    if failed is not None:
        raise failed
    ordered = [results[i] for i in range(len(prompts))]
    return [GenerationResult("".join(r.pieces), r.tokens, r.stats, r.finish) for r in ordered]
