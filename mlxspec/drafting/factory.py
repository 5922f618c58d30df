"""make_drafter: the one place drafters are wired from DecodeOptions."""

from __future__ import annotations

from typing import Any

import mlx.nn as nn
import numpy as np

from mlxspec.decoding.draft import Drafter
from mlxspec.drafting.draft_model.drafter import DraftModelDrafter
from mlxspec.drafting.lookup.drafter import LookupThenModelDrafter, PromptLookupDrafter
from mlxspec.errors import UserError
from mlxspec.options import DecodeOptions


def make_drafter(
    options: DecodeOptions,
    draft_model: nn.Module | None = None,
    medusa: Any = None,
    target_model: nn.Module | None = None,
    successors: np.ndarray | None = None,
    feature_head: Any = None,
    dflash: Any = None,
    suffix_index: Any = None,
    vocab_bridge: Any = None,
) -> Drafter | None:
    """The drafter `options` ask for: a DFlash block drafter, a feature head (EAGLE or MTP) or Medusa heads (on
    target_model), or a draft model, optionally behind prompt lookup (with its corpus table `successors`, and with
    options.suffix the shared `suffix_index` of earlier requests); None decodes plainly. A draft model with another
    tokenizer comes with its `vocab_bridge` (vocab_bridge.py). The one place drafters are wired."""
    sampling, depth = options.sampling, options.depth
    max_nodes = options.tree_nodes or depth * options.tree_topk  # the node budget of a dynamic tree or a DDTree
    model_drafter: Drafter | None = None
    if options.use_draft and dflash is not None:
        from mlxspec.drafting.dflash.drafter import DFlashDrafter

        model_drafter = DFlashDrafter(
            dflash,
            target_model,
            sampling,
            tree_topk=options.tree_topk,
            max_nodes=max_nodes,
        )
    elif options.use_draft and feature_head is not None:
        from mlxspec.drafting.heads.feature_drafter import FeatureDrafter

        model_drafter = FeatureDrafter(
            feature_head.on_target(target_model),
            sampling,
            beam=options.tree_topk,
            max_nodes=max_nodes,
        )
    elif options.use_draft and medusa is not None:
        from mlxspec.drafting.heads.medusa import medusa_drafter

        model_drafter = medusa_drafter(medusa, target_model, max_nodes, options.tree_topk)
    elif options.use_draft and draft_model is not None and vocab_bridge is not None:
        from mlxspec.drafting.cross_tokenizer.drafter import CrossTokenizerDrafter

        model_drafter = CrossTokenizerDrafter(draft_model, vocab_bridge, sampling, depth)
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
        raise UserError("a tree needs a drafter that branches: pass a draft model, Medusa heads or --dflash")
    if not options.lookup:
        return model_drafter
    lookup = PromptLookupDrafter(
        max_candidates=options.lookup_candidates,
        successors=successors if options.corpus_fallback else None,
        shared=suffix_index if options.suffix else None,
    )
    return LookupThenModelDrafter(lookup, model_drafter) if model_drafter is not None else lookup
