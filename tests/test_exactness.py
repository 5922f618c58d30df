"""Greedy exactness over every drafter, in one parametrized test: whatever drafts (a draft model's chain or tree,
an EAGLE head's chain or dynamic tree, Medusa and Hydra heads, prompt lookup), speculative greedy decoding gives
mlx-lm's own greedy tokens (`assert_greedy_equal`: exact unless a near-tie under 1e-4 explains a difference), on
every family."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from helpers import assert_greedy_equal, mlx_lm_greedy, speculative_tokens
from test_engine_exactness import PROMPTS
from test_feature_heads import drafter_for, random_head
from test_hydra import random_hydra
from test_medusa import random_heads
from tiny import FAMILIES, make_tiny

from mlxspec.drafting.heads.hydra import HydraDrafter
from mlxspec.drafting.heads.medusa import MedusaDrafter
from mlxspec.drafting.lookup.drafter import PromptLookupDrafter


@dataclass(frozen=True)
class Case:
    """How one drafter is built on a target, and how far each run decodes."""

    make: Callable  # (target, draft model) -> the keyword arguments of speculative_tokens
    tokens: int = 20


def draft_chain(num_draft: int) -> Case:
    return Case(lambda target, draft: dict(draft=draft, num_draft=num_draft), tokens=24)


def draft_tree(topk: int) -> Case:
    return Case(lambda target, draft: dict(draft=draft, num_draft=3, tree_topk=topk))


def eagle(beam: int) -> Case:
    def make(target, draft):
        return dict(drafter=drafter_for(random_head(target), target, beam=beam, nodes=7), num_draft=3, tree_topk=beam)

    return Case(make)


def medusa(topk: int) -> Case:
    def make(target, draft):
        return dict(drafter=MedusaDrafter(random_heads(target), target, tree_nodes=6, tree_topk=topk), num_draft=3)

    return Case(make)


def hydra(topk: int) -> Case:
    def make(target, draft):
        return dict(drafter=HydraDrafter(random_hydra(target), target, tree_nodes=6, tree_topk=topk), num_draft=3)

    return Case(make)


def lookup(candidates: int) -> Case:
    return Case(lambda target, draft: dict(drafter=PromptLookupDrafter(max_candidates=candidates), num_draft=4))


CASES = {
    **{f"draft-chain-k{k}": draft_chain(k) for k in (1, 2, 4, 8)},
    **{f"draft-tree-top{k}": draft_tree(k) for k in (2, 3)},
    "eagle-chain": eagle(1),
    "eagle-tree-beam3": eagle(3),
    "medusa-chain": medusa(1),
    "medusa-tree": medusa(2),
    "hydra-chain": hydra(1),
    "hydra-tree": hydra(2),
    "lookup-chain": lookup(1),
    "lookup-tree": lookup(3),
}
# Lookup drafts only where the context repeats: its prompts repeat themselves.
REPEATING = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [5, 0, 5, 0, 5, 0, 2], [7, 3, 7, 3, 7]]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_speculation_equals_mlx_lm_greedy_for_every_drafter(family, case):
    target, draft = make_tiny(family, seed=0), make_tiny(family, seed=1)
    spec = CASES[case]
    for prompt in REPEATING if case.startswith("lookup") else PROMPTS:
        # A fresh drafter per prompt (drafters keep per-run state); its random heads are seeded, so alike.
        arguments = spec.make(target, draft)
        got = speculative_tokens(target, arguments.pop("draft", None), prompt, spec.tokens, **arguments)
        assert_greedy_equal(target, prompt, got, mlx_lm_greedy(target, prompt, spec.tokens))
