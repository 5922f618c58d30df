"""A draft model: a small autoregressive model sharing the target's tokenizer, drafting chains or top-k trees."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn

from mlxspec.cache.recurrent import Snapshot, recurrent_leaves, restore, snapshot, trim_attention
from mlxspec.cache.rollback import make_speculative_cache, rollback
from mlxspec.decoding.draft import Draft, Drafter, common_prefix
from mlxspec.decoding.sampling import SamplingConfig, pick_draft_token
from mlxspec.decoding.trees import TreeShape, caterpillar_chain_nodes, caterpillar_parents
from mlxspec.drafting.draft_model.batched import propose_rows
from mlxspec.drafting.draft_model.compiled import UNTRACEABLE, CompiledDraftChain, supports_compiled_draft
from mlxspec.kernels.many_rows import prompt_rows
from mlxspec.options import ADAPTIVE_MAX_DRAFT

MAX_STEP_TOKENS = ADAPTIVE_MAX_DRAFT + 1  # the most pending tokens an adaptive step leaves: the chain's traced lengths


class DraftModelDrafter(Drafter):
    """A small autoregressive model sharing the target's tokenizer.

    tree_topk == 1: a chain sampled from the draft's processed distributions (Leviathan et al., Chen et al.).
    tree_topk > 1: a deterministic tree: the draft's greedy chain, with its top-k alternatives at every depth as
    sibling leaves (SpecInfer-style branching at the cost of a chain's draft calls).
    """

    prefill_may_wait = True  # its cache follows the committed tokens alone

    def __init__(
        self,
        model: nn.Module,
        sampling: SamplingConfig,
        max_draft: int,
        kv_bits: int | None = None,
        kv_window: int | None = None,
        tree_topk: int = 1,
        compiled: bool = True,
    ):
        self.model = model
        self.sampling = sampling
        self.tree_topk = tree_topk
        # The compiled chain covers plain KV caches; quantized or windowed draft caches run eagerly.
        self.compiled = None
        if compiled and kv_bits is None and kv_window is None and supports_compiled_draft(model):
            self.compiled = CompiledDraftChain(model, sampling, tree_topk)
        # A windowed draft cache bounds the draft's memory; it only changes proposals, never the output law.
        self._cache_options = dict(max_rollback=max_draft + 1, kv_bits=kv_bits, window=kv_window)
        self._use_eager_cache([] if self.compiled else make_speculative_cache(model, **self._cache_options))
        self.history: Sequence[int] = []  # the engine's committed tokens, prompt included (read, never copied)
        self._chain_nodes: list[int] = []  # node indices (1-based) of the tokens fed back into the draft
        self.calls = 0

    def _use_eager_cache(self, cache: list) -> None:
        self.cache = cache
        # Recurrent draft layers roll back to the snapshot taken after each single-token step of the chain.
        self.recurrent = recurrent_leaves(cache)
        self._snapshots: list[Snapshot] = []  # [j]: the recurrent state after the chain's j-th forward
        self.fed = 0  # tokens the eager cache holds (a recurrent layer has no offset to read)

    def _go_eager(self) -> None:
        """Some families cannot run the compiled chain (their attention reads or evaluates the cache its own way;
        found by the family sweep): draft eagerly instead, rebuilding the cache from the history."""
        self.compiled = None
        self._use_eager_cache(make_speculative_cache(self.model, **self._cache_options))
        self._prefill_eagerly()

    def _offset(self) -> int:
        return self.compiled.offset if self.compiled else self.fed

    def _pending(self) -> list[int]:
        return self.history[self._offset() :]

    def prefill(self, history: Sequence[int], chunk: int = 512) -> None:
        self.history = history
        with prompt_rows():  # a draft's prompt rows as GEMMs too: its bits only shape its guesses
            if self.compiled:
                try:
                    self.compiled.prefill(self._pending()[:-1], chunk)
                    return
                except UNTRACEABLE:
                    self._go_eager()
                    return
            self._prefill_eagerly(chunk)

    def catch_up(self) -> None:
        # After a pause the pending tokens number more than any step keeps: fed whole, each new length would trace
        # the compiled chain again (the probes of a paused run took 12 ms where a step drafting one takes 8)
        pending = self._pending()
        if self.compiled and len(pending) > MAX_STEP_TOKENS:
            try:
                self.compiled.prefill(pending[:-1])
            except UNTRACEABLE:
                self._go_eager()

    def reusable(self, prompt: list[int]) -> int:
        if self.recurrent:
            return 0  # recurrent draft layers cannot be trimmed back to a shorter prefix
        return min(self._offset(), common_prefix(self.history, prompt))

    def resume(self, history: Sequence[int], reused: int) -> None:
        extra = self._offset() - reused
        if self.compiled:
            self.compiled.trim(extra)
        else:
            rollback(self.cache, extra)
            self.fed = reused
        self._chain_nodes = []
        self.prefill(history)

    def _prefill_eagerly(self, chunk: int = 512) -> None:
        while len(self._pending()) > 1:
            todo = self._pending()[: min(chunk, len(self._pending()) - 1)]
            self.model(mx.array(todo)[None], cache=self.cache)
            self.fed += len(todo)
            mx.eval([c.state for c in self.cache])

    def propose(self, num_tokens: int, keys: mx.array | None) -> Draft:
        k, greedy = self.tree_topk, self.sampling.greedy
        if self.compiled:
            try:
                tokens, probs = self.compiled.propose(self._pending(), num_tokens, None if greedy else keys)
                return self._draft(tokens, probs, num_tokens)
            except UNTRACEABLE:
                self._go_eager()
        inputs = mx.array(self._pending(), dtype=mx.int32)
        keys = None if greedy else keys
        tokens, probs = [], []
        self._snapshots = []
        for i in range(num_tokens):
            logits = self.model(inputs[None], cache=self.cache)[0, -1]
            self.fed += inputs.shape[0]
            if self.recurrent:
                self._snapshots.append(snapshot(self.recurrent))
            token, proposed, q = pick_draft_token(logits, self.sampling, k, None if keys is None else keys[i])
            tokens.append(proposed)
            if q is not None:
                probs.append(q)
            mx.async_eval(token)  # start the draft computing while Python builds the next call; not a sync
            inputs = token[None]
        return self._draft(mx.concatenate(tokens), mx.stack(probs) if probs else None, num_tokens)

    def batch_key(self, num_tokens: int) -> tuple | None:
        """Greedy compiled chains over one model draft together (batched_draft.py); trees and sampled chains alone."""
        if self.compiled is None or self.tree_topk != 1 or not self.sampling.greedy:
            return None
        return (id(self.model), num_tokens)

    @classmethod
    def propose_together(cls, drafters: list[DraftModelDrafter], num_tokens: int) -> list[Draft]:
        try:
            chains = [d.compiled for d in drafters]
            tokens = propose_rows(drafters[0].model, chains, [d._pending() for d in drafters], num_tokens)
        except UNTRACEABLE:  # a family the batched graph cannot cover: each row drafts alone (and finds its way)
            return [d.propose(num_tokens, None) for d in drafters]
        return [d._draft(tokens[b], None, num_tokens) for b, d in enumerate(drafters)]

    def _draft(self, tokens: mx.array, probs: mx.array | None, num_tokens: int) -> Draft:
        k = self.tree_topk
        self.calls += num_tokens
        self._chain_nodes = caterpillar_chain_nodes(num_tokens, k)  # for a chain (k = 1): 1..num_tokens
        if k == 1:
            return Draft(tokens, probs)
        return Draft(tokens, None, TreeShape(caterpillar_parents(num_tokens, k)))

    def accept(self, emitted: list[int], drafted: list[int]) -> None:
        if self._chain_nodes:
            # The cache holds history + the chain's first K-1 tokens; keep what the emitted tokens confirm. A draft
            # the engine dropped unverified (no room left in the context) comes back empty: keep none of it.
            chain = [drafted[i - 1] for i in self._chain_nodes if i - 1 < len(drafted)]
            # At least the last emitted token stays pending: it is what the next draft continues from.
            keep = min(common_prefix(emitted, chain), len(self._chain_nodes) - 1, len(emitted) - 1)
            extra = self._offset() - (len(self.history) - len(emitted) + keep)  # (emitted: already committed)
            if self.compiled:
                self.compiled.trim(extra)
            elif self.recurrent and extra > 0:
                restore(self.recurrent, self._snapshots[keep])
                trim_attention(self.cache, extra)
                self.fed -= extra
            else:
                rollback(self.cache, extra)
                self.fed -= max(0, extra)
        self._chain_nodes = []
