"""`mlxspec bench`'s subcommands (serve, agent-loop, verify-cost, acceptance, plan): each runs end to end on the
embedded models with small settings, writes its --json report, and refuses bad values in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import HANG_LIMIT

SUBCOMMANDS = ("serve", "agent-loop", "verify-cost", "acceptance", "plan")


def bench(*args, cache=None, timeout=HANG_LIMIT):
    env = {"MLXSPEC_NO_OPENBLAS": "1"}
    if cache is not None:
        env["MLXSPEC_CACHE"] = str(cache)
    import os

    return subprocess.run(
        [sys.executable, "-m", "mlxspec", "bench", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
    )


def test_bench_lists_its_subcommands_and_each_has_help():
    listing = bench("--help")
    assert listing.returncode == 0
    for name in SUBCOMMANDS:
        assert name in listing.stdout
        assert bench(name, "--help").returncode == 0


@pytest.mark.slow
def test_acceptance_counts_drafts_accepted_for_the_draft_model_and_lookup(tmp_path):
    out = tmp_path / "acceptance.json"
    run = bench(
        "acceptance", "--depth", 3, "--num-prompts", 2, "--max-tokens", 24, "--temp", 0, "--json", out,
        "--medusa-trees", "", "--eagle-trees", "", "--ddtrees", "",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"draft model chain T=0.0", "prompt lookup T=0.0"}
    draft = rows["draft model chain T=0.0"]
    assert draft["tau"] > 1.0 and draft["alpha_by_depth"][0] > 0  # drafts were really accepted
    assert len(draft["alpha_by_depth"]) == 3
    assert "[2/2]" in run.stderr and "bench acceptance: 2 runs" in run.stderr  # progress on a pipe too


@pytest.mark.slow
def test_acceptance_counts_repeat_exactly(tmp_path):
    """No timings: two runs with the same seeds give the same table."""
    reports = []
    for i in range(2):
        out = tmp_path / f"a{i}.json"
        args = ("acceptance", "--depth", 2, "--num-prompts", 1, "--max-tokens", 16, "--temp", 0.7, "--no-lookup")
        assert bench(*args, "--json", out).returncode == 0
        reports.append(json.loads(out.read_text())["rows"])
    assert reports[0] == reports[1]


@pytest.mark.slow
def test_verify_cost_reports_the_curve_and_never_replaces_the_stored_one(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    stored = cache / "cost_curves.json"
    stored.write_text('{"kept": "as it was"}')
    out = tmp_path / "v.json"
    run = bench("verify-cost", "--max-tokens", 4, "--repeats", 1, "--formats", "--json", out, cache=cache)
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    assert list(report["target_ms"]) == ["1", "2", "4"] and report["draft_one_ms"] > 0
    assert "best draft length" in run.stdout
    formats = report["formats"]  # the embedded bf16 target: its Linear matrices kept 16-bit, its embedding float32
    assert set(formats["formats"]) == {"bfloat16", "float32"} and all(v > 0 for v in formats["read_gib_s"].values())
    assert list(formats["formats"]["bfloat16"]["v"]) == ["1", "2", "4"] and "memory read" in run.stdout
    assert stored.read_text() == '{"kept": "as it was"}'


@pytest.mark.slow
def test_plan_check_is_within_fifteen_percent_on_the_embedded_pair(tmp_path):
    out = tmp_path / "plan.json"
    run = bench("plan", "--contexts", 256, "--pairs", "embedded", "--json", out)
    assert run.returncode == 0, run.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert row["context"] == 256 and abs(row["error"]) < 0.15, row


@pytest.mark.slow
def test_agent_loop_rows_all_write_plain_decodings_text(tmp_path):
    out = tmp_path / "loop.json"
    run = bench("agent-loop", "--files", 1, "--rounds", 2, "--max-tokens", 24, "-k", 4, "--json", out)
    assert run.returncode == 0, run.stderr
    rows = {row["config"]: row for row in json.loads(out.read_text())["rows"]}
    assert len(rows) == 5 and all(row["exact"] for row in rows.values())
    assert rows["lookup + suffix cache"]["accepted"] > 0


@pytest.mark.slow
def test_serve_load_through_a_real_server_process(tmp_path):
    out = tmp_path / "serve.json"
    run = bench(
        "serve", "load", "--clients", 2, "--requests", 1, "--max-tokens", 8, "--logs", tmp_path, "--json", out,
        timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    load = json.loads(out.read_text())["mlxspec"]["load"]
    assert load["completed"] == 2 and not load["errors"] and load["exact"] == 2


@pytest.mark.parametrize(
    "args, named",
    [
        (("serve", "batch", "--loads", "1,x"), "--loads '1,x'"),
        (("serve", "--logs", "/nonexistent/folder"), "--logs"),
        (("acceptance", "--eagle-trees", "3"), "--eagle-trees '3'"),
        (("acceptance", "--ddtrees", "4:8"), "--ddtrees '4:8'"),
        (("plan", "--contexts", "12"), "--contexts '12'"),
        (("plan", "--pairs", "llama"), "--pairs 'llama'"),
        (("verify-cost", "--json", "/nonexistent/folder/x.json"), "--json"),
        (("--widen", "24x768", "plan"), "--widen belongs to `mlxspec bench` itself"),
    ],
)
def test_bad_values_are_refused_in_one_line(args, named):
    run = bench(*args)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in run.stderr, run.stderr


@pytest.mark.slow
def test_only_keeps_the_named_modes_and_refuses_a_word_that_keeps_none(tmp_path):
    """--only shortens a run to the modes a table needs (the real model's README rows), in its order; a name that is
    no mode is one line naming it and the modes there are."""
    common = ("--modes", "plain,lookup", "--num-prompts", "1", "--max-tokens", "4", "--repeats", "1", "--temp", "0")
    run = bench(*common, "--only", "mlxspec lookup k=4, mlxspec plain", cache=tmp_path)
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith(("mlxspec", "mlx-lm"))]
    assert [row[:32].strip() for row in rows] == ["mlxspec lookup k=4", "mlxspec plain"], run.stdout
    run = bench(*common, "--only", "mlxspec eagle k=4", cache=tmp_path)
    last = run.stderr.strip().splitlines()[-1]  # (after the reference-BLAS warning this test's setting brings)
    assert run.returncode == 2 and "--only names 'mlxspec eagle k=4'" in last and "Traceback" not in run.stderr


def test_each_weight_format_is_timed_on_its_largest_layer():
    """`verify-cost --formats` in process on a model holding float32, affine 4-bit and K-quant layers: one row per
    format, each its largest layer, GiB/s from its own bytes."""
    import mlx.core as mx
    import mlx.nn as nn

    from mlxspec.bench.format_cost import largest_layers, run_format_cost
    from mlxspec.k_quants import KQuantLinear
    from mlxspec.kernels.verify import cpu_backend, routed_view

    backend, why = cpu_backend()
    assert backend is not None, why
    n, k = 64, 512
    parts = {"weight": mx.zeros((n, k // 8), dtype=mx.uint32), "sub_scales": mx.ones((n, k // 32), dtype=mx.uint8),
             "sub_mins": mx.ones((n, k // 32), dtype=mx.uint8), "super_scales": mx.ones((n, k // 256)),
             "super_mins": mx.ones((n, k // 256))}  # fmt: skip
    model = nn.Sequential(nn.Linear(k, 32), nn.Linear(k, 96), nn.QuantizedLinear(k, n, group_size=32, bits=4),
                          KQuantLinear(parts, 4))  # fmt: skip
    view = routed_view(model, backend)
    layers = {layer.format: layer for layer in largest_layers(view)}
    assert set(layers) == {"float32", "4-bit affine g32 (float32 scales)", "4-bit K-quant"}
    assert layers["float32"].rows == 96 and layers["4-bit K-quant"].columns == k
    report = run_format_cost(view, (1, 2), repeats=1, threads=1, echo=lambda line: None)
    assert set(report["formats"]) == set(layers)
    assert all(row["gib_s"]["1"] > 0 and row["v"]["1"] == 1.0 for row in report["formats"].values())
