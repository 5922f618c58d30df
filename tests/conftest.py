import pytest
from tiny import save_tiny_model_dir


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """Saved tiny target and draft model directories sharing a char tokenizer, plus a mismatched draft."""
    root = tmp_path_factory.mktemp("tiny")
    return {
        "target": save_tiny_model_dir(root / "target", seed=0, max_position_embeddings=40),
        "draft": save_tiny_model_dir(root / "draft", seed=1),
        "mismatched": save_tiny_model_dir(root / "mismatched", seed=1, tokenizer_chars="abcdefh"),
    }
