"""Recurrent targets (every layer an SSM state that cannot be trimmed): plain decoding works through the same code,
drafting is refused by name, and a default drafter falls back to plain decoding with a note."""

import pytest
from helpers import mlx_lm_greedy
from tiny import save_tiny_model_dir

import mlxspec
from mlxspec import UserError


@pytest.fixture(scope="module")
def mamba_dir(tmp_path_factory):
    return save_tiny_model_dir(tmp_path_factory.mktemp("mamba") / "mamba", family="mamba")


def test_plain_decoding_on_a_recurrent_model_equals_mlx_lm(mamba_dir):
    spec = mlxspec.load(mamba_dir, draft=None)
    result = spec.generate("abc", max_tokens=12, stop_at_eos=False)
    assert result.tokens == mlx_lm_greedy(spec.target.model, spec.encode("abc"), 12)
    assert result.stats.mode == "plain" and result.stats.target_calls == 12


def test_sampled_plain_decoding_on_a_recurrent_model_repeats_with_its_seed(mamba_dir):
    spec = mlxspec.load(mamba_dir, draft=None)
    first = spec.generate("abc", max_tokens=10, temperature=1.0, seed=4, stop_at_eos=False)
    assert first.tokens == spec.generate("abc", max_tokens=10, temperature=1.0, seed=4, stop_at_eos=False).tokens


def test_drafting_for_a_recurrent_model_is_refused_by_name(mamba_dir, tiny_dirs):
    with pytest.raises(UserError, match="mamba keeps recurrent state .* --no-draft"):
        mlxspec.load(mamba_dir, draft=mamba_dir).generate("abc", max_tokens=4)
    with pytest.raises(UserError, match="mamba keeps recurrent state"):
        mlxspec.load(mamba_dir, draft=None).generate("abc", max_tokens=4, lookup=True, num_draft=4)


def test_the_default_lookup_drafter_falls_back_to_plain_with_a_note(mamba_dir):
    spec = mlxspec.load(mamba_dir)  # a target of one's own: prompt lookup by default
    result = spec.generate("abc", max_tokens=8, stop_at_eos=False)
    assert result.stats.mode == "plain" and "decoding plainly" in result.stats.note
    assert result.tokens == mlx_lm_greedy(spec.target.model, spec.encode("abc"), 8)


def test_cli_no_draft_works_and_plan_refuses_the_family(mamba_dir):
    import subprocess
    import sys

    run = lambda *a: subprocess.run([sys.executable, "-m", "mlxspec", *map(str, a)], capture_output=True, text=True)  # noqa: E731
    gen = run("generate", "abc", "--model", mamba_dir, "--no-draft", "--max-tokens", 4)
    assert gen.returncode == 0 and "Traceback" not in gen.stderr, gen.stderr
    for args in (["plan", "--model", mamba_dir], ["generate", "abc", "--model", mamba_dir, "--memory-budget", "8GB"]):
        proc = run(*args)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "model_type 'mamba' is not supported" in proc.stderr
