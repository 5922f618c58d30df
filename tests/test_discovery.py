"""Drafters found, not guessed (drafting/discovery.py): a fake Hugging Face cache holding matching and mismatched
drafters of every kind. `--draft auto` picks the best one with one line that says why, output stays exact,
`mlxspec drafters` lists every candidate with its reason, and nothing is downloaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_mtp_heads import tiny_target as tiny_mtp_target
from test_mtp_heads import write_checkpoint
from tiny import make_tiny, save_tiny_model_dir
from tiny_dflash import save_zlab_dflash
from tiny_eagle3 import save_speculators_eagle3

from mlxspec.drafting.discovery import find_drafters, pick

LAYERS = 8


def snapshot(cache: Path, repo: str) -> Path:
    """A cache entry as huggingface_hub lays it out: models--org--name/{refs/main, snapshots/<hash>}."""
    entry = cache / f"models--{repo.replace('/', '--')}"
    (entry / "refs").mkdir(parents=True, exist_ok=True)
    (entry / "refs" / "main").write_text("abc123")
    path = entry / "snapshots" / "abc123"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """org/target (llama, 8 layers) and, around it, a drafter of every kind, each also in a mismatched version."""
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    target_dir = save_tiny_model_dir(snapshot(hub, "org/target"), "llama", seed=1, num_hidden_layers=LAYERS)
    target = make_tiny("llama", seed=1, num_hidden_layers=LAYERS)
    save_zlab_dflash(snapshot(hub, "z-lab/target-DFlash-b16"), target, taps=[1, 6])
    save_zlab_dflash(snapshot(hub, "z-lab/other-DFlash"), make_tiny("llama", num_hidden_layers=4), taps=[1, 2])
    eagle3 = save_speculators_eagle3(snapshot(hub, "org/target-eagle3"), target, aux=[1, 3, 6])
    foreign = save_speculators_eagle3(snapshot(hub, "org/other-eagle3"), target, aux=[1, 3, 6])
    raw = json.loads((foreign / "config.json").read_text())
    raw["speculators_config"]["verifier"]["name_or_path"] = "org/other-model"
    (foreign / "config.json").write_text(json.dumps(raw))
    raw = json.loads((eagle3 / "config.json").read_text())
    raw["speculators_config"]["verifier"]["name_or_path"] = "org/target"
    (eagle3 / "config.json").write_text(json.dumps(raw))
    save_tiny_model_dir(snapshot(hub, "org/small-draft"), "llama", seed=3, num_hidden_layers=1)
    save_tiny_model_dir(snapshot(hub, "org/other-tokenizer"), "llama", num_hidden_layers=1, tokenizer_chars="hijklmn")
    return hub, target_dir


def by_source(candidates):
    return {c.source: c for c in candidates}


def test_every_cached_drafter_is_judged_and_the_best_fit_is_picked(cache):
    hub, target_dir = cache
    found = by_source(find_drafters(target_dir, "org/target"))
    assert found["z-lab/target-DFlash-b16"].matches
    assert found["z-lab/target-DFlash-b16"].named_for_target  # its repo name names the target
    assert not found["z-lab/other-DFlash"].matches and "layers 4 (target: 8)" in found["z-lab/other-DFlash"].why
    assert found["org/target-eagle3"].matches
    assert not found["org/other-eagle3"].matches and "made for 'org/other-model'" in found["org/other-eagle3"].why
    assert found["org/small-draft"].matches and "tokenizer" in found["org/small-draft"].why
    assert not found["org/other-tokenizer"].matches and "vocabulary differs" in found["org/other-tokenizer"].why
    assert "org/target" not in found  # the target is not its own draft
    assert pick(find_drafters(target_dir, "org/target")).source == "z-lab/target-DFlash-b16"
    shutil.rmtree(hub / "models--z-lab--target-DFlash-b16")
    assert pick(find_drafters(target_dir, "org/target")).source == "org/target-eagle3"
    shutil.rmtree(hub / "models--org--target-eagle3")
    assert pick(find_drafters(target_dir, "org/target")).source == "org/small-draft"
    shutil.rmtree(hub / "models--org--small-draft")
    assert pick(find_drafters(target_dir, "org/target")) is None


def test_draft_auto_loads_the_pick_says_why_in_one_line_and_stays_exact(cache, cli_run):
    hub, target_dir = cache
    common = ("generate", "abcab", "--model", target_dir, "--max-tokens", "12", "-k", "3", "--json")
    code, plain, err = cli_run(*common, "--no-draft")
    assert code == 0, err
    code, out, err = cli_run(*common)
    assert code == 0, err
    result = json.loads(out)
    assert result["drafter_choice"]["chosen"]["source"] == "z-lab/target-DFlash-b16"
    assert result["mode"].startswith("dflash") and result["tokens"] == json.loads(plain)["tokens"]
    lines = [line for line in err.splitlines() if "--draft auto" in line]
    assert len(lines) == 1 and "--dflash z-lab/target-DFlash-b16 from the cache" in lines[0]
    # A pick that fails to load is passed over, with its reason, for the next one.
    (hub / "models--z-lab--target-DFlash-b16" / "snapshots" / "abc123" / "model.safetensors").write_bytes(b"junk")
    code, out, err = cli_run(*common)
    assert code == 0, err
    choice = json.loads(out)["drafter_choice"]
    assert choice["chosen"]["source"] == "org/target-eagle3" and "z-lab/target-DFlash-b16" in choice["passed_over"][0]
    assert json.loads(out)["tokens"] == json.loads(plain)["tokens"]


def test_with_nothing_that_fits_prompt_lookup_drafts_and_says_so(tmp_path, monkeypatch, cli_run):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    target_dir = save_tiny_model_dir(tmp_path / "target", "llama", seed=1)
    code, out, err = cli_run("generate", "abcab", "--model", target_dir, "--max-tokens", "8", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["mode"].startswith("lookup")
    from mlxspec.drafting.discovery import local_heads

    shipped = len(local_heads())  # the heads shipped for published models are always weighed (and do not fit)
    line = f"no cached drafter fits this target ({shipped} considered); prompt lookup drafts"
    assert line in result["drafter_choice"]["line"]
    assert "--draft auto" not in err  # lookup, as before: nothing to say on stderr


def test_the_drafters_command_lists_fits_and_misfits_with_reasons(cache, cli_run):
    code, out, err = cli_run("drafters", "--model", "org/target", "--json")
    assert code == 0, err
    listed = json.loads(out)
    assert listed["pick"]["source"] == "z-lab/target-DFlash-b16"
    reasons = {c["source"]: (c["matches"], c["why"]) for c in listed["candidates"]}
    assert reasons["org/other-tokenizer"][0] is False and reasons["org/small-draft"][0] is True
    code, out, err = cli_run("drafters", "--model", "org/target", "--all")
    assert code == 0 and "no   dflash" in out and "fits dflash" in out and "--draft auto: --dflash" in out
    code, out, err = cli_run("drafters", "--model", "org/nowhere")
    assert code == 2 and "nor a repo in the local Hugging Face cache" in err and len(err.strip().splitlines()) == 1


def test_the_targets_own_mtp_head_is_found_in_its_files_or_a_cached_original(tmp_path, monkeypatch):
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    target = tiny_mtp_target("qwen3_next", tmp_path)
    target.path.mkdir(parents=True)
    (target.path / "config.json").write_text(json.dumps(target.config))
    assert [c for c in find_drafters(target.path) if c.kind == "mtp"] == []  # converted: no mtp.* tensors
    original = snapshot(hub, "Qwen/Qwen3-Next-tiny")
    (original / "config.json").write_text(json.dumps(target.config))
    write_checkpoint("qwen3_next", target.model, original)
    (mtp,) = [c for c in find_drafters(target.path) if c.kind == "mtp"]
    assert mtp.matches and mtp.source == "Qwen/Qwen3-Next-tiny" and "cached original checkpoint" in mtp.why
    write_checkpoint("qwen3_next", target.model, target.path)
    first = pick(find_drafters(target.path))
    assert first.kind == "mtp" and "own files" in first.why
