"""Bad input, round three (issue 36): each row refused in one line with exit 2 (a UserError through the API), or
correct. The hostile torch checkpoints (rows 1, 2, 4, 5) are in test_hostile_checkpoints.py; the server's rows run
against a real `mlxspec serve` process in test_server_bad_input.py."""

from __future__ import annotations

import json
import shutil
import time

import mlx.core as mx
import pytest
from helpers import assert_one_line
from test_dflash import loaded, tiny_target
from tiny_dflash import save_zlab_dflash

import mlxspec
from mlxspec import UserError
from mlxspec.drafting.dflash.files import load_dflash

G = ("generate", "def f(", "--max-tokens", "8")


# ---- row 3: counts in a config are checked before anything is built from them ----


@pytest.fixture(scope="module")
def medusa_dir(tiny_dirs, tmp_path_factory):
    from mlxspec.drafting.heads.files import base_model_identity
    from mlxspec.drafting.heads.medusa import MedusaConfig, MedusaHeads, save_medusa
    from mlxspec.loading import load_model

    target = load_model(tiny_dirs["target"])
    hidden, vocab = target.config["hidden_size"], target.config["vocab_size"]
    config = MedusaConfig(
        num_heads=2, hidden_size=hidden, vocab_size=vocab, base_model_identity=base_model_identity(target.path)
    )
    path = tmp_path_factory.mktemp("medusa") / "heads"
    save_medusa(MedusaHeads(config), path)
    return path


@pytest.mark.parametrize("heads, message", [(10**9, "num_heads=1000000000"), (2**62, "1-64"), (40, "40, but its")])
def test_a_medusa_config_with_too_many_heads_is_refused_before_building_them(
    cli_run, tiny_dirs, medusa_dir, tmp_path, heads, message
):
    copy = tmp_path / "heads"
    shutil.copytree(medusa_dir, copy)
    config = json.loads((copy / "medusa_config.json").read_text())
    (copy / "medusa_config.json").write_text(json.dumps({**config, "num_heads": heads}))
    start = time.perf_counter()
    assert_one_line(cli_run(*G, "--model", tiny_dirs["target"], "--medusa", copy), message)
    assert time.perf_counter() - start < 60  # (a hang guard: 10^9 heads took 51 s to run out of memory)


@pytest.mark.parametrize(
    "where, key, value, message",
    [
        ("dflash_config", "block_size", 10**9, "block_size=1000000000"),
        ("dflash_config", "block_size", 2**62, "from 2 to 1024"),
        ("", "num_hidden_layers", 10**9, "num_hidden_layers=1000000000"),
        ("", "num_hidden_layers", 200, "200 layers but holds"),
        ("", "hidden_size", "64", "hidden_size='64'"),
        ("", "intermediate_size", [48], "intermediate_size=[48]"),
        ("", "rope_scaling", "linear", "rope_scaling='linear'"),
        ("", "rope_scaling", ["linear", 2], "rope_scaling=['linear', 2]"),
        ("", "rope_scaling", {"rope_type": "linear"}, "factor=None"),
        ("", "rope_scaling", {"rope_type": "longrope", "factor": 8.0}, "is not one mlx-lm can build"),
        ("", "rope_scaling", {"rope_type": "nonsense"}, "is not one mlx-lm can build"),
        ("", "rope_scaling", {"rope_type": 5}, "rope_type=5"),
    ],
)
def test_a_dflash_config_out_of_range_or_of_the_wrong_type_is_refused_by_name(tmp_path, where, key, value, message):
    target = tiny_target("llama")
    path = save_zlab_dflash(tmp_path / "d", target, "old")
    config = json.loads((path / "config.json").read_text())
    (config[where] if where else config)[key] = value
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=None) as error:
        load_dflash(path, loaded(target))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_dflash_drafter_with_linear_rope_scaling_and_a_factor_loads(tmp_path):
    target = tiny_target("llama")
    path = save_zlab_dflash(tmp_path / "d", target, "old")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}))
    assert load_dflash(path, loaded(target)).config.rope_scaling["factor"] == 2.0


assert mx and mlxspec


# ---- row 6: a top-p that is 0 in float32 keeps the best token, as any tiny top-p does ----

EDGE_TOP_PS = [1e-300, 1e-46, 1.4e-45, 1e-40, 1.1754943508222875e-38, 1e-30]


def test_a_top_p_at_the_float32_edges_keeps_the_best_token_in_every_path():
    """Every tiny top-p keeps just the best token: the ranked candidates and the whole-vocabulary ranking that
    redraws a short row (the end-to-end runs below: plain decoding, rejection and match)."""
    import numpy as np

    from mlxspec.decoding.sampling import to_probs_checked, to_probs_sorted
    from mlxspec.options import SamplingConfig

    logits = mx.array(np.random.default_rng(0).normal(size=(3, 5000)).astype(np.float32) * 3)
    best = np.array(mx.argmax(logits, axis=-1))
    for top_p in EDGE_TOP_PS:
        config = SamplingConfig(1.0, top_p, 0, 0.0)
        for probs in (to_probs_checked(logits, config)[0], to_probs_sorted(logits, config)):
            probs = np.array(probs)
            assert np.isfinite(probs).all(), top_p
            assert (probs.argmax(axis=-1) == best).all() and np.allclose(probs.max(axis=-1), 1.0), top_p


@pytest.mark.slow
def test_a_top_p_at_the_float32_edges_samples_the_greedy_text_in_plain_chain_and_lookup_runs(embedded):
    spec = embedded
    prompt = '# Copyright 2001\n"""Utilities for'
    greedy = spec.generate(prompt, max_tokens=12, temperature=0.0, use_draft=False).tokens
    for top_p in (1e-300, 1e-40):
        for changes in (dict(use_draft=False), dict(num_draft=3), dict(use_draft=False, lookup=True)):
            got = spec.generate(prompt, max_tokens=12, temperature=1.0, top_p=top_p, seed=3, **changes).tokens
            assert got == greedy, (top_p, changes)


def test_the_cli_samples_the_greedy_text_at_a_top_p_of_1e_300(cli_run):
    prompt = '# Copyright 2001\n"""Utilities for'
    common = ("generate", prompt, "--max-tokens", "12", "--json")
    code, greedy, err = cli_run(*common, "--temp", "0", "--no-draft")
    assert code == 0, err
    code, tiny, err = cli_run(*common, "--temp", "1", "--top-p", "1e-300", "--no-draft")
    assert code == 0, err
    assert json.loads(tiny)["tokens"] == json.loads(greedy)["tokens"]


# ---- rows 7 and 8: the Python API refuses what it would hang on or misread ----


@pytest.fixture(scope="module")
def embedded():
    return mlxspec.load()


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda s: s.generate_batch(["import os"] * 2, max_batch=-1), "max_batch -1"),
        (lambda s: s.generate_batch(["import os"] * 2, max_batch=0), "max_batch 0"),
        (lambda s: s.generate_batch(["import os"] * 2, max_batch="2"), "max_batch '2'"),
        (lambda s: s.generate_batch(["import os"] * 2, max_batch=True), "max_batch True"),
        (lambda s: s.generate_batch("import os"), "not str; for one, pass [prompt]"),
        (lambda s: s.generate("import os", max_tokens=4, use_draft="False"), "use_draft 'False'"),
        (lambda s: s.generate("import os", max_tokens=4, lookup="no"), "lookup 'no'"),
        (lambda s: s.generate("import os", max_tokens=4, chat="yes"), "chat 'yes'"),
        (lambda s: s.generate("import os", max_tokens=4, stop_at_eos=1), "stop_at_eos 1"),
        (lambda s: s.generate("import os", max_tokens=4, num_draft="²"), "num_draft '²'"),
    ],
)
def test_the_api_refuses_values_it_would_hang_on_or_misread(embedded, call, message):
    spec = embedded
    start = time.perf_counter()
    with pytest.raises(UserError) as error:
        call(spec)
    assert message in str(error.value)
    assert time.perf_counter() - start < 60  # max_batch=-1 spun forever


# ---- row 9: Unicode digits are not numbers ----


@pytest.mark.parametrize("value", ["²", "٣", "１"])
def test_a_unicode_digit_for_k_is_refused_in_one_line(cli_run, value):
    assert_one_line(cli_run(*G, "-k", value), f"'{value}'")


# ---- row 10: one broken entry in the Hugging Face cache is named and passed over ----


def _broken_entries(hub, target_dir):
    from test_discovery import snapshot
    from tiny import make_tiny, save_tiny_model_dir
    from tiny_eagle3 import save_speculators_eagle3

    target = make_tiny("llama", seed=1, num_hidden_layers=8)
    dflash = save_zlab_dflash(snapshot(hub, "bad/dflash-str"), target, taps=[1, 6])
    config = json.loads((dflash / "config.json").read_text())
    (dflash / "config.json").write_text(json.dumps({**config, "hidden_size": "64", "num_target_layers": [8]}))
    eagle3 = save_speculators_eagle3(snapshot(hub, "bad/eagle3-list"), target, aux=[1, 3, 6])
    config = json.loads((eagle3 / "config.json").read_text())
    config["transformer_layer_config"]["hidden_size"] = [64]
    (eagle3 / "config.json").write_text(json.dumps(config))
    sidecar = snapshot(hub, "bad/mtp-sidecar")
    (sidecar / "config.json").write_text(json.dumps({"model_type": "qwen3_5_mtp", "text_config": {"hidden_size": "x"}}))
    for name, tokenizer in (("bad/added-tokens", {"added_tokens": 5}), ("bad/vocab", {"model": {"vocab": [1, 2]}})):
        path = save_tiny_model_dir(snapshot(hub, name), "llama", seed=3, num_hidden_layers=1)
        raw = json.loads((path / "tokenizer.json").read_text())
        if "model" in tokenizer:
            raw["model"]["vocab"] = tokenizer["model"]["vocab"]
        else:
            raw.update(tokenizer)
        (path / "tokenizer.json").write_text(json.dumps(raw))
    ref = hub / "models--bad--ref" / "refs"
    ref.mkdir(parents=True)
    (ref / "main").write_bytes(b"\xff\xfe\x00bad")
    (hub / "models--bad--ref" / "snapshots").mkdir()
    dangling = hub / "models--bad--dangling" / "snapshots"
    dangling.mkdir(parents=True)
    (dangling / "abc").symlink_to(hub / "nowhere")
    looping = hub / "models--bad--loop" / "snapshots"
    looping.mkdir(parents=True)
    (looping / "a").symlink_to(looping / "b")
    (looping / "b").symlink_to(looping / "a")


@pytest.mark.slow
def test_a_broken_cache_entry_is_passed_over_and_the_rest_still_drafts(tmp_path, monkeypatch, cli_run):
    from test_discovery import snapshot
    from tiny import make_tiny, save_tiny_model_dir

    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    target_dir = save_tiny_model_dir(snapshot(hub, "org/target"), "llama", seed=1, num_hidden_layers=8)
    save_zlab_dflash(
        snapshot(hub, "z-lab/target-DFlash-b16"), make_tiny("llama", seed=1, num_hidden_layers=8), taps=[1, 6]
    )
    _broken_entries(hub, target_dir)
    code, out, err = cli_run("drafters", "--model", "org/target", "--all", "--json")
    assert code == 0, err
    listed = json.loads(out)
    assert listed["pick"]["source"] == "z-lab/target-DFlash-b16"
    sources = {c["source"]: c for c in listed["candidates"]}
    for name in ("bad/dflash-str", "bad/eagle3-list", "bad/ref", "bad/loop"):
        assert name in sources and sources[name]["matches"] is False, name
    assert "unreadable" in sources["bad/ref"]["why"]
    code, out, err = cli_run("generate", "abcab", "--model", target_dir, "--max-tokens", "8", "--json")
    assert code == 0 and "Traceback" not in err, err
    assert json.loads(out)["mode"].startswith("dflash")


# ---- row 15: --check-exact compares with plain decoding, whatever the drafting flags ----


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags",
    [
        ("--tree-topk", "3", "--tree-nodes", "9"),
        ("--medusa", "embedded", "--tree-topk", "2"),
        ("--lookup", "--lookup-candidates", "3"),
    ],
    ids=["draft-tree", "medusa-tree", "lookup-candidates"],
)
def test_check_exact_runs_with_every_drafting_flag_it_runs_without(cli_run, flags):
    code, out, err = cli_run(*G, *flags, "--check-exact")
    assert code == 0, err
    assert "greedy speculative output equals plain decoding bit for bit" in err


# ---- rows 11 and 12: a bad tune record is ignored with one line; concurrent tunes each write a whole record ----


def _stored_tune(cli_run, tmp_path):
    """A tune record for the embedded target, as `mlxspec tune` writes it, and its file."""
    from mlxspec.bench.tune import Regime, Setting, file_identity, save_tune
    from mlxspec.cli.tune import tune_key_for
    from mlxspec.loading import DEFAULT_DRAFT

    key = tune_key_for(None, "auto")
    regime = Regime(Setting("draft", str(DEFAULT_DRAFT), 3), 100.0, 150.0)
    return key, save_tune(key, {"greedy": regime}, {str(DEFAULT_DRAFT): file_identity(DEFAULT_DRAFT)})


BAD_RECORDS = [
    lambda r: r["regimes"]["greedy"].update(choice="draft"),
    lambda r: r["regimes"].update(greedy=[1, 2]),
    lambda r: r["regimes"]["greedy"]["choice"].update(drafter="warp-drive"),
    lambda r: r.update(drafters=[1]),
    lambda r: r.update(drafters=None),
    lambda r: r["regimes"]["greedy"]["choice"].update(source=5),
    lambda r: r["regimes"]["greedy"].update(plain_tokens_per_second="fast"),
    lambda r: r["regimes"]["greedy"]["choice"].update(num_draft=999),
    lambda r: r["regimes"]["greedy"]["choice"].update(tree_topk=0),
    lambda r: r["regimes"].update(lukewarm=r["regimes"]["greedy"]),
    lambda r: r["regimes"]["greedy"].update(extra=1),
]


def _damage(path, damage: int) -> None:
    if damage < len(BAD_RECORDS):
        record = json.loads(path.read_text())
        BAD_RECORDS[damage](record)
        path.write_text(json.dumps(record))
    else:
        path.write_text("[" * 100_000 + "]" * 100_000)  # nested too deeply to parse


@pytest.mark.parametrize("damage", range(len(BAD_RECORDS) + 1))
def test_a_bad_tune_record_is_refused_by_name_when_read(cli_run, tmp_path, monkeypatch, damage):
    from mlxspec.bench.tune import BadTuneRecord, load_tune

    key, path = _stored_tune(cli_run, tmp_path)
    assert load_tune(key) is not None
    _damage(path, damage)
    with pytest.raises(BadTuneRecord) as error:
        load_tune(key)
    assert str(path) in str(error.value) and "--no-tune" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.slow
@pytest.mark.parametrize("damage", [0, 5, 7, len(BAD_RECORDS)], ids=["choice-str", "source-5", "k-999", "deep"])
def test_generate_ignores_a_bad_tune_record_with_one_line_naming_it(cli_run, tmp_path, monkeypatch, damage):
    _, path = _stored_tune(cli_run, tmp_path)
    _damage(path, damage)
    code, out, err = cli_run(*G, "--json")
    assert code == 0 and "Traceback" not in err, err
    notes = [line for line in err.splitlines() if "tune record" in line]
    assert len(notes) == 1 and str(path) in notes[0] and "--no-tune" in notes[0], err
    assert "num_draft" not in err.replace(notes[0], "")  # no refusal of an option the user never passed


def test_two_tunes_finishing_together_each_write_a_whole_record(tmp_path, monkeypatch):
    import threading

    from mlxspec.bench.tune import Regime, Setting, load_tune, save_tune

    key = {"machine": "m", "model": "x", "model_path": "/x", "mlx": "0", "kernel": "cpu"}
    errors = []

    def writer(rate: float) -> None:
        try:
            for _ in range(40):
                save_tune(key, {"greedy": Regime(Setting("plain"), rate, rate)}, {})
        except Exception as error:  # the loser used to fail on the shared .tmp name
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(rate,)) for rate in (10.0, 20.0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert load_tune(key)["regimes"]["greedy"]["plain_tokens_per_second"] in (10.0, 20.0)
    from mlxspec.platform import cache_dir

    assert not list((cache_dir() / "tune").glob("*.tmp"))


def test_a_setting_that_kept_one_token_per_call_is_never_stored_as_a_win():
    from mlxspec.bench.runner import OWN_PLAIN, ModeResult
    from mlxspec.bench.tune import Setting, choose

    settings = {s.name: s for s in (Setting("plain"), Setting("eagle", "e", "auto"))}
    eagle = Setting("eagle", "e", "auto").name
    rows = [
        ModeResult(OWN_PLAIN, 10.0, 10.0, 10.0, 0, 1.0, 1.0, 0),
        ModeResult(eagle, 31.0, 31.0, 31.0, 0, 1.0, 1.0, 0),
    ]
    assert choose(rows, settings).choice.drafter == "plain"  # tau 1: it decoded plainly; 3.1x was noise


# ---- row 14: a memory budget past any machine, or empty, is refused by name ----


@pytest.mark.parametrize(
    "budget, message", [("99999999999999999999GB", "more than any machine holds"), ("", "memory size ''")]
)
@pytest.mark.parametrize("command", ["generate", "serve"])
def test_a_memory_budget_past_any_machine_or_empty_is_one_line(cli_run, budget, message, command):
    args = (*G, "--memory-budget", budget) if command == "generate" else ("serve", "--memory-budget", budget)
    assert_one_line(cli_run(*args), message)


# ---- row 18: tune runs under OpenBLAS like generate and serve ----


def test_tune_is_re_executed_under_openblas_like_generate():
    from mlxspec.platform import REEXEC_COMMANDS

    assert {"generate", "serve", "tune", "bench", "chat"} <= set(REEXEC_COMMANDS)


# ---- rough edges a new user met ----


def test_plan_says_its_dtype_and_exits_one_when_it_does_not_fit(cli_run):
    code, out, err = cli_run("plan", "--model", "qwen3-8b", "--memory", "8GB")
    assert code == 1 and "DOES NOT FIT" in out and "computed in float32 on the CPU" in out
    code, out, err = cli_run("plan", "--model", "qwen3-8b", "--device", "m2-16gb")
    assert "computed in bfloat16 on the GPU" in out


def test_the_bench_plot_draws_every_family_measured_at_several_k(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mlxspec.bench.plot import plot
    from mlxspec.bench.runner import ModeResult

    names = ["mlx-lm plain", "mlxspec draft k=2", "mlxspec draft k=4", "mlxspec eagle k=2", "mlxspec eagle k=4"]
    results = [ModeResult(name, 10, 10, 10, 0.5, 2, 0.5, 0, speedup=1.2) for name in names]
    figures = []
    monkeypatch.setattr(plt.Figure, "savefig", lambda self, *a, **k: figures.append(self))
    plot({"0.0": results}, str(tmp_path / "p.png"))
    axis = figures[0].axes[0]
    assert {line.get_label() for line in axis.get_lines()} >= {"mlxspec draft", "mlxspec eagle"}
    assert all(float(t).is_integer() for t in axis.get_xticks())


@pytest.mark.slow
def test_the_embedded_drafters_are_listed_and_named_as_an_install_understands(cli_run):
    code, out, err = cli_run("drafters", "--all")
    assert code == 0, err
    assert "0 considered" not in out and out.count("embedded") >= 3
    code, out, err = cli_run(*G, "--eagle", "embedded", "-k", "2", "--json")
    assert code == 0 and json.loads(out)["mode"] == "eagle", err


# ---- rough edges: the words a refusal and a banner use, and a measurement that is never silent ----


def test_a_too_long_prompt_is_refused_in_the_callers_own_words(cli_run, tiny_dirs):
    """The CLI names its flag and not the Python keyword; the API names its keyword."""
    code, _, err = cli_run("generate", "ab" * 30, "--model", tiny_dirs["target"], "--no-draft")
    assert code == 2 and "--truncate" in err and "truncate=True" not in err, err
    spec = mlxspec.load(tiny_dirs["target"], draft=None)
    with pytest.raises(UserError, match=r"pass truncate=True to keep"):
        spec.generate("ab" * 30, max_tokens=4)


def test_the_chat_banner_names_the_model_not_its_folder(tmp_path):
    from mlxspec.loading import DEFAULT_TARGET
    from mlxspec.serve.chat import model_label

    assert model_label(DEFAULT_TARGET) == "the embedded 11M model"
    converted = tmp_path / "gemma-3-270m-q4_k_m-0123456789abcdef"
    converted.mkdir()
    (converted / "gguf_source.json").write_text(json.dumps({"gguf": "/models/gemma-3-270m-q4_k_m.gguf"}))
    assert model_label(converted) == "gemma-3-270m-q4_k_m.gguf"
    (converted / "gguf_source.json").write_text("not json")
    assert model_label(converted) == converted.name


def test_progress_on_a_pipe_says_when_a_long_job_starts_and_ends():
    """On a terminal the line is rewritten in place; on a pipe (the first run's 90 s cost measurement under a
    script), one plain line at the start and one at the end, never silence."""
    import io

    from mlxspec.progress import Progress

    pipe = io.StringIO()
    progress = Progress("measuring this device's verification cost", 4, stream=pipe)
    for done in range(5):
        progress.update(done)
    progress.close()
    lines = pipe.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in pipe.getvalue()
    assert lines[0] == "mlxspec: measuring this device's verification cost (4 parts)..."
    assert lines[1].startswith("mlxspec: measuring this device's verification cost: done in ")


def test_a_text_the_model_ends_at_once_says_so_and_reports_no_rate(cli_run):
    """A file ending in `main()` makes the embedded model emit end-of-text first: no tokens, so `-v` reports no
    rate (it said tau=0.00, which reads as a drafter that failed) and a line says why the output is empty."""
    source = b'import os\n\n\ndef main():\n    print(os.getcwd())\n\n\nif __name__ == "__main__":\n    main()\n'
    code, out, err = cli_run("generate", "-", "--lookup", "-k", "4", "--max-tokens", "16", "-v", stdin=source)
    assert code == 0 and out.strip() == "", err
    assert "the model ended the text at once" in err
    stats = next(line for line in err.splitlines() if line.startswith("mode="))
    assert "tau=- " in stats and "tokens=0 " in stats, stats


def test_import_from_a_checkouts_parent_directory_finds_the_package_not_the_folder(tmp_path):
    """`git clone … mlxspec` leaves a folder named mlxspec in the current directory; an editable install used to
    import it as an empty namespace package (`module 'mlxspec' has no attribute 'load'`)."""
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "mlxspec").symlink_to(Path(__file__).resolve().parents[1], target_is_directory=True)
    proc = subprocess.run(
        [sys.executable, "-c", "import mlxspec; print(mlxspec.load.__module__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "mlxspec.api", proc.stderr[-1000:]
