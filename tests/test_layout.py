"""The package layout as checked rules: import-linter's contracts (pyproject.toml), no module over 400 lines, and a
command line whose help and planner import neither MLX nor mlx-lm."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "mlxspec"
MAX_LINES = 400


def test_the_import_contracts_hold():
    """Floors from the command line down to the ground, the core importing no wing, no circles (lint-imports)."""
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    run = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


@pytest.mark.parametrize(
    "module, line, contract",
    [
        (("decoding", "engine.py"), "from mlxspec.cli import main as _upward", "Floors"),
        (("drafting", "lookup", "drafter.py"), "from mlxspec.drafting.dflash import drafter as _x", "Drafter families"),
        (("drafting", "heads", "medusa.py"), "from mlxspec.drafting import factory as _x", "front door"),
    ],
    ids=["upward", "family-to-family", "family-to-front-door"],
)
def test_the_contracts_catch_a_forbidden_import(tmp_path, module, line, contract):
    """The contracts are not vacuous: a copy of the package with one forbidden import added fails the named one."""
    copy = tmp_path / "mlxspec"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    target = copy.joinpath(*module)
    target.write_text(target.read_text() + f"\n{line}  # noqa: E402\n")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    run = subprocess.run([lint, "--no-cache"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode != 0, run.stdout[-2000:]
    parts = re.split(r"\b(KEPT|BROKEN)\b", run.stdout.replace("\n", " "))
    broken = [parts[i - 1] for i, word in enumerate(parts) if word == "BROKEN"]  # each broken contract's name
    assert any(contract in name for name in broken), run.stdout[-2000:]


def test_no_module_is_over_400_lines():
    lines = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    long = {name: n for name, n in lines.items() if n > MAX_LINES}
    assert not long, f"split these modules (one job each): {long}"


# Timeouts here guard against hangs only: each command takes about a second on an idle machine.
PROBE = """
import sys
from mlxspec.cli.main import main
try:
    main(['mlxspec', *sys.argv[1:]])
except SystemExit as exit:
    assert not exit.code, exit.code
loaded = sorted({m.split('.')[0] for m in sys.modules} & {'mlx', 'mlx_lm'})
print('LOADED', ','.join(loaded))
"""


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["plan", "--list"],
        ["plan", "--device", "m2-16gb"],
        ["plan", "--model", "llama-3.1-8b", "--draft", "llama-3.2-1b", "--memory", "96GB", "--json"],
    ],
    ids=["help", "plan-list", "plan-embedded", "plan-preset"],
)
def test_help_and_plan_import_neither_mlx_nor_mlx_lm(args):
    env = {**os.environ, "MLXSPEC_NO_OPENBLAS": "1"}
    run = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "LOADED", run.stdout[-500:]


@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS, planning for this machine asks Metal through MLX")
def test_plan_for_this_machine_imports_no_mlx_on_linux():
    env = {**os.environ, "MLXSPEC_NO_OPENBLAS": "1"}
    run = subprocess.run([sys.executable, "-c", PROBE, "plan"], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "LOADED"


def test_the_probe_sees_mlx_when_a_command_loads_it():
    """The power check of the probe above: a command that loads a model does show MLX in sys.modules."""
    env = {**os.environ, "MLXSPEC_NO_OPENBLAS": "1"}
    args = ["generate", "ab", "--max-tokens", "2", "--no-draft"]
    run = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "mlx" in run.stdout.strip().splitlines()[-1]


def test_every_name_the_package_exports_resolves():
    """`mlxspec.<name>` is imported lazily by module path: a module that moved must not leave a name dangling."""
    import mlxspec

    for name in mlxspec.__all__:
        assert getattr(mlxspec, name) is not None, name
