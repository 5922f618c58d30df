"""build_engine: the one place a SpeculativeEngine is assembled from a target, a drafter and DecodeOptions.

The Speculator, bench, the tests and the scripts all call it, so a new engine setting is wired once.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxspec.decoding.draft import Drafter
from mlxspec.decoding.engine import SpeculativeEngine
from mlxspec.decoding.forward import Ranks
from mlxspec.decoding.processors import make_processors, processor_window
from mlxspec.options import DecodeOptions


def build_engine(
    target: nn.Module,
    drafter: Drafter | None,
    options: DecodeOptions,
    *,
    seed: int | None = None,
    context_length: int | None = None,
    controller: Any = None,
    cache: list | None = None,
    ranks: Ranks | None = None,
    first_token_mask: mx.array | None = None,
    **settings: Any,
) -> SpeculativeEngine:
    """An engine decoding `target` with `drafter` (None: plainly) as `options` say: their sampling, draft depth,
    node budget and KV bits. `seed` overrides options.seed (a drawn random seed); `cache` continues a kept target
    cache (prompt_cache.py); `controller` adapts each step's draft length (draft_length.DraftLengthController); `ranks`
    share a sharded target; `settings` reach the engine as they are (max_merged_replay, prefill_chunk)."""
    if seed is None:
        seed = options.seed or 0
    engine = SpeculativeEngine(
        target,
        drafter,
        options.sampling,
        num_draft=options.depth,
        seed=seed,
        acceptance=options.acceptance_rule(),  # by the caller's seed, not a drawn `seed`
        processors=make_processors(options),
        processor_window=processor_window(options),
        logprobs=options.logprobs,
        kv_bits=options.kv_bits,
        context_length=context_length,
        max_nodes=options.max_nodes,
        controller=controller,
        cache=cache,
        **settings,
    )
    engine.ranks = ranks
    engine.first_token_mask = first_token_mask
    return engine
