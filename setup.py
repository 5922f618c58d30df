"""Builds mlxspec's optional verify kernel, an MLX C++ extension (csrc/).

Everything else is configured in pyproject.toml. The kernel is optional: without a C++
compiler or CMake, or with MLXSPEC_NO_KERNEL=1, the install still succeeds and mlxspec
says in one line that it runs without the kernel.

A kernel built once is kept under build/kernel-cache/, keyed by its sources, MLX's version, the
Python and the compiler: installing again (an extra such as ".[serve]" after ".") reuses it
instead of rebuilding for a minute or two.
"""

import hashlib
import os
import platform
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

try:
    from mlx.extension import CMakeBuild, CMakeExtension
except ImportError:  # no MLX at build time: nothing to build against
    CMakeBuild, CMakeExtension = build_ext, None


HERE = Path(__file__).resolve().parent
KERNEL_CACHE = HERE / "build" / "kernel-cache"


def kernel_key() -> str:
    """What the built kernel depends on: its sources, MLX, the Python and the compiler asked for."""
    import mlx.core

    digest = hashlib.sha256()
    for path in sorted((HERE / "csrc").rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(HERE)).encode() + b"\0" + path.read_bytes())
    for part in (
        mlx.core.__version__,
        sys.version,
        platform.machine(),
        os.environ.get("CXX", ""),
        os.environ.get("CMAKE_ARGS", ""),
    ):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:20]


class OptionalKernelBuild(CMakeBuild):
    """CMakeBuild that turns a failed kernel build into a warning, and reuses a kernel it built before."""

    def build_extension(self, ext) -> None:
        out_dir = (Path.cwd() / self.get_ext_fullpath(ext.name)).parent
        stem = ext.name.rsplit(".", 1)[-1]
        kept = KERNEL_CACHE / kernel_key()
        if kept.is_dir() and any(kept.iterdir()):
            out_dir.mkdir(parents=True, exist_ok=True)
            for path in kept.iterdir():
                # a fresh mtime: setuptools copies an extension into the checkout (editable installs) only where
                # it is newer than the one there, so copy2's old time left a stale kernel in place
                shutil.copy(path, out_dir / path.name)
            print(f"mlxspec: reusing the verify kernel built earlier ({kept})", file=sys.stderr)
            return
        super().build_extension(ext)
        built = [path for path in out_dir.glob(f"{stem}*") if path.is_file()]
        if built:
            kept.mkdir(parents=True, exist_ok=True)
            for path in built:
                shutil.copy2(path, kept / path.name)
        print("mlxspec: built the verify kernel", file=sys.stderr)

    def run(self) -> None:
        if os.environ.get("MLXSPEC_NO_KERNEL"):
            print("mlxspec: MLXSPEC_NO_KERNEL is set; skipping the verify kernel", file=sys.stderr)
            return
        try:
            super().run()
        except Exception as error:  # a missing compiler or CMake must not fail the install
            print(f"mlxspec: the verify kernel was not built ({error}); mlxspec runs without it", file=sys.stderr)


# What of the top-level models/ a wheel carries as mlxspec/models: the models and their cards, not the recipes' code
MODEL_FILES = ("*.md", "*.json", "*.txt", "*/*.md", "*/*.json", "*/*.jsonl", "*/*.safetensors")


class BuildWithModels(build_py):
    """build_py that copies the embedded models into the package; an editable install reads the checkout's."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        target = Path(self.build_lib) / "mlxspec" / "models"
        for pattern in MODEL_FILES:
            for path in (HERE / "models").glob(pattern):
                destination = target / path.relative_to(HERE / "models")
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, destination)


extensions = [CMakeExtension("mlxspec._verify_kernel", sourcedir="csrc")] if CMakeExtension else []
setup(ext_modules=extensions, cmdclass={"build_ext": OptionalKernelBuild, "build_py": BuildWithModels})
