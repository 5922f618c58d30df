"""Each run's drafter and adaptive draft-length controller, built from one load's drafters.

A Speculator holds one DrafterProvider. Per run it is asked for a drafter for that run's options (drafters keep
per-run state, so every run gets its own) and, where the draft length adapts, the controller that picks it. What
is found or measured once per load is kept here: whether the target's cache can roll back at all, prompt lookup's
corpus table, and a block drafter's time per proposal.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from mlxspec.cache.rollback import cannot_roll_back, rollback_blocker
from mlxspec.decoding.costs import model_curve, why_drafting_cannot_pay
from mlxspec.decoding.draft import Drafter
from mlxspec.decoding.draft_length import DraftLengthController
from mlxspec.drafting.cross_tokenizer.bridge import VocabBridge
from mlxspec.drafting.cross_tokenizer.drafter import CrossTokenizerDrafter
from mlxspec.drafting.dflash.drafter import DFlashDrafter, block_seconds
from mlxspec.drafting.draft_model.compiled import chain_costs
from mlxspec.drafting.draft_model.drafter import DraftModelDrafter
from mlxspec.drafting.factory import make_drafter
from mlxspec.drafting.heads.feature_drafter import FeatureDrafter
from mlxspec.drafting.lookup.drafter import LookupThenModelDrafter, PromptLookupDrafter
from mlxspec.drafting.lookup.suffix_index import SuffixIndex
from mlxspec.loading import LoadedModel
from mlxspec.options import DecodeOptions

# Drafters whose draft length the controller may set; trees and the rest draft what their options say.
ADAPTIVE = (
    DraftModelDrafter,
    CrossTokenizerDrafter,
    PromptLookupDrafter,
    LookupThenModelDrafter,
    FeatureDrafter,
    DFlashDrafter,
)


@dataclass
class RunDrafting:
    """What one run drafts with: the drafter (None: plain decoding), its controller (None: a fixed length), and a
    note when the run falls back to plain decoding."""

    drafter: Drafter | None
    controller: DraftLengthController | None = None
    note: str = ""


def is_compiled_chain(drafter: Any) -> bool:
    return isinstance(drafter, DraftModelDrafter) and drafter.compiled is not None


class DrafterProvider:
    """The loaded drafters (at most one of draft, medusa, feature_head, dflash) and what is measured once for them."""

    def __init__(
        self,
        target: LoadedModel,
        draft: LoadedModel | None = None,
        medusa: Any = None,
        feature_head: Any = None,
        dflash: Any = None,
        vocab_bridge: VocabBridge | None = None,
    ):
        self.target, self.draft, self.medusa = target, draft, medusa
        self.feature_head, self.dflash, self.vocab_bridge = feature_head, dflash, vocab_bridge
        self._blocker: str | None = None  # the cache type that cannot be rolled back ("" for none), once known
        self._successors = None  # prompt lookup's corpus table, loaded on first use
        # Drafter costs timed once per load: a DFlash proposal (by greedy), a draft chain's parts ("chain", greedy)
        self._timings: dict = {}
        # The latest run's controller per kind of drafting: the next run of that kind starts from what it learned
        self._controllers: dict[tuple, DraftLengthController] = {}

    @property
    def has_model_drafter(self) -> bool:
        return any(x is not None for x in (self.draft, self.medusa, self.feature_head, self.dflash))

    def for_run(
        self,
        options: DecodeOptions,
        target: Any,
        head: Any,
        suffix_index: SuffixIndex | None = None,
        lookup_by_default: bool = False,
        draft_model: Any = None,
    ) -> RunDrafting:
        """The drafting of one run with these options; `target`, `head` and `draft_model`: the target model, feature
        head and draft model as this run calls them (routed through the verify kernel or not; no draft_model: the
        draft model as loaded). `lookup_by_default`: prompt lookup is on for
        every run of this load, so a target that cannot roll back decodes plainly (with a note) instead of refusing
        a run that did not ask for lookup itself."""
        wants_model = options.use_draft and self.has_model_drafter
        if not (wants_model or options.lookup):
            return RunDrafting(make_drafter(options))  # None, or the refusal of a tree with nothing to branch
        if self._blocker is None:  # the target's cache layout does not change: look once
            self._blocker = rollback_blocker(self.target.model) or ""
        if self._blocker:
            if wants_model or not lookup_by_default:  # asked for by name: refuse rather than silently not draft
                raise cannot_roll_back(self.target.model, self._blocker)
            note = f"the target keeps recurrent state ({self._blocker}) that cannot be rolled back; decoding plainly"
            return RunDrafting(None, None, note)
        drafter = make_drafter(
            options,
            draft_model=draft_model or (self.draft.model if self.draft is not None else None),
            medusa=self.medusa,
            target_model=target,
            successors=self.corpus_successors() if options.lookup and options.corpus_fallback else None,
            feature_head=head,
            dflash=self.dflash,
            suffix_index=suffix_index if options.suffix else None,
            vocab_bridge=self.vocab_bridge,
        )
        if not (options.adaptive and options.tree_topk == 1 and isinstance(drafter, ADAPTIVE)):
            return RunDrafting(drafter)
        is_block = isinstance(drafter, DFlashDrafter)
        model_part = drafter.model if isinstance(drafter, LookupThenModelDrafter) else drafter
        # Leviathan/Chen's draws are split per step, so its text follows the lengths drafted: those then follow the
        # text and the stored curve alone (no timing of this load, no carry from earlier runs), so a seed repeats
        # its text from run to run.
        residual = options.acceptance_rule() == "residual" and not options.sampling.greedy
        controller = self.draft_length_controller(
            options.depth,
            with_draft=isinstance(model_part, (DraftModelDrafter, CrossTokenizerDrafter)),
            kernel=options.kernel,
            block_seconds=self.block_seconds(drafter, target, options) if is_block and not residual else 0.0,
            chain=self.chain_costs(target, options) if is_compiled_chain(model_part) and not residual else None,
            kind=None if residual else (type(drafter), options.depth, options.sampling.greedy, options.kernel),
        )
        controller.timed = not residual
        if not controller.can_win:
            return RunDrafting(None, None, why_drafting_cannot_pay(controller.curve, options.depth))
        if isinstance(drafter, PromptLookupDrafter):
            # Lookup drafts what matches, up to the controller's k, and pauses where its acceptance cannot pay
            # (English at T=0.7 ran at 0.75x plain without). Not by step timings: its lengths then follow the text
            # alone, so a seed repeats its text.
            controller.timed = False
        return RunDrafting(drafter, controller)

    def draft_length_controller(
        self,
        max_draft: int,
        with_draft: bool = True,
        kernel: str = "auto",
        block_seconds: float = 0.0,
        chain: tuple[float, float] | None = None,
        kind: tuple | None = None,
    ) -> DraftLengthController:
        """Adaptive draft length from this device's measured cost curve (measured once, then cached); a block
        drafter's one forward per step (block_seconds) is paid whatever the length."""
        draft = self.draft if with_draft else None
        # Up to 64 tokens: a batch of rows verifies rows * (k + 1) tokens in one forward (batching.py).
        sizes = tuple(sorted({*range(1, max_draft + 2), 16, 32, 64}))
        curve = model_curve(self.target, draft, sizes, kernel=kernel)
        # Every drafter pauses where no length pays: decoding plainly, with a one-token probe every few steps, costs
        # less than a draft token per step that is rarely accepted (the default on the embedded models ran at
        # 0.87-0.95x plain without it).
        curve = replace(curve, draft_block=curve.draft_block + block_seconds)
        if chain is not None:  # the draft model as its compiled chain runs, in place of the curve's eager timing
            curve = replace(curve, draft_one=chain[0], draft_block=chain[1])
        controller = DraftLengthController(curve, max_draft, pause=True)
        if kind is not None:  # it starts from what the last run of this kind learned
            controller.carry_from(self._controllers.get(kind))
            self._controllers[kind] = controller
        return controller

    def block_seconds(self, drafter: DFlashDrafter, target: Any, options: DecodeOptions) -> float:
        """One block drafter proposal at context 256, drawn as these options draw it (greedy, or sampled with the
        filters), timed once per load and kind."""
        key = options.sampling.greedy
        if key not in self._timings:
            self._timings[key] = block_seconds(drafter.model, target, options.sampling)
        return self._timings[key]

    def chain_costs(self, target: Any, options: DecodeOptions) -> tuple[float, float]:
        """The draft model's compiled chain timed as a step runs it (compiled.chain_costs), once per load and kind
        (greedy or sampled): the stored curve times it eagerly, at twice its cost on the embedded bed."""
        key = ("chain", options.sampling.greedy)
        if key not in self._timings:
            self._timings[key] = chain_costs(self.draft.model, target, options.sampling)
        return self._timings[key]

    def corpus_successors(self):
        """Prompt lookup's fallback table for this tokenizer (built once per machine, then read once per load)."""
        if self._successors is None:
            from mlxspec.drafting.lookup.ngram_table import corpus_successors

            self._successors = corpus_successors(self.target.tokenizer, self.target.vocab_size)
        return self._successors
