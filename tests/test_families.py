"""Every model family the installed mlx-lm ships, swept (family_sweep.py): a tiny random model of each, decoded
greedily by mlxspec in each mode and compared token for token with mlx-lm's own greedy decoding.

CI runs no-draft, the draft chain and the tree for every family; prompt lookup and --kv-bits 8 run behind the
`heavy` marker (`pytest -m heavy`), and `scripts/sweep_families.py` runs all five and writes the table in
docs/families.md. Each test also checks that the table (docs/families.json) still says what the sweep finds, so
it cannot go stale.
"""

import json
from pathlib import Path

import pytest
from family_sweep import MODES, Outcome, build, family_names, sweep_family, sweep_in_subprocess
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache

TABLE = json.loads((Path(__file__).parent.parent / "docs" / "families.json").read_text())
CI_MODES = ("no-draft", "chain", "tree")
HEAVY_MODES = tuple(m for m in MODES if m not in CI_MODES)


def check(family: str, modes: tuple[str, ...]) -> None:
    # A family no tiny config builds for runs in a process of its own: phi3small's tiny config corrupts MLX's heap,
    # and crashes the process or raises, at random.
    unbuilt = TABLE[family]["no-draft"]["status"] == "not run"
    outcomes = sweep_in_subprocess(family, modes) if unbuilt else sweep_family(family, modes)
    for mode, outcome in outcomes.items():
        assert outcome.status not in ("mismatch", "error"), (mode, outcome)
        assert outcome.status == TABLE[family][mode]["status"], f"docs/families.md's table is stale for {family} {mode}"
        if outcome.status == "exact" and mode != "no-draft":
            assert outcome.accepted > 0, (mode, outcome)  # drafts were really accepted
    # ... and really rejected, across the family's five modes (those not run here as the table records them): a
    # tiny gemma repeats its last token whatever its weights, so its chain and lookup drafts are all accepted, while
    # its tree's siblings are rejected.
    recorded = {m: Outcome(**o) for m, o in TABLE[family].items() if m not in outcomes}
    drafting = [o for m, o in {**recorded, **outcomes}.items() if m != "no-draft" and o.status == "exact"]
    assert not drafting or any(o.accepted < o.drafted for o in drafting), outcomes
    if "chain" in outcomes and outcomes["no-draft"].status == "exact":
        # Parity: a family mlx-lm itself speculates on (every cache trimmable) must draft exactly here too.
        if can_trim_prompt_cache(make_prompt_cache(build(family))):
            assert outcomes["chain"].status == "exact", outcomes["chain"]


SLOW_FAMILIES = {"jamba", "gpt_bigcode", "afm7"}  # 10-15 s each on 2 cores: in the whole suite, not the quick run


@pytest.mark.parametrize(
    "family", [pytest.param(f, marks=pytest.mark.slow) if f in SLOW_FAMILIES else f for f in family_names()]
)
def test_family_decodes_exactly(family):
    check(family, CI_MODES)


@pytest.mark.heavy
@pytest.mark.parametrize("family", family_names())
def test_family_decodes_exactly_with_lookup_and_quantized_kv(family):
    check(family, HEAVY_MODES)


def test_every_family_mlx_lm_ships_is_in_the_table():
    assert sorted(TABLE) == family_names()


def test_the_tree_check_tells_families_the_tree_pass_drives_from_those_it_cannot():
    """gpt2 adds a learned position table indexed by cache.offset, which per-token RoPE cannot move: its tree nodes
    would sit at prefix + index instead of prefix + depth. llama's positions all come from its `rope` module."""
    from mlxspec.cache.rollback import make_speculative_cache
    from mlxspec.decoding.tree_attention import tree_supported

    for family, expected in (("llama", True), ("gemma3_text", True), ("gpt2", False)):
        model = build(family)
        assert tree_supported(model, lambda m=model: make_speculative_cache(m, max_rollback=4)) is expected, family
