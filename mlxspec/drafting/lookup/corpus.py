"""The offline corpus: the running interpreter's standard library, split into train and held-out files."""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

EXCLUDED_DIRS = {"test", "tests", "idlelib", "site-packages", "__pycache__"}
HELDOUT_MODULUS = 20  # ~5% of files are held out, chosen by a hash of their relative path


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    """Every .py file of the stdlib outside tests, idlelib and site-packages, sorted for determinism."""
    root = root or stdlib_root()
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if EXCLUDED_DIRS.intersection(rel.parts[:-1]):
            continue
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def is_heldout(relative_path: str) -> bool:
    # A hash of the path, not of the content, so the split is identical on every machine.
    digest = hashlib.sha256(relative_path.encode()).digest()
    return int.from_bytes(digest[:4], "little") % HELDOUT_MODULUS == 0


def split_files(root: Path | None = None) -> tuple[list[Path], list[Path]]:
    """(train, heldout) file lists."""
    root = root or stdlib_root()
    train, heldout = [], []
    for path in stdlib_files(root):
        (heldout if is_heldout(path.relative_to(root).as_posix()) else train).append(path)
    return train, heldout


def read_text(path: Path) -> str | None:
    """The file's text, or None when it is not valid UTF-8 (a few stdlib files are latin-1)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None
