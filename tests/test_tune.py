"""`mlxspec tune` (bench/tune.py, cli/tune.py) and the exactness probe (bench/exactness.py): plain decoding wins
unless a drafter beats it by 3%, the choice is stored per machine and model and used by generate unless set by hand
or --no-tune, a changed drafter or a slower run drops it, and the probe tells equal, near-tie and mismatch apart."""

from __future__ import annotations

import json

import pytest

from mlxspec.bench.exactness import ProbeResult, probe
from mlxspec.bench.runner import OWN_PLAIN, ModeResult
from mlxspec.bench.tune import Regime, Setting, choose, drop_if_slower, load_tune, save_tune, settings_for, tuned_regime
from mlxspec.loading import DEFAULT_DRAFT


def result(mode: str, rate: float) -> ModeResult:
    return ModeResult(mode, rate, rate, rate, 0.5, 2.0, 0.5, 0)


def test_plain_decoding_wins_unless_a_drafter_beats_it_by_three_percent():
    settings = {s.name: s for s in settings_for("plain", None) + settings_for("draft", "d")}
    draft_k3 = Setting("draft", "d", 3).name
    assert choose([result(OWN_PLAIN, 100.0), result(draft_k3, 102.9)], settings).choice.drafter == "plain"
    picked = choose([result(OWN_PLAIN, 100.0), result(draft_k3, 103.5)], settings)
    assert picked.choice == Setting("draft", "d", 3) and picked.plain_tokens_per_second == 100.0
    # a drafter made useless (slower than plain) is never chosen
    assert choose([result(OWN_PLAIN, 100.0), result(draft_k3, 60.0)], settings).choice.drafter == "plain"


def with_tau(mode: str, rate: float, tau: float) -> ModeResult:
    return ModeResult(mode, rate, rate, rate, 0.5, tau, 0.5, 0)


def test_the_fastest_setting_that_drafted_is_chosen_over_one_that_barely_drafted():
    """Issue 44: eagle 138.5 tok/s at tau 1.01 and draft at 1.03 barely drafted (their speed is plain's noise);
    lookup drafted (tau 1.13) at 113.8 against plain's 100.8. It printed "plain" with no reason."""
    settings = {s.name: s for s in settings_for("plain", None) + settings_for("lookup", None)}
    settings |= {s.name: s for s in settings_for("eagle", "e") + settings_for("draft", "d")}
    eagle, draft = Setting("eagle", "e", 3).name, Setting("draft", "d", 3).name
    lookup = Setting("lookup", None, "auto").name
    rows = [
        with_tau(OWN_PLAIN, 100.8, 1.0),
        with_tau(eagle, 138.5, 1.01),
        with_tau(draft, 119.6, 1.03),
        with_tau(lookup, 113.8, 1.13),
    ]
    picked = choose(rows, settings)
    assert picked.choice == settings[lookup] and "fastest setting that drafted" in picked.reason
    rows[3] = with_tau(lookup, 101.0, 1.13)  # lookup drafts but does not beat plain by 3%: plain, and why
    picked = choose(rows, settings)
    assert picked.choice.drafter == "plain" and f"{lookup} at 101.0 tok/s" in picked.reason
    picked = choose(rows[:3], settings)
    assert picked.choice.drafter == "plain" and "no setting drafted" in picked.reason


def test_every_drafter_gets_chains_auto_and_its_trees():
    names = [s.name for s in settings_for("eagle3", "e")]
    assert "mlxspec eagle3 k=3" in names and "mlxspec eagle3 k=auto" in names
    assert "mlxspec eagle3-tree-16n-beam4" in names
    assert all(s.num_draft in (3, 5, 7, "auto") or s.tree_topk > 1 for s in settings_for("dflash", "f", 7))
    assert [s.name for s in settings_for("draft", "d")][-1] == "mlxspec draft-tree-4x2"


def test_a_stored_choice_is_dropped_when_its_drafter_changes_or_it_runs_slower(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_CACHE", str(tmp_path / "cache"))
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text("{}")
    from mlxspec.bench.tune import file_identity

    key = {"machine": "m", "model": "x", "model_path": "/x", "mlx": "0", "kernel": "cpu"}
    regime = Regime(Setting("draft", str(drafter), 3), 100.0, 150.0)
    save_tune(key, {"greedy": regime}, {str(drafter): file_identity(drafter)})
    name, held, why = tuned_regime(load_tune(key), 0.0)
    assert name == "greedy" and held == regime and why == ""
    assert tuned_regime(load_tune(key), 0.7)[2] == "nothing tuned for sampled decoding"
    assert drop_if_slower(key, "greedy", 200, 95.0) == ""  # within 10% of plain: kept
    note = drop_if_slower(key, "greedy", 200, 80.0)
    assert "ran slower than plain decoding; dropped it" in note
    assert "dropped" in tuned_regime(load_tune(key), 0.0)[2]
    save_tune(key, {"greedy": regime}, {str(drafter): file_identity(drafter)})
    (drafter / "config.json").write_text('{"changed": 1}')
    assert "changed or is gone" in tuned_regime(load_tune(key), 0.0)[2]


@pytest.mark.slow  # 15-60 s on 2 cores: in the whole suite, not the quick run
def test_tune_stores_a_choice_that_generate_then_runs_exactly_unless_told_not_to(cli_run, tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_CACHE", str(tmp_path / "cache"))
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(["import os\n", "def main():\n    "]))
    code, out, err = cli_run("tune", "--draft", DEFAULT_DRAFT, "--prompts", prompts, "--max-tokens", "8", "--json")
    assert code == 0, err
    record = json.loads(out)
    greedy = Setting(**record["regimes"]["greedy"]["choice"])
    assert {row["mode"] for row in record["regimes"]["greedy"]["rows"]} >= {OWN_PLAIN, "mlxspec draft k=3"}
    assert "pass 1/1" in err  # progress, mode by mode, with the time left
    common = ("generate", "import sys\n", "--max-tokens", "16", "--json")
    code, tuned_out, err = cli_run(*common)
    assert code == 0, err
    assert f"tuned on this machine for greedy decoding: {greedy.name}" in err
    expected_mode = "plain" if greedy.drafter == "plain" else greedy.drafter
    mode = json.loads(tuned_out)["mode"]
    # a tuned -k auto still decodes plainly where this run's measured costs say drafting cannot pay
    assert mode.startswith(expected_mode) or (greedy.num_draft == "auto" and mode == "plain"), mode
    code, plain_out, err = cli_run(*common, "--no-draft")
    assert code == 0 and "tuned on this machine" not in err  # set by hand: the tune steps aside
    assert json.loads(tuned_out)["tokens"] == json.loads(plain_out)["tokens"]
    code, _, err = cli_run(*common, "--no-tune")
    assert code == 0 and "tuned on this machine" not in err


def test_the_exactness_probe_finds_equality_on_the_cpu_and_judges_a_difference_by_its_gap(tiny_dirs):
    import mlxspec

    speculator = mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["target"], num_draft=3)
    assert probe(speculator, tokens=12).verdict == "equal"
    near = ProbeResult("near-tie", 10, 4, 2e-6)
    assert "near-tie" in near.line and "2e-06" in near.line
    assert "please report it" in ProbeResult("mismatch", 10, 4, 1.5).line


def test_generate_check_exact_says_so_in_one_line(cli_run, tiny_dirs):
    code, _, err = cli_run(
        "generate",
        "ab",
        "--model",
        tiny_dirs["target"],
        "--draft",
        tiny_dirs["target"],
        "--max-tokens",
        "4",
        "--check-exact",
    )
    assert code == 0, err
    assert "exactness probe: greedy speculative output equals plain decoding bit for bit" in err


@pytest.mark.parametrize("flags", [("--draft", "nowhere-model-dir"), ("--prompts", "missing.json")])
def test_tune_refuses_bad_input_in_one_line(cli_run, flags, tmp_path):
    code, _, err = cli_run("tune", *flags)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
