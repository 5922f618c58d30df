"""The one name of the mode a drafter runs in (results.mode_name), for -v, --json, stats.mode and bench rows."""

from __future__ import annotations

from mlxspec.decoding.draft import Drafter
from mlxspec.drafting.draft_model.drafter import DraftModelDrafter
from mlxspec.drafting.lookup.drafter import PromptLookupDrafter
from mlxspec.options import DecodeOptions
from mlxspec.results import mode_name


def describe_drafter(drafter: Drafter | None, options: DecodeOptions) -> str:
    """What drafted, by results.mode_name, for -v, --json and stats.mode."""
    from mlxspec.drafting.cross_tokenizer.drafter import CrossTokenizerDrafter
    from mlxspec.drafting.dflash.drafter import DFlashDrafter
    from mlxspec.drafting.heads.feature_drafter import FeatureDrafter
    from mlxspec.drafting.heads.hydra import HydraDrafter
    from mlxspec.drafting.heads.medusa import MedusaDrafter

    if drafter is None:
        return "plain"
    inner = getattr(drafter, "model", None) if hasattr(drafter, "lookup") else None  # lookup backed by a drafter
    alone = inner or drafter
    if isinstance(alone, FeatureDrafter):
        kind = alone.wired.head.config.kind if alone.wired.head.config.kind in ("eagle", "eagle3") else "mtp"
    else:
        names = {
            DraftModelDrafter: "draft",
            CrossTokenizerDrafter: "draft-xtok",  # a draft model with another tokenizer
            PromptLookupDrafter: "lookup",
            MedusaDrafter: "medusa",
            HydraDrafter: "medusa",  # Hydra heads load with --medusa; their config names the style
            DFlashDrafter: "dflash",
        }
        kind = names.get(type(alone), type(alone).__name__)
    if inner is not None:
        kind = f"lookup+{kind}"
    if isinstance(drafter, PromptLookupDrafter):
        return mode_name(kind, lookup_candidates=options.lookup_candidates)
    nodes = alone.max_nodes if isinstance(alone, (FeatureDrafter, DFlashDrafter)) else 0
    depth = min(options.depth, alone.max_depth or options.depth)  # Medusa guesses no deeper than its heads
    return mode_name(kind, depth=depth, tree_topk=options.tree_topk, tree_nodes=nodes)
