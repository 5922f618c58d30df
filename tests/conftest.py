import io
import json
import shutil
import sys

import pytest
from tiny import save_tiny_model_dir

from mlxspec.cli.main import main


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory, worker_id):
    """What this test run measured once (cost curves, corpus tables), never the user's ~/.cache/mlxspec. Shared by
    the run's xdist workers (the folder above each worker's own), so each curve is measured about once per run. It is
    the environment of the whole session too, so servers that module fixtures start read no user cache either."""
    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if worker_id != "master" else base) / "mlxspec-session-cache"
    cache.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as session:
        session.setenv("MLXSPEC_CACHE", str(cache))
        session.setenv("HF_HUB_CACHE", str(cache.parent / "empty-hf-hub"))
        session.setenv("HF_HUB_OFFLINE", "1")
        session.setenv("MLXSPEC_CURVE_ATTEMPTS", "1")  # each cost curve measured once (test_measured_decisions: 3)
        yield cache


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path_factory, session_cache, monkeypatch):
    """Every test gets a fresh mlxspec cache and an empty Hugging Face cache: nothing the user has measured, tuned or
    downloaded can change a test. The cache starts with what earlier tests of this session measured (cost curves,
    corpus tables; never tune records), so each curve is measured once per session, and gets what this test
    measured afterwards. A test that wants another cache sets MLXSPEC_CACHE itself."""
    cache = tmp_path_factory.mktemp("mlxspec-cache")
    for item in session_cache.iterdir():
        if item.is_file() and item.suffix != ".tmp":
            shutil.copy2(item, cache / item.name)
    monkeypatch.setenv("MLXSPEC_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(session_cache.parent / "empty-hf-hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    yield cache
    keep_measurements(cache, session_cache)


def keep_measurements(cache, session_cache) -> None:
    """Cost curves and corpus tables a test measured, merged into the session's (tune records stay behind)."""
    for item in cache.iterdir() if cache.is_dir() else []:
        if not item.is_file() or item.suffix == ".tmp":
            continue
        kept = session_cache / item.name
        if item.name == "cost_curves.json":
            try:
                merged = {**json.loads(kept.read_text()), **json.loads(item.read_text())} if kept.exists() else None
            except (OSError, ValueError):
                merged = None
            if merged is not None:
                write_atomically(kept, json.dumps(merged).encode())
                continue
        if not kept.exists() or item.name == "cost_curves.json":
            write_atomically(kept, item.read_bytes())


def write_atomically(path, data: bytes) -> None:
    """Another worker reads the session cache meanwhile: it sees the old file or the new one, never half of one."""
    import os
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """Saved tiny target and draft model directories sharing a char tokenizer, plus a mismatched draft."""
    root = tmp_path_factory.mktemp("tiny")
    return {
        "target": save_tiny_model_dir(root / "target", seed=0, max_position_embeddings=40),
        "draft": save_tiny_model_dir(root / "draft", seed=1),
        "mismatched": save_tiny_model_dir(root / "mismatched", seed=1, tokenizer_chars="abcdefh"),
        "mismatched_recurrent": save_tiny_model_dir(
            root / "mismatched_recurrent", "qwen3_5", seed=1, tokenizer_chars="abcdefh"
        ),
    }


@pytest.fixture
def cli_run(capsys, monkeypatch):
    """Run `mlxspec ARGS` in this process: (exit status, stdout, stderr)."""
    monkeypatch.setenv("MLXSPEC_NO_OPENBLAS", "1")

    def run(*args, stdin: bytes = b""):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        try:
            main(["mlxspec", *map(str, args)])
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
        out, err = capsys.readouterr()
        return code, out, err

    return run
