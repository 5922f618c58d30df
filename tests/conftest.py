import io
import sys

import pytest
from tiny import save_tiny_model_dir

from mlxspec.cli.main import main


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
