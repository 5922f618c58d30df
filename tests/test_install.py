"""A non-editable install: build the wheel, install it into a fresh venv, run it from another directory."""

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import HANG_LIMIT

pytestmark = pytest.mark.slow  # each test builds a wheel or a venv (10-25 s here); the whole suite runs them

ROOT = Path(__file__).resolve().parents[1]


HAS_COMPILER = any(shutil.which(c) for c in ("c++", "g++", "clang++"))


def build_wheel(out: Path, env: dict | None = None, source: Path = ROOT) -> tuple[Path, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=HANG_LIMIT,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = out.glob("mlxspec-*.whl")
    return path, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))[0]


def install_in_fresh_venv(wheel: Path, tmp_path: Path) -> tuple[Path, Path, dict]:
    """(venv python, its site-packages, env): the wheel alone, its dependencies from this environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}  # nothing but the venv's own paths
    env["MLXSPEC_CACHE"] = str(tmp_path / "cache")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=HANG_LIMIT, env=env)
    python = venv / "bin" / "python"
    own_site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stdout.strip()
    )
    # The wheel without its dependencies (no network needed); they come from this environment, searched after the
    # fresh venv's own site-packages, so `mlxspec` can only be the installed wheel.
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=HANG_LIMIT,
        env=env,
    )
    assert install.returncode == 0, install.stderr
    (own_site / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python, own_site, env


def test_the_wheel_carries_the_models_and_presets_once(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "mlxspec/models/target/config.json" in names and "mlxspec/models/draft/tokenizer.json" in names
    assert "mlxspec/models/medusa/medusa_config.json" in names and "mlxspec/__main__.py" in names
    assert "mlxspec/models/eagle/eagle_config.json" in names and "mlxspec/models/eagle/eagle.safetensors" in names
    presets = sorted(n for n in names if n.startswith("mlxspec/configs/") and n.endswith(".json"))
    assert len(presets) == len(list((ROOT / "mlxspec" / "configs").glob("*.json"))) > 10
    assert not any(n.startswith("models/") for n in names)  # one copy, inside the package


def test_a_wheel_install_generates_and_plans_from_another_directory(wheel, tmp_path):
    python, own_site, env = install_in_fresh_venv(wheel, tmp_path)
    venv = python.parent.parent
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def run(*args):
        return subprocess.run(
            [python, *args], cwd=elsewhere, capture_output=True, text=True, env=env, timeout=HANG_LIMIT
        )

    where = run("-c", "import mlxspec.platform as p; print(p.__file__); print(p.models_dir())")
    assert where.returncode == 0, where.stderr
    module_file, models = where.stdout.split()
    assert module_file.startswith(str(own_site)) and models == str(own_site / "mlxspec" / "models")
    gen = run("-m", "mlxspec", "generate", "def f():", "--max-tokens", "8", "-k", "2", "--json")
    assert gen.returncode == 0, gen.stderr
    out = json.loads(gen.stdout)
    assert len(out["tokens"]) == 8 and out["mode"] == "draft" and out["stats"]["drafted"] > 0
    if HAS_COMPILER:  # the wheel carries the verify kernel built for this machine, and generation uses it
        assert any(n.startswith("mlxspec/_verify_kernel") for n in zipfile.ZipFile(wheel).namelist())
        assert out["stats"]["kernel"].startswith("cpu"), out["stats"]["kernel"]
    listing = subprocess.run(
        [venv / "bin" / "mlxspec", "plan", "--list"], cwd=elsewhere, capture_output=True, text=True, env=env
    )
    assert listing.returncode == 0, listing.stderr
    for preset in (ROOT / "mlxspec" / "configs").glob("*.json"):
        assert preset.stem in listing.stdout


def test_without_a_compiler_the_install_succeeds_and_says_it_runs_without_the_kernel(tmp_path):
    """CXX names no compiler, so CMake fails: the build goes on without the kernel, and generate says so in one
    line on stderr, then produces the same tokens MLX's own matmuls give."""
    env = dict(os.environ, CXX=str(tmp_path / "no-such-compiler"))
    # A clean copy of the source: CMake's cache in an earlier build/ would remember the real compiler.
    ignore = shutil.ignore_patterns("build", ".venv*", ".git", "*.so", "__pycache__", ".*cache", "*.egg-info", "runs")
    source = Path(shutil.copytree(ROOT, tmp_path / "source", ignore=ignore))
    path, log = build_wheel(tmp_path / "wheel", env, source)
    assert "the verify kernel was not built" in log
    assert not any(n.startswith("mlxspec/_verify_kernel") for n in zipfile.ZipFile(path).namelist())
    python, _, env = install_in_fresh_venv(path, tmp_path)
    gen = subprocess.run(
        [python, "-m", "mlxspec", "generate", "def f():", "--max-tokens", "8", "--no-draft", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=HANG_LIMIT,
    )
    assert gen.returncode == 0, gen.stderr
    lines = [line for line in gen.stderr.splitlines() if "verify kernel" in line]
    assert len(lines) == 1 and lines[0].startswith("mlxspec: running without the verify kernel: not built"), lines
    out = json.loads(gen.stdout)
    assert out["stats"]["kernel"].startswith("unavailable") and len(out["tokens"]) == 8


@pytest.mark.skipif(not HAS_COMPILER, reason="no C++ compiler: no kernel is built to reuse")
def test_building_again_reuses_the_kernel_built_before(wheel, tmp_path):
    """`pip install -e ".[serve]"` after `pip install -e .` rebuilt the kernel (60-112 s): a build now reuses the one
    kept under build/kernel-cache for the same sources, MLX, Python and compiler, and says so in its log."""
    again, log = build_wheel(tmp_path / "again")
    assert "mlxspec: reusing the verify kernel built earlier" in log, log[-2000:]
    kernels = [
        sorted((n, zipfile.ZipFile(path).read(n)) for n in zipfile.ZipFile(path).namelist() if "_verify_kernel" in n)
        for path in (wheel, again)
    ]
    assert kernels[0] and kernels[0] == kernels[1]
