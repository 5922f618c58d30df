"""A non-editable install: build the wheel, install it into a fresh venv, run it from another directory."""

import json
import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = out.glob("mlxspec-*.whl")
    return path


def test_the_wheel_carries_the_models_and_presets_once(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "mlxspec/models/target/config.json" in names and "mlxspec/models/draft/tokenizer.json" in names
    assert "mlxspec/models/medusa/medusa_config.json" in names and "mlxspec/__main__.py" in names
    presets = sorted(n for n in names if n.startswith("mlxspec/configs/") and n.endswith(".json"))
    assert len(presets) == len(list((ROOT / "mlxspec" / "configs").glob("*.json"))) > 10
    assert not any(n.startswith("models/") for n in names)  # one copy, inside the package


def test_a_wheel_install_generates_and_plans_from_another_directory(wheel, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}  # nothing but the venv's own paths
    env["MLXSPEC_CACHE"] = str(tmp_path / "cache")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300, env=env)
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
        timeout=300,
        env=env,
    )
    assert install.returncode == 0, install.stderr
    (own_site / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def run(*args):
        return subprocess.run([python, *args], cwd=elsewhere, capture_output=True, text=True, env=env, timeout=300)

    where = run("-c", "import mlxspec.platform as p; print(p.__file__); print(p.models_dir())")
    assert where.returncode == 0, where.stderr
    module_file, models = where.stdout.split()
    assert module_file.startswith(str(own_site)) and models == str(own_site / "mlxspec" / "models")
    gen = run("-m", "mlxspec", "generate", "def f():", "--max-tokens", "8", "-k", "2", "--json")
    assert gen.returncode == 0, gen.stderr
    out = json.loads(gen.stdout)
    assert len(out["tokens"]) == 8 and out["mode"] == "draft model" and out["stats"]["drafted"] > 0
    listing = subprocess.run(
        [venv / "bin" / "mlxspec", "plan", "--list"], cwd=elsewhere, capture_output=True, text=True, env=env
    )
    assert listing.returncode == 0, listing.stderr
    for preset in (ROOT / "mlxspec" / "configs").glob("*.json"):
        assert preset.stem in listing.stdout
