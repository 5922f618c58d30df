"""A draft model's whole K-token chain as one compiled MLX graph over fixed-capacity KV buffers.

A draft model is small, so its per-token cost is mostly per-op dispatch and Python graph building (about 1.3 ms
per token for the embedded 1.3M draft on the CPU, a quarter of the target's forward). With the cache offset held as
an array and the buffers at a fixed capacity, every draft step has the same shapes, so `mx.compile` traces it once
(per pending length, K and capacity) and replays it: no Python per token, and fused elementwise kernels.

The draft only proposes; whatever it computes, verification keeps the output exact.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import partial
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

from mlxspec.decoding.costs import DRAFT_CHAIN
from mlxspec.decoding.sampling import SamplingConfig, pick_draft_token

# What tracing the compiled draft chain raises on a family it cannot cover (an attention that reads a cache
# method the static cache lacks, or evaluates during the trace).
UNTRACEABLE = (AttributeError, TypeError, ValueError)
MAX_CHAINS = 8  # compiled chains kept per draft model (least recently used dropped): each holds its traces
CAPACITY_STEP = 256  # buffers grow in steps of this many positions; each capacity is one more trace


class StaticKVCache:
    """mlx-lm's cache interface over fixed-capacity buffers [1, kv_heads, capacity, head_dim].

    `offset` is a [] int32 array, so RoPE (`mx.fast.rope` takes an array offset), the buffer write and the mask
    are all traced as data rather than baked into the graph. Positions past the offset hold stale keys the mask
    hides, so rolling back is only lowering the offset.
    """

    def __init__(self, keys: mx.array, values: mx.array, offset: mx.array):
        self.keys, self.values, self.offset = keys, values, offset

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        start = self.offset.reshape(1)
        self.keys = mx.slice_update(self.keys, keys.astype(self.keys.dtype), start, axes=(2,))
        self.values = mx.slice_update(self.values, values.astype(self.values.dtype), start, axes=(2,))
        return self.keys, self.values

    def make_mask(self, N: int, window_size: int | None = None, return_array: bool = False, **kwargs: Any):
        """[N, capacity] bool: query i (at offset + i) sees keys at positions <= its own, within any window."""
        queries = self.offset + mx.arange(N)[:, None]
        keys = mx.arange(self.keys.shape[2])[None]
        mask = keys <= queries
        if window_size:
            mask = mask & (keys > queries - window_size)
        return mask


def static_caches(keys: list[mx.array], values: list[mx.array], offset: mx.array) -> list[StaticKVCache]:
    return [StaticKVCache(k, v, offset) for k, v in zip(keys, values)]


def supports_compiled_draft(model: nn.Module) -> bool:
    """Only plain and sliding-window attention caches (no SSM or linear-attention state) have a static form."""
    try:
        return all(
            type(c) in (KVCache, RotatingKVCache) and not getattr(c, "keep", 0) for c in make_prompt_cache(model)
        )
    except Exception:
        return False


def chain_graph(model, sampling, tree_topk, inputs, offset, keys, values, random_keys, num_tokens):
    """inputs [P] int32 fed at `offset`, then num_tokens draft steps. Returns (tokens [K] or [K, topk], draft
    probabilities [K, V] (sampled chains only, else an empty array), new keys, new values)."""
    caches = static_caches(keys, values, offset)
    tokens, probs = [], []
    for i in range(num_tokens):
        logits = model(inputs[None], cache=caches)[0, -1]
        for c in caches:
            c.offset = c.offset + inputs.shape[0]
        key = random_keys[i] if random_keys.size else None
        token, proposed, q = pick_draft_token(logits, sampling, tree_topk, key)
        tokens.append(proposed)
        if q is not None:
            probs.append(q)
        inputs = token[None]
    out_probs = mx.stack(probs) if probs else mx.zeros((0,))
    return mx.concatenate(tokens), out_probs, [c.keys for c in caches], [c.values for c in caches]


def shared_chain(model: nn.Module, sampling: SamplingConfig, tree_topk: int):
    """The compiled chain of (model, sampling, tree_topk), one per model: every drafter built on the model replays
    the same traces instead of tracing its own (a few milliseconds each; a server builds a drafter per request)."""
    return compiled_for(model, "_mlxspec_compiled_chains", (sampling, tree_topk), chain_graph, sampling, tree_topk)


def compiled_for(model: nn.Module, attribute: str, key: tuple, graph, *constants):
    """mx.compile(partial(graph, model, *constants)), one per (key, weights), kept in the model's attribute dict
    under `attribute` (beside its parameters rather than among them), the least recently used dropped past
    MAX_CHAINS. A trace holds the weights it was traced with, so the key names them: weights replaced by `update`
    or `load_weights` trace anew."""
    chains: OrderedDict = model.__dict__.setdefault(attribute, OrderedDict())
    key = (*key, tuple(id(w) for _, w in tree_flatten(model.parameters())))
    if key in chains:
        chains.move_to_end(key)
    else:
        chains[key] = mx.compile(partial(graph, model, *constants))
        while len(chains) > MAX_CHAINS:  # a server whose requests vary temperature or top-p: drop the oldest
            chains.popitem(last=False)
    return chains[key]


class CompiledDraftChain:
    """The draft model's KV state and its compiled chain step; the offset lives on the host as a Python int."""

    def __init__(self, model: nn.Module, sampling: SamplingConfig, tree_topk: int = 1):
        self.model = model
        self.keys: list[mx.array] = []
        self.values: list[mx.array] = []
        self.offset = 0
        self._chain = shared_chain(model, sampling, tree_topk)

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def reserve(self, positions: int, like: list[tuple[mx.array, mx.array]] | None = None) -> None:
        """Grow every buffer so `positions` fit (zero-padded); `like` gives shapes and dtypes before the first."""
        if positions <= self.capacity:
            return
        capacity = -(-positions // CAPACITY_STEP) * CAPACITY_STEP
        if not self.keys:
            self.keys = [mx.zeros((*k.shape[:2], capacity, k.shape[3]), k.dtype) for k, _ in like]
            self.values = [mx.zeros((*v.shape[:2], capacity, v.shape[3]), v.dtype) for _, v in like]
            return
        grow = [(0, 0), (0, 0), (0, capacity - self.capacity), (0, 0)]
        self.keys = [mx.pad(k, grow) for k in self.keys]
        self.values = [mx.pad(v, grow) for v in self.values]

    def prefill(self, tokens: list[int], chunk: int = 512) -> None:
        """Feed tokens eagerly (prompt lengths vary, so compiling them would trace once per length)."""
        if not self.keys:  # learn each layer's KV shape from one token through mlx-lm's own cache
            probe = make_prompt_cache(self.model)
            self.model(mx.array(tokens[:1] or [0])[None], cache=probe)
            self.reserve(len(tokens) + 1, [(c.keys, c.values) for c in probe])
        self.reserve(self.offset + len(tokens))
        for start in range(0, len(tokens), chunk):
            piece = tokens[start : start + chunk]
            caches = static_caches(self.keys, self.values, mx.array(self.offset, dtype=mx.int32))
            self.model(mx.array(piece)[None], cache=caches)
            self.keys, self.values = [c.keys for c in caches], [c.values for c in caches]
            self.offset += len(piece)
        mx.eval(self.keys, self.values)

    def propose(self, pending: list[int], num_tokens: int, keys: mx.array | None) -> tuple[mx.array, mx.array | None]:
        """Lazily draft num_tokens after feeding `pending`; the cache keeps pending + the first K-1 drafts."""
        self.reserve(self.offset + len(pending) + num_tokens)
        random_keys = keys if keys is not None else mx.zeros((0,))
        keys, values = self.keys, self.values
        self.keys = self.values = []  # drop our references so the graph may update the buffers in place
        tokens, probs, self.keys, self.values = self._chain(
            mx.array(pending, dtype=mx.int32),
            mx.array(self.offset, dtype=mx.int32),
            keys,
            values,
            random_keys,
            num_tokens,
        )
        del keys, values
        self.offset += len(pending) + num_tokens - 1
        mx.async_eval(tokens)  # the draft computes while the engine builds the target's graph
        return tokens, (probs if probs.size else None)

    def trim(self, num_tokens: int) -> None:
        self.offset -= num_tokens


def chain_costs(
    model: nn.Module,
    target: nn.Module,
    sampling: SamplingConfig,
    context: int = 256,
    repeats: int = 7,
    chain: int = DRAFT_CHAIN,
) -> tuple[float, float]:
    """(seconds a draft token, seconds once per step): the compiled chain timed as a step runs it, right after a
    target forward (which evicts the draft's weights from the caches, so its first forward runs cold), drafting 1
    and then `chain` tokens each round. The cost curve times the draft eagerly, one forward at a time, which for
    the embedded 1.3M draft said 2.45 ms a token where the compiled chain takes about 1."""
    import statistics
    import time

    drafter = CompiledDraftChain(model, sampling, 1)
    drafter.prefill([0] * context)
    target_cache = make_prompt_cache(target)
    mx.eval(target(mx.zeros((1, 16), dtype=mx.int32), cache=target_cache))
    ones, chains = [], []
    for round_ in range(repeats + 1):  # the first round traces each length and is not counted
        for length, times in ((1, ones), (chain, chains)):
            mx.eval(target(mx.zeros((1, 1), dtype=mx.int32), cache=target_cache))
            keys = None if sampling.greedy else mx.random.split(mx.random.key(round_), length)
            start = time.perf_counter()
            tokens, probs = drafter.propose([0], length, keys)
            mx.eval(tokens, probs if probs is not None else tokens)
            if round_:
                times.append(time.perf_counter() - start)
            drafter.trim(length)
    one, whole = statistics.median(ones), statistics.median(chains)
    per_token = max(0.0, (whole - one) / (chain - 1))
    return per_token, max(0.0, one - per_token)
