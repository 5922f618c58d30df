"""Hostile input, round two: each case gets one line on stderr and exit status 2 (or a UserError through the API),
or works correctly. The server's cases are in test_server.py, against a real `mlxspec serve` process."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
from helpers import HANG_LIMIT, assert_one_line

import mlxspec
from mlxspec import UserError

G = ("generate", "def f(x):", "--max-tokens", "8")


@pytest.mark.parametrize("temperature", ["5e-324", "1e-45", "1e-7"])
def test_a_temperature_too_small_to_divide_by_is_refused_not_sampled_as_nan(cli_run, tiny_dirs, temperature):
    result = cli_run(*G, "--model", tiny_dirs["target"], "--temp", temperature, "--json")
    assert_one_line(result, f"temperature {float(temperature)}", "use 0 for greedy")
    spec = mlxspec.load(tiny_dirs["target"], draft=None)
    with pytest.raises(UserError, match="too small to divide logits by"):
        spec.generate("ab", max_tokens=4, temperature=float(temperature))
    # The smallest accepted temperature still samples a real law: tokens, not an instant EOS from NaN.
    result = spec.generate("ab", max_tokens=4, temperature=1e-6, stop_at_eos=False)
    assert len(result.tokens) == 4


def test_empty_model_and_out_names_are_refused(cli_run, tiny_dirs, tmp_path, monkeypatch):
    assert_one_line(cli_run(*G, "--model", ""), "model '' is empty")
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path))
    result = cli_run("train-medusa", "--model", tiny_dirs["target"], "--out", "", "--steps", "1")
    assert_one_line(result, "--out ''", "names no directory")
    assert sorted(os.listdir(tmp_path)) == before  # nothing written into the current directory


@pytest.mark.parametrize("command", ["train-medusa", "train-heads"])
def test_training_into_the_model_directory_is_refused_and_leaves_it_untouched(cli_run, tiny_dirs, tmp_path, command):
    model = tmp_path / "model"
    shutil.copytree(tiny_dirs["target"], model)
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    kind = ("--kind", "medusa") if command == "train-heads" else ()
    for out in (model, model / "heads"):
        result = cli_run(command, *kind, "--model", model, "--out", out, "--steps", "1")
        assert_one_line(result, "is inside the model directory")
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_bench_refuses_an_output_it_cannot_write_before_running(cli_run, tmp_path, flag):
    result = cli_run("bench", "--modes", "draft", flag, "/nonexistent_dir/x.out")
    assert_one_line(result, f"{flag} '/nonexistent_dir/x.out'", "does not exist")
    assert_one_line(cli_run("bench", "--modes", "draft", flag, tmp_path), "is not a file name")


@pytest.mark.parametrize(
    "line",
    ['{"prompt": 5}', '{"tokens": [true, false]}', '{"tokens": "12"}', '{"prompt": ""}', "[1, 2]", '"text"'],
)
def test_bench_prompts_of_the_wrong_type_are_refused_before_running(cli_run, tmp_path, line):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def f():"}\n' + line + "\n")
    result = cli_run("bench", "--modes", "draft", "--repeats", "1", "--prompts", prompts, "--max-tokens", "2")
    assert_one_line(result, f"{prompts}:2 is not a JSON object")


def test_the_api_refuses_a_model_or_options_of_the_wrong_type(tiny_dirs):
    with pytest.raises(UserError, match="model 123 is a int"):
        mlxspec.load(model=123)
    with pytest.raises(UserError, match="options .* is a dict; pass a DecodeOptions"):
        mlxspec.load(tiny_dirs["target"], options={"num_draft": 2})
    spec = mlxspec.load(tiny_dirs["target"], draft=None)
    with pytest.raises(UserError, match="options .* is a dict; pass a DecodeOptions"):
        spec.generate("ab", options={"max_tokens": 2})


def test_a_lone_surrogate_in_a_prompt_becomes_a_replacement_character(tiny_dirs):
    spec = mlxspec.load(tiny_dirs["target"], draft=None)
    result = spec.generate("ab\ud800c", max_tokens=3, stop_at_eos=False)
    assert result.tokens == spec.generate("ab\ufffdc", max_tokens=3, stop_at_eos=False).tokens


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_pipe_where_a_file_should_be_is_refused_not_read_forever(cli_run, tiny_dirs, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_dirs["target"], model)
    (model / "config.json").unlink()
    os.mkfifo(model / "config.json")
    assert_one_line(cli_run(*G, "--model", model), "is not a regular file")
    assert_one_line(cli_run("plan", "--model", model / "config.json"), "is not a regular file")


def run_cli(*args, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLXSPEC_NO_OPENBLAS": "1"}
    command = [sys.executable, "-m", "mlxspec", *map(str, args)]
    return subprocess.run(command, capture_output=True, env=env, timeout=HANG_LIMIT, **kwargs)


def test_a_closed_stdout_gets_one_line_not_a_traceback(tiny_dirs):
    """`mlxspec generate ... >&-`: Python starts with no sys.stdout at all."""
    command = [sys.executable, "-m", "mlxspec", *G, "--model", str(tiny_dirs["target"])]
    env = {**os.environ, "MLXSPEC_NO_OPENBLAS": "1"}
    run = subprocess.run(command, stderr=subprocess.PIPE, env=env, timeout=HANG_LIMIT, preexec_fn=lambda: os.close(1))
    err = run.stderr.decode()
    assert run.returncode == 2 and "Traceback" not in err, err
    assert err.strip().splitlines() == [err.strip()] and "standard output is closed" in err


def test_a_reader_that_stops_early_ends_generate_with_status_zero(tiny_dirs):
    """`generate ... | head -c 10`: the closed pipe means the reader has what it wanted."""
    env = {**os.environ, "MLXSPEC_NO_OPENBLAS": "1"}
    command = [sys.executable, "-m", "mlxspec", *G[:2], "--max-tokens", "200", "--no-draft"]
    command += ["--model", str(tiny_dirs["target"]), "--stop", "never-appears-here"]
    writer = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    writer.stdout.read(1)  # the first bytes, then the reader goes away
    writer.stdout.close()
    assert writer.wait(timeout=HANG_LIMIT) == 0
    err = writer.stderr.read().decode()
    assert "Traceback" not in err, err


def test_serve_on_a_port_already_taken_says_so_in_one_line():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        run = run_cli("serve", "--port", port, "--no-draft")
    err = run.stderr.decode()
    assert run.returncode == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"mlxspec: error: --port {port} on 127.0.0.1 cannot be used")
    assert "serving" not in err and "pass another --port" in err


@pytest.mark.parametrize("key", ["", "   "])
def test_serve_refuses_an_empty_api_key_rather_than_serving_open(key):
    run = run_cli("serve", "--api-key", key, "--no-draft")
    assert run.returncode == 2 and "--api-key (or $MLXSPEC_API_KEY) is empty" in run.stderr.decode()
    env_run = subprocess.run(
        [sys.executable, "-m", "mlxspec", "serve", "--no-draft"],
        capture_output=True,
        env={**os.environ, "MLXSPEC_NO_OPENBLAS": "1", "MLXSPEC_API_KEY": key},
        timeout=HANG_LIMIT,
    )
    assert env_run.returncode == 2 and "is empty" in env_run.stderr.decode()


def test_bench_prompts_hold_json_objects_only(cli_run, tmp_path):
    """A deeply nested line is refused like any other line that is not a prompt object."""
    prompts = tmp_path / "deep.jsonl"
    prompts.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    result = cli_run("bench", "--modes", "draft", "--repeats", "1", "--prompts", prompts)
    assert_one_line(result, f"{prompts}:1 is not a JSON object")


def test_a_config_nested_too_deeply_is_refused(cli_run, tmp_path):
    config = tmp_path / "config.json"
    config.write_text("[" * 100_000 + "]" * 100_000)
    assert_one_line(cli_run("plan", "--model", config), "nests its JSON too deeply")
    json.loads("[]")  # (the parser itself still works afterwards)


BAD_CONFIGS = [
    ("max_position_embeddings", -5),
    ("num_key_value_heads", 0),
    ("head_dim", 0),
    ("vocab_size", 0),
    ("num_attention_heads", 0),
    ("sliding_window_pattern", 0),
    ("max_position_embeddings", "4096"),
    ("num_local_experts", "8"),
    ("num_hidden_layers", 10**15),
    ("hidden_size", True),
    ("quantization", "yes"),
]


@pytest.mark.parametrize("key, value", BAD_CONFIGS, ids=[f"{k}={v!r}" for k, v in BAD_CONFIGS])
def test_a_config_with_a_size_out_of_range_or_of_the_wrong_type_is_refused_by_name(
    cli_run, tiny_dirs, tmp_path, key, value
):
    """One check (model_files.check_config) for plan and generate alike, before any arithmetic divides by it."""
    model = tmp_path / "model"
    shutil.copytree(tiny_dirs["target"], model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, key: value}))
    assert_one_line(cli_run("plan", "--model", model / "config.json"), f"{key}={value!r}")
    assert_one_line(cli_run(*G, "--model", model), f"{key}={value!r}")
    with pytest.raises(UserError, match=key):
        mlxspec.load(model, draft=None)


@pytest.fixture(scope="module")
def head_dirs(tiny_dirs, tmp_path_factory):
    """Valid Medusa heads and an EAGLE head for the tiny target, written as the trainers write them."""
    import mlx.core as mx
    from mlx.utils import tree_map

    from mlxspec.drafting.heads.feature_head import new_eagle_head, save_head
    from mlxspec.drafting.heads.files import base_model_identity
    from mlxspec.drafting.heads.medusa import MedusaConfig, MedusaHeads, save_medusa
    from mlxspec.loading import load_model

    target = load_model(tiny_dirs["target"])
    root = tmp_path_factory.mktemp("heads")
    config = target.config
    medusa = MedusaHeads(
        MedusaConfig(
            num_heads=2,
            hidden_size=config["hidden_size"],
            vocab_size=config["vocab_size"],
            base_model_identity=base_model_identity(target.path),
        )
    )
    save_medusa(medusa, root / "medusa")
    head = new_eagle_head(target.config, target.path)
    mx.random.seed(0)
    head.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.3, head.parameters()))
    save_head(head, root / "eagle")
    return root


def damaged(head_dirs, tmp_path, kind: str, file: str, content) -> str:
    copy = tmp_path / kind
    shutil.copytree(head_dirs / kind, copy)
    target = copy / file
    if callable(content):
        target.write_bytes(content(target.read_bytes()))
    else:
        target.write_text(content)
    return str(copy)


DAMAGE = [
    ("medusa", "medusa_config.json", "{x", "not a readable Medusa config"),
    ("medusa", "medusa_config.json", "[1, 2]", "holds list, not a Medusa config object"),
    ("medusa", "medusa_config.json", '{"num_heads": 2, "hidden_size": 8, "vocab_size": 8, "x": 1}', "unexpected"),
    ("medusa", "medusa_config.json", '{"num_heads": 0, "hidden_size": 8, "vocab_size": 8}', "num_heads=0"),
    ("medusa", "medusa.safetensors", lambda raw: raw[:200], "medusa.safetensors"),
    ("eagle", "eagle.safetensors", lambda raw: raw[:200], "eagle.safetensors"),
    ("eagle", "eagle_config.json", "[" * 100_000 + "]" * 100_000, "not a readable EAGLE head config"),
    ("eagle", "eagle_config.json", '{"block_config": 5}', "block_config"),
]


@pytest.mark.parametrize("kind, file, content, message", DAMAGE, ids=[f"{d[0]}-{d[3][:24]}" for d in DAMAGE])
def test_damaged_head_files_are_named_in_one_line(
    cli_run, tiny_dirs, head_dirs, tmp_path, kind, file, content, message
):
    good = cli_run(*G, "--model", tiny_dirs["target"], f"--{kind}", head_dirs / kind, "-k", "2")
    assert good[0] == 0, good[2]  # the undamaged heads load and draft
    broken = damaged(head_dirs, tmp_path, kind, file, content)
    assert_one_line(cli_run(*G, "--model", tiny_dirs["target"], f"--{kind}", broken), message)


@pytest.mark.slow  # 15-60 s on 2 cores: in the whole suite, not the quick run
def test_a_damaged_checkpoint_is_named_not_resumed(cli_run, tiny_dirs, tmp_path):
    out = tmp_path / "heads"
    args = ("train-medusa", "--model", tiny_dirs["target"], "--out", out, "--seq-len", "16", "--batch-size", "2")
    (out / "checkpoint").mkdir(parents=True)
    (out / "checkpoint" / "state.json").write_text("{not json")
    assert_one_line(cli_run(*args, "--steps", "2"), "state.json' is damaged", "start over")
    (out / "checkpoint" / "state.json").write_text(json.dumps({"step": 1}))  # valid, but its weights are missing
    assert_one_line(cli_run(*args, "--steps", "2"), "has no heads.safetensors", "start over")


@pytest.mark.parametrize(
    "command", [("train-medusa", "--data", "self-distill"), ("train-heads", "--kind", "eagle")], ids=["medusa", "eagle"]
)
def test_a_sequence_too_short_to_self_distill_is_refused_before_any_work(cli_run, tiny_dirs, tmp_path, command):
    result = cli_run(*command, "--model", tiny_dirs["target"], "--out", tmp_path / "h", "--seq-len", "32")
    assert_one_line(result, "--seq-len 32 leaves no room", "--data corpus")
    assert not (tmp_path / "h" / "checkpoint").exists()


def distributed_env(hostfile, rank: str, **extra: str) -> dict:
    return {**os.environ, "MLXSPEC_NO_OPENBLAS": "1", "MLX_HOSTFILE": str(hostfile), "MLX_RANK": rank, **extra}


def test_a_missing_hostfile_or_a_rank_outside_it_is_one_line(tiny_dirs, tmp_path):
    command = [sys.executable, "-m", "mlxspec", *G, "--model", str(tiny_dirs["target"]), "--distributed", "tensor"]
    run = subprocess.run(command, capture_output=True, text=True, env=distributed_env("/nonexistent.json", "0"))
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "MLX_HOSTFILE '/nonexistent.json' cannot be read" in run.stderr
    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps([["127.0.0.1:45811"], ["127.0.0.1:45812"]]))
    run = subprocess.run(command, capture_output=True, text=True, env=distributed_env(hosts, "7"))
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "MLX_RANK 7 is not one of the 2 ranks" in run.stderr


def test_a_rank_whose_peer_never_starts_stops_with_one_line_naming_it(tiny_dirs, tmp_path):
    def free() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    peer = f"127.0.0.1:{free()}"
    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps([[f"127.0.0.1:{free()}"], [peer]]))
    command = [sys.executable, "-m", "mlxspec", *G, "--model", str(tiny_dirs["target"]), "--distributed", "tensor"]
    env = distributed_env(hosts, "0", MLXSPEC_JOIN_TIMEOUT="3")
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=HANG_LIMIT)
    lines = run.stderr.strip().splitlines()
    assert run.returncode != 0 and len(lines) == 1, run.stderr
    assert lines[0].startswith("mlxspec: error: rank 0 waited 3 s") and f"not listening: 1 ({peer})" in lines[0]


# Libraries the command maps while mlx-lm and transformers are being imported in Python (Pillow's, then tokenizers'),
# after MLX's own C++ extension has loaded.
LOADING_MARKS = ("_imaging", "tokenizers")


def wait_until_loading(pid: int) -> None:
    """Until the child is importing mlx-lm (Linux: a library of LOADING_MARKS in /proc maps), which is when this test
    interrupts it. A fixed 0.5 s landed, on a loaded machine, in the interpreter's own start-up or inside MLX's C++
    extension init, which no Python program turns into KeyboardInterrupt (exit -2, -6, or an ImportError from
    nanobind). Elsewhere, 0.5 s as before."""
    import time

    maps = f"/proc/{pid}/maps"
    if not os.path.exists(maps):
        time.sleep(0.5)
        return
    deadline = time.monotonic() + HANG_LIMIT
    while time.monotonic() < deadline:
        try:
            with open(maps) as f:
                mapped = f.read()
        except OSError:
            return
        if any(mark in mapped for mark in LOADING_MARKS):
            return
        time.sleep(0.005)


def test_ctrl_c_while_the_command_loads_exits_130_without_a_traceback(tiny_dirs):
    """Interrupted in the first second, while MLX and mlx-lm are still being imported."""
    import signal

    env = {**os.environ, "MLXSPEC_NO_OPENBLAS": "1"}
    command = [sys.executable, "-m", "mlxspec", *G, "--model", str(tiny_dirs["target"])]
    # As a terminal starts it: a runner that ignores SIGINT (a background job, some CI shells) would hand the child
    # an ignored SIGINT, and then Python never turns Ctrl-C into KeyboardInterrupt at all (seen in .ci/run here).
    restore = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, preexec_fn=restore)
    wait_until_loading(process.pid)
    process.send_signal(signal.SIGINT)
    err = process.communicate(timeout=HANG_LIMIT)[1].decode()
    assert process.returncode == 130 and "Traceback" not in err, (process.returncode, err)


@pytest.mark.parametrize("damage", ["garbage", "unreadable"])
def test_a_damaged_tokenizer_is_named_not_blamed_on_the_weights(cli_run, tiny_dirs, tmp_path, damage):
    model = tmp_path / "model"
    shutil.copytree(tiny_dirs["target"], model)
    tokenizer = model / "tokenizer.json"
    if damage == "garbage":
        tokenizer.write_text('{"version": "1.0", "model": ')
        expected = "cannot be read as a tokenizer"
    else:
        if os.geteuid() == 0:
            pytest.skip("root reads files whatever their permissions")
        tokenizer.chmod(0)
        expected = "is not readable"
    result = cli_run(*G, "--model", model)
    assert_one_line(result, f"'{tokenizer}'", expected)
    assert "re-download" not in result[2]


@pytest.mark.slow  # 15-60 s on 2 cores: in the whole suite, not the quick run
def test_the_truncation_note_comes_before_the_text_and_a_full_context_is_said():
    """On a terminal the --truncate note once printed after the answer; a run stopped by the context (not by
    --max-tokens) ended with finish 'length' and no word about why."""
    env = {**os.environ, "MLXSPEC_NO_OPENBLAS": "1"}
    long_prompt = "x = 1\n" * 400  # past the embedded model's 512-token context
    command = [sys.executable, "-m", "mlxspec", "generate", long_prompt, "--truncate", "--max-tokens", "8"]
    run = subprocess.run(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=HANG_LIMIT
    )
    # a fresh cache's cost-curve measurement may say so first (it runs before the prompt is read); then the note
    lines = [line for line in run.stdout.splitlines() if not line.startswith("mlxspec: measuring")]
    assert run.returncode == 0 and lines[0].startswith("mlxspec: --truncate kept the last"), run.stdout[:300]
    spec = mlxspec.load()
    result = spec.generate("def f(x):", max_tokens=600, stop_at_eos=False)
    assert result.finish_reason == "length" and len(result.tokens) < 600
    assert "context is full" in result.stats.note


def test_medusa_reports_the_depth_it_can_draft_not_the_one_asked():
    from mlxspec.loading import MODELS_DIR

    spec = mlxspec.load(medusa=MODELS_DIR / "medusa", draft=None)
    heads = spec.medusa.config.num_heads
    result = spec.generate("import os", max_tokens=16, num_draft=8)
    assert result.stats.num_draft == heads < 8
    assert result.stats.drafted <= heads * result.stats.target_calls


def test_a_budget_refusal_points_to_a_plan_that_shows_the_same_numbers(cli_run):
    """`--memory-budget` once suggested a plan without the draft, computed in another dtype: other numbers."""
    import re
    import shlex

    code, _, err = cli_run("generate", "import os", "--memory-budget", "300MB")
    assert code == 2, err
    needed = float(re.search(r"these settings need ([\d.]+) GiB", err).group(1))
    command = shlex.split(re.search(r"`(mlxspec plan [^`]+)`", err).group(1))
    assert "--draft" in command
    code, out, plan_err = cli_run(*command[1:])
    assert code == (1 if "DOES NOT FIT" in out else 0), plan_err  # the exit status says the verdict
    total = float(re.search(r"total\s+([\d.]+) GiB", out).group(1))
    assert round(total, 2) == needed


def test_the_plan_says_only_what_applies(cli_run):
    """No drafter: no "drafter overhead 0.000 GiB" and no Medusa line; a small model's size in millions, not 0.00B;
    a draft that does not fit still gets its max-context line ("none fits") instead of losing it."""
    from mlxspec.loading import MODELS_DIR

    target, draft = MODELS_DIR / "target", MODELS_DIR / "draft"
    code, out, err = cli_run("plan", "--model", target, "--memory", "16GB")
    assert code == 0, err
    assert "drafter overhead" not in out and "medusa" not in out and "11.0M params" in out and "0.00B" not in out
    code, out, err = cli_run("plan", "--model", target, "--draft", draft, "--memory", "450MB")  # bf16 matrices held
    assert code == 1, err  # a plan that does not fit exits 1, so a script can test it
    assert "DOES NOT FIT" in out and "max context, target + draft   none fits" in out


def test_the_bench_table_aligns_long_names_shows_ranges_only_from_several_passes_and_names_the_fastest():
    from mlxspec.bench.runner import ModeResult, format_table

    one_pass = ModeResult("mlx-lm plain", 10.0, 10.0, 10.0, 0.0, 1.0, 1.0, 2**20, 1.0, 0.0)
    long_name = ModeResult("mlxspec eagle tree 16n beam 4 (long)", 12.0, 11.0, 13.0, 0.5, 2.0, 0.5, 2**21, 1.2, 1.1)
    lines = format_table([one_pass, long_name]).splitlines()
    header, rows = lines[0], lines[2:4]
    speedup_end = header.index("speedup") + len("speedup")
    assert [row.index("x ") + 1 for row in rows] == [speedup_end, speedup_end]  # no row pushed out of its column
    assert "(" not in rows[0] and "(11.0-13.0)" in rows[1]
    assert lines[-1] == "fastest: mlxspec eagle tree 16n beam 4 (long), 12.0 tok/s (1.20x mlx-lm plain)"


def test_bench_warns_when_its_timings_cannot_show_small_differences():
    from mlxspec.bench.runner import ModeResult, PassClock, noise_note

    def base(low, high):
        return ModeResult("mlx-lm plain", 10.0, low, high, 0.0, 1.0, 1.0, 2**20, 1.0, 0.0)

    assert "one pass measures no noise" in noise_note([base(10.0, 10.0)], repeats=1)
    assert "mlx-lm plain varied by 30% between passes" in noise_note([base(8.0, 11.0)], repeats=3)
    assert noise_note([base(9.8, 10.2)], repeats=3) == ""
    # the time left: two modes of 2 s and 4 s, three passes
    clock = PassClock(["a", "b"], repeats=3)
    assert clock.done("a", 2.0) == 2.0 + 2 * 4.0  # b not timed yet: the mean of those timed (2 s)
    assert clock.done("b", 4.0) == 2 * 6.0
    assert clock.done("a", 2.0) == 4.0 + 6.0
    assert [clock.done("b", 4.0), clock.done("a", 2.0), clock.done("b", 4.0)] == [6.0, 4.0, 0.0]


def test_the_plan_warns_when_the_draft_has_another_vocabulary(cli_run):
    code, out, err = cli_run("plan", "--model", "llama-3.1-8b", "--draft", "qwen2.5-0.5b", "--device", "m2-16gb")
    assert code == (1 if "DOES NOT FIT" in out else 0), err  # the exit status says the verdict
    assert "the draft's vocabulary (151936 tokens) differs from the target's (128256)" in out
    code, out, err = cli_run("plan", "--model", "llama-3.1-8b", "--draft", "llama-3.2-1b", "--device", "m2-16gb")
    assert code == (1 if "DOES NOT FIT" in out else 0) and "vocabulary" not in out
