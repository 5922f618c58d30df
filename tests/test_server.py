"""`mlxspec serve` against the official `openai` client: a real server process on a free localhost port, serving
the embedded target and draft. Outputs are checked for exactness against `mlxspec generate`, the prompt cache for
reuse, and the refusals (400, 401, 503) and a mid-stream disconnect for a server that keeps working."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest
from helpers import HANG_LIMIT

KEY = "sk-test-key"
MAX_BODY = 200_000  # the server fixture's --max-body-bytes
PROMPT = "def add(a, b):"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, process: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited: {url.log.read_text()}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
                if json.load(response)["status"] == "ok":
                    return
        except OSError:
            pass
        time.sleep(0.2)  # not up yet, or "warming up"
    raise RuntimeError("the server did not come up")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The server's URL; -v logs one stats line per request to server.log beside it."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("serve") / "server.log"
    command = [
        sys.executable,
        "-m",
        "mlxspec",
        "serve",
        "--port",
        str(port),
        "--api-key",
        KEY,
        "--max-queue",
        "1",
        "--max-batch",
        "2",
        "--max-body-bytes",
        str(MAX_BODY),
        "-v",
    ]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stderr=log, stdout=subprocess.DEVNULL, text=True)
    url = f"http://127.0.0.1:{port}"
    url_and_log = type("Server", (str,), {"log": log_path})(url)
    try:
        wait_healthy(url_and_log, process)
        yield url_and_log
    finally:
        process.terminate()
        process.wait(timeout=HANG_LIMIT)


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=HANG_LIMIT)


def chat(client, content=PROMPT, **kwargs):
    return client.chat.completions.create(model="default", messages=[{"role": "user", "content": content}], **kwargs)


def health(server) -> dict:
    with urllib.request.urlopen(f"{server}/health", timeout=5) as response:
        return json.load(response)


def test_greedy_chat_equals_generate_chat_and_names_the_served_model(client):
    reply = chat(client, max_tokens=40, temperature=0)
    generated = subprocess.run(
        [sys.executable, "-m", "mlxspec", "generate", "--chat", PROMPT, "--max-tokens", "40", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    reference = json.loads(generated.stdout)
    assert reply.choices[0].message.content == reference["text"]
    assert reply.usage.completion_tokens == len(reference["tokens"])
    assert reply.choices[0].finish_reason == reference["finish_reason"] == "length"
    assert reply.model == "mlxspec-embedded"  # the client sent "default"
    assert [m.id for m in client.models.list().data] == ["mlxspec-embedded"]


def test_streamed_chat_and_completions_add_up_to_the_whole_answer(client):
    whole = chat(client, max_tokens=30, temperature=0).choices[0].message.content
    stream = chat(client, max_tokens=30, temperature=0, stream=True, stream_options={"include_usage": True})
    pieces, finish, usage = [], None, None
    for event in stream:
        if event.choices:
            pieces.append(event.choices[0].delta.content or "")
            finish = event.choices[0].finish_reason or finish
        if event.usage:
            usage = event.usage
    assert "".join(pieces) == whole and finish == "length"
    assert usage.completion_tokens == 30
    text = client.completions.create(model="x", prompt=PROMPT, max_tokens=30, temperature=0)
    assert text.choices[0].text == whole  # the embedded chat template only joins the messages' text
    streamed = client.completions.create(model="x", prompt=PROMPT, max_tokens=30, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == whole


# A streamed chat completion with stream_options.include_usage, as OpenAI's API sends it (transcribed from its API
# reference for chat streaming; ids, times and text are whatever they were): each chunk's keys, in order.
OPENAI_CHAT_STREAM = [
    {
        "id": "chatcmpl-123",
        "object": "chat.completion.chunk",
        "created": 1694268190,
        "model": "gpt-4o-mini",
        "system_fingerprint": "fp_44709d6fcb",
        "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        ],
        "usage": None,
    },
    {
        "id": "chatcmpl-123",
        "object": "chat.completion.chunk",
        "created": 1694268190,
        "model": "gpt-4o-mini",
        "system_fingerprint": "fp_44709d6fcb",
        "choices": [{"index": 0, "delta": {"content": "Hello"}, "logprobs": None, "finish_reason": None}],
        "usage": None,
    },
    {
        "id": "chatcmpl-123",
        "object": "chat.completion.chunk",
        "created": 1694268190,
        "model": "gpt-4o-mini",
        "system_fingerprint": "fp_44709d6fcb",
        "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
        "usage": None,
    },
    {
        "id": "chatcmpl-123",
        "object": "chat.completion.chunk",
        "created": 1694268190,
        "model": "gpt-4o-mini",
        "system_fingerprint": "fp_44709d6fcb",
        "choices": [],
        "usage": {"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21},
    },
]


def shape(value):
    """A JSON value's structure: dicts as their keys (recursively), lists elementwise, other values as their type."""
    if isinstance(value, dict):
        return {key: shape(v) for key, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return type(value).__name__


def raw_stream(server, body: dict) -> list:
    request = urllib.request.Request(
        f"{server}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=HANG_LIMIT) as response:
        events = [line[len("data: ") :] for line in response.read().decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(event) for event in events[:-1]]


def test_a_streamed_chat_has_the_shape_of_openais_and_its_own_creation_time(server):
    """Chunk by chunk the keys OpenAI's stream has, in its order: a role chunk with no text, text chunks, the finish
    chunk, then the usage chunk, each with logprobs and usage null and a system_fingerprint; `created` is this
    completion's time, not the server's start; and -v logs the stream as done, not as a client gone."""
    time.sleep(1.1)  # the server started at least a second before this completion
    before = int(time.time())
    body = {"model": "x", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 3, "temperature": 0}
    chunks = raw_stream(server, {**body, "stream": True, "stream_options": {"include_usage": True}})
    openai_text_chunk = shape(OPENAI_CHAT_STREAM[1])
    expected = (
        [shape(OPENAI_CHAT_STREAM[0])]
        + [openai_text_chunk] * (len(chunks) - 3)
        + [shape(c) for c in OPENAI_CHAT_STREAM[2:]]
    )
    got = [shape(c) for c in chunks]
    usage_keys = list(got[-1]["usage"])
    expected[-1]["usage"] = {key: got[-1]["usage"][key] for key in usage_keys}  # mlxspec's usage says more
    assert all(key in usage_keys for key in OPENAI_CHAT_STREAM[-1]["usage"])
    assert [list(c) for c in got] == [list(c) for c in expected] and got == expected
    assert len({c["created"] for c in chunks}) == 1 and before <= chunks[0]["created"] <= time.time()
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    for _ in range(5):
        raw_stream(server, {**body, "stream": True})
    time.sleep(0.5)  # the worker logs after it hands the stream its end
    finished = [line for line in server.log.read_text().splitlines() if line.startswith("mlxspec: ")]
    assert not any("client gone" in line for line in finished[-6:]), finished[-6:]


def test_usage_carries_the_speculative_stats_and_the_reused_prefix(client):
    first = chat(client, content="import os\nimport sys\n", max_tokens=24, temperature=0)
    stats = first.usage.model_extra["speculative"]
    assert stats["mode"] == "draft" and stats["drafted"] > 0 and stats["accepted"] > 0
    assert 0 < stats["acceptance_rate"] <= 1 and stats["tokens_per_target_call"] > 1
    # The next turn resends the conversation: everything the cache holds is reused.
    messages = [
        {"role": "user", "content": "import os\nimport sys\n"},
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "\n\ndef main():"},
    ]
    second = client.chat.completions.create(model="default", messages=messages, max_tokens=8, temperature=0)
    reused = second.usage.prompt_tokens_details.cached_tokens
    assert second.usage.model_extra["speculative"]["prompt_cache"] == "prefix"
    assert first.usage.prompt_tokens < reused < second.usage.prompt_tokens
    # The rule sampled drafts were kept by: none when greedy, coupled for a seeded request, Leviathan/Chen without.
    assert stats["acceptance"] is None
    seeded = chat(client, content="import os\n", max_tokens=4, temperature=0.7, seed=1).usage.model_extra
    unseeded = chat(client, content="import os\n", max_tokens=4, temperature=0.7).usage.model_extra
    assert seeded["speculative"]["acceptance"] == "coupled" and unseeded["speculative"]["acceptance"] == "residual"


def test_stop_strings_and_seeds(client):
    whole = chat(client, max_tokens=40, temperature=0).choices[0].message.content
    stop = whole[10:14]
    cut = chat(client, max_tokens=40, temperature=0, stop=[stop, "never appears"])
    assert cut.choices[0].message.content == whole[: whole.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    # A seed repeats a sampled text token for token whatever drafts: -k auto (its lengths follow the machine's
    # timing), a fixed length, and plain decoding all write the same text (position-keyed draws, decoding/keys.py).
    runs = [
        {},
        {"speculative": {"num_draft": 3}},
        {"speculative": {"num_draft": 1}},
        {"speculative": {"enabled": False}},
    ]
    texts = [
        chat(client, max_tokens=30, temperature=1.0, seed=7, extra_body=extra).choices[0].message.content
        for extra in runs
    ]
    assert (
        len(set(texts)) == 1
        and chat(client, max_tokens=30, temperature=1.0, seed=8).choices[0].message.content != texts[0]
    )


def test_n_choices_are_the_rows_of_one_batch_each_with_its_own_seed(client):
    """n > 1: n rows decoded together, choice i seeded seed + i, so each equals the one-choice answer with that
    seed; the usage counts the prompt once and every choice's tokens."""
    several = chat(client, max_tokens=16, temperature=1.0, seed=40, n=3)
    alone = [chat(client, max_tokens=16, temperature=1.0, seed=40 + i) for i in range(3)]
    assert [c.index for c in several.choices] == [0, 1, 2]
    assert [c.message.content for c in several.choices] == [a.choices[0].message.content for a in alone]
    assert len({c.message.content for c in several.choices}) > 1
    assert several.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    assert several.usage.prompt_tokens == alone[0].usage.prompt_tokens


def test_logprobs_are_the_targets_as_the_api_reports_them_drafting_or_not(client):
    """Chat's logprobs/top_logprobs: one entry per completion token, each the API's value for that token (mlx-lm's
    logprobs of the processed target), the same with drafting on and off, streamed or not."""
    import mlxspec

    settings = dict(max_tokens=12, temperature=0.8, seed=9, logprobs=True, top_logprobs=2)
    drafted = chat(client, **settings)
    plain = chat(client, **settings, extra_body={"speculative": {"enabled": False}})
    content = drafted.choices[0].logprobs.content
    assert len(content) == drafted.usage.completion_tokens and all(len(e.top_logprobs) == 2 for e in content)
    assert [e.logprob for e in content] == [e.logprob for e in plain.choices[0].logprobs.content]
    chunks = mlxspec.load().stream(PROMPT, chat=True, max_tokens=12, temperature=0.8, seed=9, logprobs=2)
    api = [value for c in chunks for value, _ in c.logprobs]
    assert [e.logprob for e in content] == pytest.approx(api, abs=1e-6)
    assert "".join(e.token for e in content) == drafted.choices[0].message.content
    streamed = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": PROMPT}], stream=True, **settings
    )
    values = [e.logprob for c in streamed if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert values == [e.logprob for e in content]


def test_streamed_n_choices_carry_their_index_and_add_up_to_the_whole_choices(client):
    settings = dict(max_tokens=16, temperature=1.0, seed=40, n=3)
    whole = chat(client, **settings)
    stream = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": PROMPT}],
        stream=True,
        stream_options={"include_usage": True},
        **settings,
    )
    texts, finishes, usage = ["", "", ""], [None] * 3, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            finishes[choice.index] = choice.finish_reason or finishes[choice.index]
    assert texts == [c.message.content for c in whole.choices] and None not in finishes
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_penalties_and_a_logit_bias_are_applied_as_the_api_applies_them(client):
    """OpenAI's presence and frequency penalties and logit bias, mlx-lm's repetition penalty: the server's text
    equals the API's with the same settings, speculating or not, and differs from the text without them."""
    import mlxspec

    settings = dict(max_tokens=24, temperature=0.9, seed=3, presence_penalty=1.0, frequency_penalty=0.5)
    extra = {"repetition_penalty": 1.3, "logit_bias": {"12": -100}}
    served = chat(client, **settings, extra_body=extra).choices[0].message.content
    plain = chat(client, **settings, extra_body={**extra, "speculative": {"enabled": False}}).choices[0].message.content
    api = mlxspec.load().generate(PROMPT, chat=True, **settings, repetition_penalty=1.3, logit_bias={12: -100.0}).text
    assert served == plain == api
    assert served != chat(client, max_tokens=24, temperature=0.9, seed=3).choices[0].message.content


def test_turning_drafting_off_per_request_changes_only_the_speed(client):
    drafted = chat(client, max_tokens=30, temperature=0)
    plain = chat(client, max_tokens=30, temperature=0, extra_body={"speculative": {"enabled": False}})
    assert plain.choices[0].message.content == drafted.choices[0].message.content
    assert plain.usage.model_extra["speculative"]["mode"] == "plain"
    lookup = chat(client, max_tokens=30, temperature=0, extra_body={"speculative": {"lookup": True, "num_draft": 3}})
    assert lookup.choices[0].message.content == drafted.choices[0].message.content


@pytest.mark.parametrize(
    "kwargs,param",
    [
        (dict(max_tokens=-1), "max_tokens"),
        (dict(temperature="hot"), "temperature"),
        (dict(n=0), "n"),
        (dict(n=17), "n"),
        (dict(logprobs=True, top_logprobs=21), "top_logprobs"),
        (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]), "tools"),
        (dict(content="x = 1\n" * 300), "messages"),  # longer than the 512-token context
        (dict(extra_body={"speculative": {"depth": 3}}), "speculative"),
        (dict(seed=2**64), "seed"),
        (dict(top_p=1.5), "top_p"),
        (dict(extra_body={"speculative": {"num_draft": 0}}), "speculative.num_draft"),
        (dict(temperature=1e-45), "temperature"),  # too small to divide logits by: it once sampled NaN
    ],
)
def test_bad_requests_get_a_400_naming_the_parameter_and_the_server_goes_on(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as refused:
        chat(client, **kwargs)
    assert refused.value.status_code == 400
    assert refused.value.body["param"] == param and refused.value.body["type"] == "invalid_request_error"
    assert chat(client, max_tokens=3).usage.completion_tokens == 3


def test_malformed_json_gets_a_400(server):
    request = urllib.request.Request(
        f"{server}/v1/chat/completions", data=b'{"messages": [', headers={"Authorization": f"Bearer {KEY}"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400
    assert "not valid JSON" in json.load(refused.value)["error"]["message"]


def post(server: str, path: str, data: bytes, key: str = KEY) -> tuple[int, dict]:
    request = urllib.request.Request(f"{server}{path}", data=data, headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=HANG_LIMIT) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as refused:
        return refused.code, json.load(refused)


def test_a_body_nested_too_deeply_gets_a_400_and_a_body_too_big_a_413(server, client):
    status, body = post(server, "/v1/completions", b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and "nests too deeply" in body["error"]["message"]
    big = json.dumps({"model": "m", "prompt": "x" * (MAX_BODY + 1)}).encode()
    status, body = post(server, "/v1/completions", big)
    assert (
        status == 413
        and body["error"]["code"] == "request_too_large"
        and "--max-body-bytes" in body["error"]["message"]
    )
    assert chat(client, max_tokens=2).usage.completion_tokens == 2  # and the server goes on


def test_lone_surrogates_in_prompts_become_replacement_characters(server):
    """JSON may carry a lone surrogate (an escaped \\ud800); it cannot be tokenized, so it reads as U+FFFD, as in
    generate. Sent raw: the openai client cannot encode one itself."""

    def complete(prompt: str) -> tuple[int, dict]:
        return post(
            server, "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": 4, "temperature": 0}).encode()
        )

    broken, clean = complete("import \ud800os"), complete("import \ufffdos")
    assert broken[0] == clean[0] == 200, broken
    assert broken[1]["choices"][0]["text"] == clean[1]["choices"][0]["text"]
    message = {"messages": [{"role": "user", "content": "def \udc80f(x):"}], "max_tokens": 2}
    status, body = post(server, "/v1/chat/completions", json.dumps(message).encode())
    assert status == 200 and body["usage"]["completion_tokens"] == 2


def test_an_unknown_model_id_gets_a_404_and_no_file_is_read(server, client):
    served = client.models.list().data[0].id
    assert client.models.retrieve(served).id == served
    for unknown in ("nonexistent-model", "../../etc/passwd"):
        request = urllib.request.Request(f"{server}/v1/models/{unknown}", headers={"Authorization": f"Bearer {KEY}"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=HANG_LIMIT)
        assert refused.value.code == 404
        error = json.load(refused.value)["error"]
        assert error["code"] == "not_found" and served in error["message"] and "root:" not in error["message"]


def test_the_bearer_scheme_is_case_insensitive(server):
    for scheme in ("bearer", "BEARER", "Bearer"):
        request = urllib.request.Request(f"{server}/v1/models", headers={"Authorization": f"{scheme} {KEY}"})
        with urllib.request.urlopen(request, timeout=HANG_LIMIT) as response:
            assert response.status == 200


def test_a_non_ascii_key_and_one_with_spaces_around_it_authenticate():
    """The key's UTF-8 bytes are what a client sends; starlette hands them over decoded as latin-1."""
    from starlette.testclient import TestClient

    from mlxspec.serve.server import OpenAIServer, ServeConfig

    app = OpenAIServer(None, ServeConfig(model_id="m", api_key="clé")).app()
    with TestClient(app) as http:
        assert http.get("/v1/models", headers={"Authorization": "Bearer clé".encode()}).status_code == 200
        assert http.get("/v1/models", headers={"Authorization": "Bearer cle"}).status_code == 401
        assert http.get("/v1/models", headers={"Authorization": b"Bearer  cl\xc3\xa9 "}).status_code == 200


def test_a_missing_or_wrong_key_gets_a_401(server):
    for key in ("wrong", ""):
        wrong = openai.OpenAI(base_url=f"{server}/v1", api_key=key or "none", max_retries=0)
        if not key:
            wrong = wrong.with_options(default_headers={"Authorization": ""})
        with pytest.raises(openai.AuthenticationError):
            chat(wrong, max_tokens=2)


def test_a_full_queue_gets_a_503_and_a_disconnect_frees_the_worker(client, server):
    # Two long streams decode together (--max-batch 2); a third request waits (--max-queue 1); a fourth finds the
    # queue full.
    running = [chat(client, max_tokens=450, temperature=1.0, seed=12345 + i, stream=True) for i in range(2)]
    for stream in running:
        next(iter(stream))
    waited = {}
    waiter = threading.Thread(target=lambda: waited.update(reply=chat(client, max_tokens=2)))
    waiter.start()
    deadline = time.monotonic() + HANG_LIMIT  # the waiter's thread may start late on a loaded host
    while health(server)["waiting"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert health(server)["waiting"] == 1
    with pytest.raises(openai.InternalServerError) as refused:
        chat(client, max_tokens=2)
    assert refused.value.status_code == 503
    # Disconnect mid-stream: the generations stop at their next step, the waiting request runs, the server goes on.
    for stream in running:
        stream.close()
    waiter.join(timeout=HANG_LIMIT)
    assert waited["reply"].usage.completion_tokens == 2
    assert chat(client, max_tokens=3).usage.completion_tokens == 3
    deadline = time.monotonic() + HANG_LIMIT  # a closed stream stops at its next step, which a loaded host delays
    while health(server)["busy"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert health(server) == {"status": "ok", "model": "mlxspec-embedded", "busy": False, "waiting": 0}
    # The closed streams' stats lines: they stopped well short of the 450 tokens they asked for.
    for i in range(2):
        line = next(line for line in server.log.read_text().splitlines() if f" seed={12345 + i} " in line)
        assert int(line.split(" tokens=")[1].split()[0]) < 300, line


def test_concurrent_requests_decode_together_each_as_it_would_alone(client, server):
    """Clients at once (two rows batched, one waiting its turn): each answer, greedy or sampled with its seed,
    equals the one it gets alone; a client leaves mid-stream and the others' answers do not change. (An adaptive
    draft length follows the batch's rows, and a sampled answer's draws follow the draft lengths: so the sampled
    asks fix theirs, as a client wanting a seed repeated under load does; greedy ones stay adaptive.)"""
    fixed = {"extra_body": {"speculative": {"num_draft": 3}}}
    asks = [
        dict(content="import os\n", max_tokens=24, temperature=0),
        dict(content="class Point:\n", max_tokens=17, temperature=0.7, seed=3, **fixed),
        dict(content="def main(argv):\n", max_tokens=30, temperature=0, stop=["\n\n"]),
        dict(content="for i in range(10):\n", max_tokens=12, temperature=1.0, seed=9, **fixed),
    ]
    alone = [chat(client, **ask).choices[0].message.content for ask in asks]
    together: dict[int, str] = {}

    def ask(i):
        try:
            together[i] = chat(client, **asks[i]).choices[0].message.content
        except Exception as error:  # reported by the assertion below
            together[i] = f"{type(error).__name__}: {error}"

    for pair, leaving in (((0, 1), True), ((2, 3), False)):  # (the server holds 2 rows and 1 waiting request)
        leaver = chat(client, max_tokens=400, temperature=1.0, seed=77, stream=True) if leaving else None
        if leaver is not None:
            next(iter(leaver))
        threads = [threading.Thread(target=ask, args=(i,)) for i in pair]
        for thread in threads:
            thread.start()
        if leaver is not None:
            time.sleep(0.5)
            leaver.close()
        for thread in threads:
            thread.join(timeout=HANG_LIMIT)
    assert [together[i] for i in range(len(asks))] == alone


def test_serve_without_its_extra_says_how_to_install_it(tmp_path):
    blocker = tmp_path / "uvicorn.py"
    blocker.write_text("raise ImportError('blocked for this test')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "mlxspec", "serve"], capture_output=True, text=True, env=env)
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "mlxspec: error: mlxspec serve needs Starlette and uvicorn; from a checkout: pip install -e '.[serve]'; "
        "installed with pipx: pipx inject mlxspec starlette uvicorn"
    )


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGINT"])
def test_a_signal_ends_open_streams_with_an_error_event_and_exits_zero(tmp_path, stop):
    """Shutting down mid-stream: the client reads an error event (not a cut connection), nothing is printed as a
    traceback, and the process exits with status 0."""
    import signal

    port = free_port()
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "mlxspec", "serve", "--port", str(port)], stderr=log, stdout=subprocess.DEVNULL
        )
    url = type("Server", (str,), {"log": log_path})(f"http://127.0.0.1:{port}")
    try:
        wait_healthy(url, process)
        body = {"prompt": "def fibonacci(n):", "max_tokens": 400, "stream": True, "stop": ["never appears"]}
        request = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode())
        with urllib.request.urlopen(request, timeout=HANG_LIMIT) as response:
            events = [response.readline()]  # the stream is open and generating
            process.send_signal(getattr(signal, stop))
            events += [line for line in response if line.startswith(b"data: ")]
        assert process.wait(timeout=HANG_LIMIT) == 0
    finally:
        if process.poll() is None:
            process.kill()
    last = json.loads(events[-1].removeprefix(b"data: "))
    assert "shutting down" in last["error"]["message"], events[-3:]
    assert last["error"]["code"] == "shutting_down"  # not queue_full: nothing was full
    log = log_path.read_text()
    assert "Traceback" not in log and "Exception in ASGI" not in log, log
