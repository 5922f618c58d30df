"""Every bad or contradictory input gets one line on stderr and exit status 2 (or works), never a traceback.

Most cases run the command line in-process (mlxspec.cli.main) for speed; the ones that need a real process (a
full disk, bytes in argv) run it as a subprocess.
"""

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import HANG_LIMIT, assert_one_line
from tiny import save_tiny_model_dir

import mlxspec
from mlxspec import UserError


@pytest.fixture(scope="module")
def broken_models(tmp_path_factory, tiny_dirs):
    """Copies of the tiny target with the damage an interrupted download or a bad conversion leaves."""
    root = tmp_path_factory.mktemp("broken")
    made = {}
    for name in ("truncated", "garbage", "dangling", "no-tokenizer", "no-hidden-size"):
        path = root / name
        shutil.copytree(tiny_dirs["target"], path)
        made[name] = path
    weights = made["truncated"] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    (made["garbage"] / "model.safetensors").write_bytes(b"\x89PNG not weights at all" * 10)
    (made["dangling"] / "model.safetensors").unlink()
    (made["dangling"] / "model.safetensors").symlink_to(root / "nowhere.safetensors")
    (made["no-tokenizer"] / "tokenizer.json").unlink()
    config = json.loads((made["no-hidden-size"] / "config.json").read_text())
    del config["hidden_size"]
    (made["no-hidden-size"] / "config.json").write_text(json.dumps(config))
    return made


G = ("generate", "abc", "--max-tokens", "4")


# train-medusa's sizes and output directory.
def test_train_medusa_refuses_a_window_past_the_context_before_allocating(cli_run, tmp_path):
    result = cli_run("train-medusa", "--out", tmp_path / "d", "--steps", 1, "--batch-size", 1, "--seq-len", 100000)
    assert_one_line(result, "--seq-len 100000", "context of 512")


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--batch-size", "0"], "--batch-size"),
        (["--seq-len", "0"], "--seq-len"),
        (["--lr", "nan"], "--lr nan"),
        (["--heads", "0"], "--heads"),
    ],
)
def test_train_medusa_refuses_bad_sizes(cli_run, tmp_path, args, fragment):
    assert_one_line(cli_run("train-medusa", "--out", tmp_path / "d", *args), fragment)


def test_train_medusa_refuses_a_file_or_unwritable_out(cli_run, tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("mine")
    assert_one_line(cli_run("train-medusa", "--out", a_file, "--steps", 1), "is a file")
    assert a_file.read_text() == "mine"
    assert_one_line(cli_run("train-medusa", "--out", a_file / "sub", "--steps", 1), "cannot write to --out")


def test_train_medusa_never_overwrites_finished_heads(cli_run, tmp_path):
    out = tmp_path / "heads"
    out.mkdir()
    (out / "medusa_config.json").write_text("{}")
    assert_one_line(cli_run("train-medusa", "--out", out, "--steps", 1), "already holds trained heads")
    assert (out / "medusa_config.json").read_text() == "{}"


@pytest.mark.parametrize(
    "state, args, fragment",
    [
        ({"step": 2, "num_heads": 2}, ["--heads", "3"], "num_heads 2"),
        ({"step": 2, "num_heads": 2, "base_model_identity": "another"}, ["--heads", "2"], "another base model"),
    ],
)
def test_train_medusa_refuses_to_resume_another_run(cli_run, tmp_path, tiny_dirs, state, args, fragment):
    checkpoint = tmp_path / "heads" / "checkpoint"
    checkpoint.mkdir(parents=True)
    (checkpoint / "state.json").write_text(json.dumps({**state, "shared_lm_head": True}))
    result = cli_run(
        "train-medusa", "--model", tiny_dirs["target"], "--out", tmp_path / "heads", "--seq-len", 16, *args
    )
    assert_one_line(result, fragment)


# Damaged model directories, for every command that reads one.
@pytest.mark.parametrize("damage", ["truncated", "garbage", "dangling"])
def test_a_damaged_weights_file_is_named_with_the_fix(cli_run, broken_models, tiny_dirs, damage):
    path = broken_models[damage]
    weights = str(path / "model.safetensors")
    assert_one_line(cli_run(*G, "--model", path), weights, "re-download")
    assert_one_line(cli_run(*G, "--model", tiny_dirs["target"], "--draft", path), weights, "re-download")
    assert_one_line(cli_run("plan", "--model", path), weights, "re-download")
    heads = path.parent / f"heads-{damage}"  # beside the model: training into its directory is refused first
    assert_one_line(cli_run("train-medusa", "--model", path, "--out", heads), weights, "re-download")


def test_a_model_without_a_tokenizer_says_so_in_full(cli_run, broken_models):
    assert_one_line(cli_run(*G, "--model", broken_models["no-tokenizer"]), "has no tokenizer", "copy the tokenizer")


def test_a_config_missing_a_key_or_a_directory_as_config_is_one_line(cli_run, broken_models, tmp_path):
    assert_one_line(cli_run("plan", "--model", broken_models["no-hidden-size"] / "config.json"), "'hidden_size'")
    assert_one_line(cli_run(*G, "--model", broken_models["no-hidden-size"]), "could not load", "hidden_size")
    (tmp_path / "config.json").mkdir()
    assert_one_line(cli_run("plan", "--model", tmp_path), "is a directory")
    assert_one_line(cli_run(*G, "--model", tmp_path), "is a directory")


# Invalid UTF-8 is replaced, and the user is told.
def test_invalid_utf8_on_stdin_is_replaced_and_reported(cli_run, tiny_dirs):
    code, out, err = cli_run(
        "generate", "-", "--model", tiny_dirs["target"], "--no-draft", "--max-tokens", 3, stdin=b"ab\xffc"
    )
    assert code == 0 and "Traceback" not in err
    assert "not valid UTF-8; 1 invalid byte sequence(s) were replaced with U+FFFD" in err


def test_invalid_utf8_in_argv_is_replaced_and_reported(tiny_dirs):
    proc = subprocess.run(
        [sys.executable, "-m", "mlxspec", "generate", b"ab\xffc", "--model", tiny_dirs["target"], "--no-draft"]
        + ["--max-tokens", "3"],
        capture_output=True,
        env={"MLXSPEC_NO_OPENBLAS": "1", "PATH": "/usr/bin:/bin", "HOME": str(tiny_dirs["target"].parent)},
        timeout=HANG_LIMIT,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 0 and "Traceback" not in err and "replaced with U+FFFD" in err


# generate refuses bad values with one line before any work.
@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--temp", "nan"], "temperature nan"),
        (["--temp", "inf"], "temperature inf"),
        (["--top-p", "nan"], "top_p"),
        (["--seed", "-1"], "--seed"),
        (["--seed", str(2**64)], "--seed"),
        (["--memory-budget", "0"], "is zero"),
        (["--memory-budget", "1KB"], "the budget is 0.00 GiB"),
        (["--no-draft", "--draft", "{draft}"], "--no-draft contradicts --draft"),
        (["--auto"], "pass --memory-budget too"),
        (["--lookup-candidates", "3"], "needs --lookup"),
        (["--no-corpus-fallback"], "needs --lookup"),
        (["--stop", ""], "empty stop string"),
        (["--tree-topk", "9", "--draft", "{draft}"], "exceeds the vocabulary (8 tokens)"),
        (["--tree-nodes", "10000"], "the deepest tree is 64"),
        (["-k", "0"], "0 is outside 1..64"),
        (["-k", "lots"], "'lots' is not a whole number"),
        (["--max-tokens", "0"], "--max-tokens"),
        (["--draft-bits", "4", "--no-draft"], "has none"),
        (["--kv-bits", "3"], "--kv-bits"),
    ],
)
def test_generate_refuses_bad_values_and_contradictions(cli_run, tiny_dirs, args, fragment):
    filled = [a.format(draft=tiny_dirs["draft"]) for a in args]
    assert_one_line(cli_run(*G, "--model", tiny_dirs["target"], *filled), fragment)


def test_k_auto_is_accepted_and_reported(cli_run, tiny_dirs):
    code, out, err = cli_run(*G, "--model", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "-k", "auto", "--json")
    assert code == 0, err
    assert json.loads(out)["num_draft"] in ("auto", 0)  # 0: the measured cost said drafting cannot pay here


# A too-long prompt gets one line, no tokenizer warning before it; --truncate keeps its tail.
def test_a_too_long_prompt_is_one_line_and_truncate_keeps_the_tail(cli_run, tiny_dirs):
    assert_one_line(cli_run("generate", "ab" * 30, "--model", tiny_dirs["target"]), "context is 40", "--truncate")
    code, out, err = cli_run(
        "generate", "ab" * 30, "--model", tiny_dirs["target"], "--no-draft", "--max-tokens", 5, "--truncate", "--json"
    )
    assert code == 0, err
    assert "kept the last 35 of 60 prompt tokens" in err
    assert json.loads(out)["stats"]["prompt_tokens"] == 35


# The planner's numbers.
@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--memory", "0"], "is zero"),
        (["--group-size", "0"], "--group-size"),
        (["--medusa-heads", "-4"], "--medusa-heads"),
        (["--tree-nodes", "-3"], "--tree-nodes"),
        (["--draft-window", "-10"], "--draft-window"),
        (["-k", "0"], "--num-draft"),
        (["--context", "100000"], "target's own context of 512"),
        (["--memory", "8GB", "--device", "m2-16gb"], "two budgets"),
        (["--model", "no-such-preset"], "not a preset"),
    ],
)
def test_plan_refuses_bad_numbers(cli_run, args, fragment):
    assert_one_line(cli_run("plan", *args), fragment)


# bench's counts and modes are checked before any model loads.
@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--num-prompts", "0"], "--num-prompts"),
        (["--repeats", "0"], "--repeats"),
        (["--modes", "nosuchmode"], "nosuchmode"),
    ],
)
def test_bench_refuses_bad_counts_and_unknown_modes(cli_run, args, fragment):
    assert_one_line(cli_run("bench", *args), fragment)


# A full disk.
def test_writing_to_a_full_disk_is_one_line(tiny_dirs):
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "mlxspec", *G, "--model", tiny_dirs["target"], "--no-draft"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env={"MLXSPEC_NO_OPENBLAS": "1", "PATH": "/usr/bin:/bin", "HOME": str(tiny_dirs["target"].parent)},
            timeout=HANG_LIMIT,
        )
    assert_one_line((proc.returncode, "", proc.stderr), "cannot write the output: No space left on device")


# Bad values through the Python API.
@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(temperature=math.nan), "temperature nan"),
        (dict(temperature=math.inf), "temperature inf"),
        (dict(temperature="hot"), "temperature 'hot' is not a finite number"),
        (dict(max_tokens=None), "max_tokens None"),
        (dict(seed=-1), "seed -1"),
        (dict(seed=1.5), "seed 1.5"),
        (dict(seed=2**64), "seed"),
        (dict(num_draft="four"), "'four' is not a whole number"),
        (dict(stop=[3]), "stop [3]"),
        (dict(prompt=[99999]), "prompt token 99999"),
        (dict(prompt=[-1]), "prompt token -1"),
        (dict(prompt=[True]), "prompt token True"),
        (dict(nonsense=1), "unknown option 'nonsense'"),
    ],
)
def test_api_refuses_bad_values_by_name(tiny_dirs, kwargs, fragment):
    spec = mlxspec.load(tiny_dirs["target"], draft=None)
    prompt = kwargs.pop("prompt", "abc")
    with pytest.raises(UserError, match=None) as info:
        spec.generate(prompt, **kwargs)
    assert fragment in str(info.value)


def test_api_num_draft_as_text_means_that_number(tiny_dirs):
    spec = mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["target"])
    result = spec.generate("abc", max_tokens=8, num_draft="4")
    assert result.stats.num_draft == 4 and result.stats.drafted > 0


def test_api_seed_none_is_random_and_reported_so_the_run_repeats(tiny_dirs):
    """A run without a seed reports the seed it drew and the rule it kept drafts by (Leviathan/Chen: no seed was
    given); the two together repeat it."""
    spec = mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["draft"], num_draft=2)
    first = spec.generate("abc", max_tokens=12, temperature=1.0, seed=None, stop_at_eos=False)
    assert first.stats.acceptance == "residual"
    seed, rule = first.stats.seed, first.stats.acceptance
    again = spec.generate("abc", max_tokens=12, temperature=1.0, seed=seed, acceptance=rule, stop_at_eos=False)
    assert again.tokens == first.tokens


def test_api_stop_as_a_string_is_one_stop_string(tiny_dirs):
    spec = mlxspec.load(tiny_dirs["target"], draft=None)
    full = spec.generate("abc", max_tokens=20, stop_at_eos=False)
    stop = full.text[2:4]
    assert len(stop) == 2
    as_string = spec.generate("abc", max_tokens=20, stop=stop, stop_at_eos=False)
    assert as_string.text == full.text[: full.text.index(stop)] and as_string.finish_reason == "stop"
    assert as_string.text == spec.generate("abc", max_tokens=20, stop=[stop], stop_at_eos=False).text


def test_module_generate_takes_every_load_keyword(tiny_dirs):
    result = mlxspec.generate(
        "abc",
        model=tiny_dirs["target"],
        draft=tiny_dirs["draft"],
        draft_window=8,
        num_draft=2,
        max_tokens=6,
        quantize_target=None,
    )
    assert len(result.tokens) <= 6 and result.stats.drafted > 0


# A head size that is not a multiple of 64 (Phi-3's 96) quantizes its KV cache in groups of 32.
def test_kv_bits_on_head_dim_96_works_and_is_planned_that_way(tmp_path):
    import mlx.core as mx

    from mlxspec.cache.rollback import make_speculative_cache
    from mlxspec.plan import memory_model as mm

    path = save_tiny_model_dir(tmp_path / "hd96", hidden_size=192, num_attention_heads=2, num_key_value_heads=1)
    spec = mlxspec.load(path, draft=path, kv_bits=8, num_draft=3)
    assert len(spec.generate("abcab", max_tokens=8, stop_at_eos=False).tokens) == 8
    cache = make_speculative_cache(spec.target.model, max_rollback=4, kv_bits=8)
    spec.target.model(mx.arange(20)[None] % 8, cache=cache)
    mx.eval([c.state for c in cache])
    planned = mm.kv_cache_bytes(spec.target.config, 20, 0, kv_bits=8)
    assert planned == sum(c.nbytes for c in cache)


def test_kv_bits_on_an_unquantizable_head_size_is_refused_and_not_suggested(tmp_path):
    from mlxspec.plan.devices import Device
    from mlxspec.plan.metadata import load_metadata
    from mlxspec.plan.planner import PlanRequest, make_plan

    path = save_tiny_model_dir(tmp_path / "hd80", hidden_size=160, num_attention_heads=2, num_key_value_heads=1)
    with pytest.raises(UserError, match="head_dim 80"):
        mlxspec.load(path, draft=None, kv_bits=8).generate("abc", max_tokens=2)
    request = PlanRequest(load_metadata(str(path)), Device("tiny", 2**20, 2**20, "test"), context=64)
    assert not any("--kv-bits" in r["how"] for r in make_plan(request).recommendations)


# The BLAS in use is judged by library file names, once per process.
def test_blas_detection_ignores_names_that_only_contain_mkl():
    from mlxspec.platform import classify_blas

    jit = "/tmp/mlx/libmlx_compiled_Multiply_mklz_float32.so"
    wheel = "/venv/lib/python3.11/site-packages/mlx_cpu.libs/libblas-a1b2.so.3"
    assert classify_blas([jit, wheel]) == "reference"
    assert classify_blas([jit, "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"]) == "openblas"
    assert classify_blas(["/opt/intel/lib/libmkl_rt.so.2"]) == "other"
    assert classify_blas(["/venv/numpy.libs/libscipy_openblas64_-ff651d7f.so"]) == "reference"


@pytest.mark.skipif(sys.platform != "linux", reason="elsewhere the BLAS is the platform's (Accelerate on macOS)")
def test_blas_in_use_classifies_this_process_libraries_and_reads_them_once(monkeypatch):
    import mlx.core  # noqa: F401  (MLX loaded: its BLAS is mapped)

    from mlxspec.platform import blas_in_use, classify_blas

    mapped = [line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "/" in line]
    first = blas_in_use()
    assert first == classify_blas(mapped) and first in ("reference", "openblas", "other")

    def unreadable(*args, **kwargs):
        raise OSError("read again")

    monkeypatch.setattr(Path, "read_text", unreadable)
    assert blas_in_use() == first  # read once per process: a second call reads nothing
