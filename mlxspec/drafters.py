"""Drafters propose tokens for the target to verify. Each keeps its own state; none of them affects exactness.

A draft is either a sampled chain with the distributions it was drawn from (verified by Leviathan/Chen rejection
sampling), or a deterministic tree or chain (verified by sampling the target at every node; see trees.accept_tree).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .caches import make_speculative_cache, rollback
from .compiled_draft import CompiledDraftChain, pick_draft_token, supports_compiled_draft
from .errors import UserError
from .recurrent import Snapshot, recurrent_leaves, restore, snapshot, trim_attention
from .sampling import SamplingConfig
from .trees import TreeShape, caterpillar_chain_nodes, caterpillar_parents, continuation_tree

if TYPE_CHECKING:
    from .options import DecodeOptions


@dataclass
class Draft:
    tokens: mx.array  # [M] int32 drafted tokens, lazy; tree nodes 1..M in BFS order
    probs: mx.array | None = None  # [M, V] the distributions sampled from; None for deterministic drafts
    shape: TreeShape | None = None  # the tree including its root; None for a chain

    @property
    def tree(self) -> TreeShape:
        return self.shape or TreeShape.chain(self.tokens.shape[0])


class Drafter(Protocol):
    """What the engine asks of a drafter. Subclass it to inherit the defaults of the optional parts."""

    calls: int
    uses_target_hidden: bool = False  # True: the engine hands over the target's hidden state after every step
    max_nodes: int = 0  # the most nodes one proposal may hold (0: no more than the engine's num_draft)

    def prefill(self, prompt: list[int]) -> None:
        """See the whole prompt; the last prompt token is where drafting continues from."""

    def reusable(self, prompt: list[int]) -> int:
        """After a finished run: how many leading tokens of a new prompt this drafter's state already covers and can
        keep (prompt_cache.py). 0 (the default): none, so a fresh drafter is prefilled instead."""
        return 0

    def resume(self, prompt: list[int], reused: int) -> None:
        """Keep the state of prompt[:reused] (0 < reused <= reusable(prompt)), then see the prompt as prefill does."""
        raise NotImplementedError

    def propose(self, num_tokens: int, key: mx.array | None) -> Draft | None:
        """Draft about num_tokens tokens (a chain of that length, or a tree that deep) lazily, or None."""

    def accept(self, emitted: list[int], drafted: list[int]) -> None:
        """The step's outcome: the emitted tokens and, as host ints, the tokens this drafter proposed."""

    def set_hidden(self, hidden: mx.array | None) -> None:
        """The target's final hidden states [n, D] at the positions its cache just kept, in order (lazy): after the
        prefill every prompt row but the last, after a step the fed token's row and the kept drafts'. Only called
        when uses_target_hidden."""


# What tracing the compiled draft chain raises on a family it cannot cover (an attention that reads a cache
# method the static cache lacks, or evaluates during the trace).
UNTRACEABLE = (AttributeError, TypeError, ValueError)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class DraftModelDrafter(Drafter):
    """A small autoregressive model sharing the target's tokenizer.

    tree_topk == 1: a chain sampled from the draft's processed distributions (Leviathan et al., Chen et al.).
    tree_topk > 1: a deterministic tree: the draft's greedy chain, with its top-k alternatives at every depth as
    sibling leaves (SpecInfer-style branching at the cost of a chain's draft calls).
    """

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
        self.history: list[int] = []  # every committed token, prompt included
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

    def prefill(self, prompt: list[int], chunk: int = 512) -> None:
        self.history = list(prompt)
        if self.compiled:
            try:
                self.compiled.prefill(self._pending()[:-1], chunk)
                return
            except UNTRACEABLE:
                self._go_eager()
                return
        self._prefill_eagerly(chunk)

    def reusable(self, prompt: list[int]) -> int:
        if self.recurrent:
            return 0  # recurrent draft layers cannot be trimmed back to a shorter prefix
        return min(self._offset(), common_prefix(self.history, prompt))

    def resume(self, prompt: list[int], reused: int) -> None:
        extra = self._offset() - reused
        if self.compiled:
            self.compiled.trim(extra)
        else:
            rollback(self.cache, extra)
            self.fed = reused
        self._chain_nodes = []
        self.prefill(prompt)

    def _prefill_eagerly(self, chunk: int = 512) -> None:
        while len(self._pending()) > 1:
            todo = self._pending()[: min(chunk, len(self._pending()) - 1)]
            self.model(mx.array(todo)[None], cache=self.cache)
            self.fed += len(todo)
            mx.eval([c.state for c in self.cache])

    def propose(self, num_tokens: int, key: mx.array | None) -> Draft:
        k, greedy = self.tree_topk, self.sampling.greedy
        if self.compiled:
            try:
                tokens, probs = self.compiled.propose(self._pending(), num_tokens, None if greedy or k > 1 else key)
                return self._draft(tokens, probs, num_tokens)
            except UNTRACEABLE:
                self._go_eager()
        inputs = mx.array(self._pending(), dtype=mx.int32)
        keys = None if greedy or k > 1 else mx.random.split(key, num_tokens)
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
            extra = self._offset() - (len(self.history) + keep)
            if self.compiled:
                self.compiled.trim(extra)
            elif self.recurrent and extra > 0:
                restore(self.recurrent, self._snapshots[keep])
                trim_attention(self.cache, extra)
                self.fed -= extra
            else:
                rollback(self.cache, extra)
                self.fed -= max(0, extra)
        self.history.extend(emitted)
        self._chain_nodes = []


class PromptLookupDrafter(Drafter):
    """Drafts by finding earlier occurrences of the last n tokens and copying what followed them.

    No model and no memory; strong on code edits and repetitive text. Deterministic, so verified by sampling.
    With max_candidates > 1, the distinct continuations of several matches (longest n-gram first, then latest)
    form a tree, so a wrong guess from the latest match can be rescued by an older one in the same target call.
    """

    def __init__(
        self,
        max_ngram: int = 3,
        min_ngram: int = 1,
        max_candidates: int = 1,
        successors: np.ndarray | None = None,
        fallback_tokens: int = 1,
    ):
        self.max_ngram, self.min_ngram, self.max_candidates = max_ngram, min_ngram, max_candidates
        # Where nothing matches, follow a corpus bigram table (ngram_table.py) for fallback_tokens tokens.
        self.successors, self.fallback_tokens = successors, fallback_tokens
        self.history: list[int] = []
        self.calls = 0

    def prefill(self, prompt: list[int]) -> None:
        self.history = list(prompt)

    def reusable(self, prompt: list[int]) -> int:
        return len(prompt)  # no state but the history, which prefill replaces

    def resume(self, prompt: list[int], reused: int) -> None:
        self.prefill(prompt)

    def candidates(self, num_tokens: int) -> list[list[int]]:
        """Up to max_candidates distinct continuations of at most num_tokens tokens, best first."""
        h, found = self.history, []
        for n in range(min(self.max_ngram, len(h) - 1), self.min_ngram - 1, -1):
            tail = h[-n:]
            for start in range(len(h) - n - 1, -1, -1):  # latest match first, excluding the tail itself
                if h[start : start + n] == tail:
                    continuation = h[start + n : start + n + num_tokens]
                    if continuation not in found:
                        found.append(continuation)
                        if len(found) == self.max_candidates:
                            return found
        return found

    def lookup(self, num_tokens: int) -> list[int]:
        found = self.candidates(num_tokens)
        return found[0] if found else []

    def successor_chain(self, num_tokens: int) -> list[int]:
        if self.successors is None or not self.history:
            return []
        chain, token = [], self.history[-1]
        while len(chain) < min(num_tokens, self.fallback_tokens):
            token = int(self.successors[token]) if token < len(self.successors) else -1
            if token < 0:
                break
            chain.append(token)
        return chain

    def propose(self, num_tokens: int, key: mx.array | None) -> Draft | None:
        found = self.candidates(num_tokens) or [self.successor_chain(num_tokens)]
        if not found[0]:
            return None
        if len(found) == 1:
            return Draft(mx.array(found[0], dtype=mx.int32))
        tokens, parents = continuation_tree(found)
        return Draft(mx.array(tokens, dtype=mx.int32), None, TreeShape(tuple(parents)))

    def accept(self, emitted: list[int], drafted: list[int]) -> None:
        self.history.extend(emitted)


class LookupThenModelDrafter(Drafter):
    """Prompt lookup when the context repeats itself, the draft model otherwise."""

    def __init__(self, lookup: PromptLookupDrafter, model: Drafter, min_match: int = 2):
        self.lookup, self.model, self.min_match = lookup, model, min_match
        self.uses_target_hidden = model.uses_target_hidden
        self.max_nodes = model.max_nodes
        self._used: Drafter | None = None

    def set_hidden(self, hidden: mx.array | None) -> None:
        self.model.set_hidden(hidden)

    @property
    def calls(self) -> int:
        return self.model.calls

    def prefill(self, prompt: list[int]) -> None:
        self.lookup.prefill(prompt)
        self.model.prefill(prompt)

    def reusable(self, prompt: list[int]) -> int:
        return self.model.reusable(prompt)

    def resume(self, prompt: list[int], reused: int) -> None:
        self.lookup.prefill(prompt)
        self.model.resume(prompt, reused)

    def propose(self, num_tokens: int, key: mx.array) -> Draft | None:
        draft = self.lookup.propose(num_tokens, key)
        if draft is not None and draft.tokens.shape[0] >= self.min_match:
            self._used = self.lookup
            return draft
        self._used = self.model
        return self.model.propose(num_tokens, key)

    def accept(self, emitted: list[int], drafted: list[int]) -> None:
        self.lookup.accept(emitted, drafted if self._used is self.lookup else [])
        self.model.accept(emitted, drafted if self._used is self.model else [])


def make_drafter(
    options: DecodeOptions,
    draft_model: nn.Module | None = None,
    medusa: Any = None,
    target_model: nn.Module | None = None,
    successors: np.ndarray | None = None,
    feature_head: Any = None,
) -> Drafter | None:
    """The drafter `options` ask for: a feature head (EAGLE or MTP) or Medusa heads (on target_model), or a draft
    model, optionally behind prompt lookup (with its corpus table `successors`); None decodes plainly. The one place
    drafters are wired."""
    sampling, depth = options.sampling, options.depth
    model_drafter: Drafter | None = None
    if options.use_draft and feature_head is not None:
        from .feature_drafter import FeatureDrafter
        from .feature_head import HeadOnTarget

        model_drafter = FeatureDrafter(
            HeadOnTarget(feature_head, target_model),
            sampling,
            beam=options.tree_topk,
            max_nodes=options.tree_nodes or depth * options.tree_topk,
        )
    elif options.use_draft and medusa is not None:
        from .medusa import MedusaDrafter

        model_drafter = MedusaDrafter(
            medusa, target_model, tree_nodes=depth * options.tree_topk, tree_topk=options.tree_topk
        )
    elif options.use_draft and draft_model is not None:
        model_drafter = DraftModelDrafter(
            draft_model,
            sampling,
            depth,
            kv_bits=options.kv_bits,
            kv_window=options.draft_window,
            tree_topk=options.tree_topk,
        )
    elif options.tree_topk > 1:
        raise UserError("a tree needs a drafter that branches: pass a draft model (or Medusa heads)")
    if not options.lookup:
        return model_drafter
    lookup = PromptLookupDrafter(
        max_candidates=options.lookup_candidates, successors=successors if options.corpus_fallback else None
    )
    return LookupThenModelDrafter(lookup, model_drafter) if model_drafter is not None else lookup
