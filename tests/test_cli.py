"""The command line: streaming, --json, and one-line errors without tracebacks."""

import json
import subprocess
import sys

import pytest
from helpers import HANG_LIMIT


def run_cli(*args, stdin=None):
    return subprocess.run(
        [sys.executable, "-m", "mlxspec", *map(str, args)],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=HANG_LIMIT,
    )


def test_json_output_has_tokens_text_and_stats(tiny_dirs):
    proc = run_cli(
        "generate",
        "abc",
        "--model",
        tiny_dirs["target"],
        "--draft",
        tiny_dirs["draft"],
        "--max-tokens",
        "12",
        "--temp",
        "0.7",
        "--seed",
        "1",
        "-k",
        "2",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) >= {"tokens", "text", "stats", "seed", "mode", "num_draft", "model", "draft"}
    assert out["seed"] == 1 and out["mode"] == "draft" and out["num_draft"] == 2
    assert out["model"] == str(tiny_dirs["target"]) and out["draft"] == str(tiny_dirs["draft"])
    for key in (
        "target_calls",
        "draft_calls",
        "drafted",
        "accepted",
        "acceptance_rate",
        "tokens_per_target_call",
        "tokens_per_second",
        "prompt_tokens_per_second",
        "peak_memory_bytes",
    ):
        assert key in out["stats"]


def test_stdin_prompt_and_verbose_stats(tiny_dirs):
    proc = run_cli(
        "generate", "-", "--model", tiny_dirs["target"], "--no-draft", "--max-tokens", "5", "-v", stdin="abab"
    )
    assert proc.returncode == 0, proc.stderr
    assert "alpha=" in proc.stderr and "tok/s" in proc.stderr
    assert "mode=plain k=0 seed=" in proc.stderr  # what ran, and the random seed that repeats it


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "/does/not/exist"], "does not exist"),
        (["--model", "{tmp}"], "has no config.json"),
        (["--model", "{target}", "--draft", "{recurrent}", "-k", "2"], "must be a transformer without recurrent"),
        (["--model", "{target}", "-k", "0"], "num_draft 0"),
        (["--model", "{target}", "-k", "65"], "num_draft 65"),
        (["--model", "{target}", "--temp", "-1"], "temperature -1.0"),
        (["--model", "{target}", "--top-p", "0"], "top_p 0.0"),
    ],
)
def test_bad_input_is_one_line_without_traceback(tiny_dirs, tmp_path, args, message):
    fill = {"tmp": tmp_path, "target": tiny_dirs["target"], "recurrent": tiny_dirs["mismatched_recurrent"]}
    proc = run_cli("generate", "ab", *[a.format(**fill) for a in args])
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_empty_and_too_long_prompts_are_refused(tiny_dirs):
    for prompt in ("", "a" * 41):
        proc = run_cli("generate", prompt, "--model", tiny_dirs["target"])
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, {"LD_PRELOAD": "OPENBLAS", "OPENBLAS_THREAD_TIMEOUT": "4"}),
        ({"LD_PRELOAD": "/x/libblas.so.3"}, {"LD_PRELOAD": "/x/libblas.so.3", "OPENBLAS_THREAD_TIMEOUT": "4"}),
        ({"OPENBLAS_THREAD_TIMEOUT": "10"}, {"LD_PRELOAD": "OPENBLAS", "OPENBLAS_THREAD_TIMEOUT": "10"}),
        ({"LD_PRELOAD": "/x/libblas.so.3", "OPENBLAS_THREAD_TIMEOUT": "10"}, None),
        ({"MLXSPEC_NO_OPENBLAS": "1"}, None),
    ],
    ids=["fresh", "preloaded", "user-timeout", "all-set", "opt-out"],
)
def test_reexec_adds_openblas_and_its_thread_timeout_once(monkeypatch, environ, expected):
    """The CLI re-executes itself at most once, adding only what the environment lacks and keeping what the user
    set; the library's presence is faked so this runs on machines without OpenBLAS too."""
    import ctypes
    import os

    from mlxspec.cli import main as cli

    for name in ("LD_PRELOAD", "OPENBLAS_THREAD_TIMEOUT", "MLXSPEC_NO_OPENBLAS", "_MLXSPEC_REEXEC"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(os.path, "exists", lambda path: path.endswith("openblas-pthread/libblas.so.3"))
    monkeypatch.setattr(ctypes, "CDLL", lambda path: None)
    calls = []
    monkeypatch.setattr(os, "execve", lambda exe, args, env: calls.append(env))
    cli.reexec_with_openblas(["mlxspec", "bench"])
    cli.reexec_with_openblas(["mlxspec", "plan"])  # planning computes nothing: never re-executed
    if expected is None:
        assert calls == []
        return
    assert len(calls) == 1 and calls[0]["_MLXSPEC_REEXEC"] == "1"
    for name, value in expected.items():
        got = calls[0][name]
        assert got.endswith("openblas-pthread/libblas.so.3") if value == "OPENBLAS" else got == value


def test_bench_compares_every_mode_on_a_fresh_install(tiny_dirs, tmp_path):
    """A short bench on the tiny pair: every mode runs at both temperatures, the table, the profile and the JSON
    come out, and the numbers are well-formed. (Timings are not asserted: they belong to benchmarks.)"""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "abcabcab"}\n{"tokens": [1, 2, 3, 1, 2]}\n')
    out = tmp_path / "bench.json"
    proc = run_cli(
        "bench",
        "--model",
        tiny_dirs["target"],
        "--draft",
        tiny_dirs["draft"],
        "-k",
        "2",
        "--temp",
        "0",
        "--temp",
        "1.0",
        "--prompts",
        prompts,
        "--max-tokens",
        "6",
        "--repeats",
        "2",
        "--profile",
        "--json",
        out,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())["results"]
    expected_modes = {
        "mlx-lm plain",
        "mlx-lm speculative k=2",
        "mlxspec plain",
        "mlxspec draft k=2",
        "mlxspec draft k=auto",
        "mlxspec draft-tree-4x2",
        "mlxspec lookup k=2",  # -k reaches the lookup rows
        "mlxspec lookup k=2 corpus=off",
        "mlxspec lookup-tree-3 k=2",
        "mlxspec lookup+draft k=2",
    }
    from mlxspec.kernels.verify import cpu_backend

    if cpu_backend()[0] is not None:  # the kernel's own share: plain decoding without it
        expected_modes.add("mlxspec plain kernel=off")
    for temp in ("0.0", "1.0"):
        rows = {row["mode"]: row for row in results[temp]}
        assert set(rows) == expected_modes and results[temp][0]["mode"] == "mlx-lm plain"
        for row in rows.values():
            assert row["tokens_per_second"] > 0 and 0 <= row["acceptance_rate"] <= 1
            assert row["tokens_per_target_call"] >= 1 and len(row["runs"]) == 2 * 2  # passes x prompts
            assert all(run["tokens"] == 6 for run in row["runs"])  # EOS ignored: every run makes max-tokens
            if row["mode"].startswith("mlxspec "):  # one vocabulary: the row names the mode as -v and --json do
                name, *settings = row["mode"].split()[1:]
                # -k auto decodes plainly where this machine's measured costs say drafting cannot pay
                allowed = {name, "plain"} if "k=auto" in settings else {name}
                assert {run["mode"] for run in row["runs"]} <= allowed, row["mode"]
                k = next((s for s in settings if s.startswith("k=")), None)
                ks = {f"k={run['num_draft']}" for run in row["runs"]}
                assert k is None or ks == {k} or (k == "k=auto" and ks <= {k, "k=0"}), row["mode"]  # (plainly: 0)
        assert set(results[f"profile {temp}"]) == {"draft", "verify", "target probs", "accept", "bookkeeping", "tokens"}
        assert results[f"profile {temp}"]["tokens"] >= 1  # tokens emitted per step
        plain_split = results[f"profile plain {temp}"]  # the baseline the drafters' splits compare with
        assert plain_split["tokens"] == 1 and plain_split["verify"] > 0
        assert f"## temperature {float(temp)}" in proc.stdout
    # progress names each mode as it finishes, with the time left; the last one at each temperature has none left
    progress = [line.strip() for line in proc.stderr.splitlines() if line.strip().startswith("pass ")]
    assert len(progress) == 2 * 2 * len(expected_modes)  # temperatures x passes x modes
    assert all(f"pass {r}/2 {mode}: " in proc.stderr for mode in expected_modes for r in (1, 2))
    assert all(line.endswith("s left at this temperature") for line in progress)
    last = [line for line in progress if line.startswith("pass 2/2 mlxspec lookup+draft k=2: ")]
    assert len(last) == 2 and all(line.endswith("about 0 s left at this temperature") for line in last)
