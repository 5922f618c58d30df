"""The kernel's sources compile for every x86-64 a user may build on, not only this host's (-march=native): the
baseline ISA (MLXSPEC_PORTABLE=1, and what Arm boxes see of the x86 paths: no AVX2) and AVX2 without AVX-512. A tile
written for one ISA outside its #if breaks these builds only, which a test on an AVX-512 host would not see."""

import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import HANG_LIMIT

pytestmark = pytest.mark.slow  # about 9 s an ISA on 2 cores

ROOT = Path(__file__).resolve().parents[1]
COMPILER = shutil.which("g++") or shutil.which("clang++")
# bindings.cpp needs nanobind's headers (a build dependency only); the kernels themselves need MLX's
SOURCES = sorted(p for p in (ROOT / "csrc").glob("*.cpp") if p.name != "bindings.cpp")


def mlx_include() -> Path:
    cmake_dir = subprocess.run(
        [sys.executable, "-m", "mlx", "--cmake-dir"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return Path(cmake_dir) / "include"


@pytest.mark.skipif(COMPILER is None, reason="no C++ compiler")
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 instruction sets")
@pytest.mark.parametrize("isa", ["x86-64", "haswell"])
def test_the_kernel_sources_compile_without_avx512(isa):
    assert SOURCES, "no kernel sources found"
    include = mlx_include()
    for source in SOURCES:
        result = subprocess.run(
            [
                COMPILER,
                "-std=c++20",
                "-fsyntax-only",
                f"-march={isa}",
                f"-I{include}",
                f"-I{ROOT / 'csrc'}",
                str(source),
            ],
            capture_output=True,
            text=True,
            timeout=HANG_LIMIT,
        )
        assert result.returncode == 0, f"{source.name} at -march={isa}:\n{result.stderr[-3000:]}"
