"""What a new user meets around generation: progress lines, the fast-BLAS warning, draft suggestions."""

import io
import shutil
import warnings

import mlxspec.api as api
from mlxspec.drafting.discovery import find_drafters
from mlxspec.progress import Progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_shows_an_eta_on_a_terminal_and_a_start_and_end_line_in_a_pipe():
    shown, piped = Terminal(), io.StringIO()
    for stream in (shown, piped):
        progress = Progress("measuring", 4, stream=stream)
        progress.update(0)
        progress.update(2)
        progress.close()
    assert "mlxspec: measuring 2/4, ETA" in shown.getvalue() and shown.getvalue().endswith("\r")
    # Issue 36: a pipe once got nothing, and the first run's 90 s measurement was silent; now two plain lines.
    assert piped.getvalue().startswith("mlxspec: measuring (4 parts)...\nmlxspec: measuring: done in ")
    assert "\r" not in piped.getvalue() and len(piped.getvalue().splitlines()) == 2


def test_the_api_warns_about_reference_blas_once(monkeypatch):
    import mlxspec.platform as platform

    monkeypatch.setattr(platform, "fast_blas_hint", lambda: "mlxspec: MLX is using reference BLAS; ...")
    monkeypatch.setattr(api, "_warned_blas", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        api.warn_if_slow_blas()
        api.warn_if_slow_blas()
    assert [w.category for w in caught] == [api.SlowBLASWarning]


def test_cached_models_that_share_the_tokenizer_are_found_as_drafts(tmp_path, monkeypatch, tiny_dirs):
    """A cached model with the target's tokenizer is a draft candidate; one with another tokenizer is not, and the
    target is not its own draft (--draft auto picks among them: test_discovery.py)."""
    cache = tmp_path / "hub"
    for repo, source in (("org--same", "target"), ("org--other", "mismatched"), ("org--self", "target")):
        snapshot = cache / f"models--{repo}" / "snapshots" / "0123"
        snapshot.mkdir(parents=True)
        for name in ("tokenizer.json", "config.json"):
            shutil.copy(tiny_dirs[source] / name, snapshot / name)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    target = cache / "models--org--self" / "snapshots" / "0123"
    found = {c.source: c.matches for c in find_drafters(target) if c.kind == "draft"}
    assert found == {"org/same": True, "org/other": False}
