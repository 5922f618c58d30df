"""Bad input, round three, against real `mlxspec serve` processes (issue 36 rows 9 and 16): a client can always ask
for plain decoding whatever the server was started with; a bad value gets a 400 naming the request's parameter; flags
that contradict each other stop the server at start in one line."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from helpers import HANG_LIMIT
from test_server import free_port, wait_healthy

import mlxspec

PROMPT = "def add(a, b):"


def start(tmp_path, *flags):
    port = free_port()
    log_path = tmp_path / f"server-{port}.log"
    with open(log_path, "w") as log:
        command = [sys.executable, "-m", "mlxspec", "serve", "--port", str(port), *flags]
        process = subprocess.Popen(command, stderr=log, stdout=subprocess.DEVNULL)
    url = type("Server", (str,), {"log": log_path})(f"http://127.0.0.1:{port}")
    wait_healthy(url, process)
    return process, url


def complete(url, **body) -> tuple[int, dict]:
    data = json.dumps({"prompt": PROMPT, "max_tokens": 12, "temperature": 0, **body}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=HANG_LIMIT) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


@pytest.fixture(scope="module")
def plain_text():
    spec = mlxspec.load()
    return spec.generate(PROMPT, max_tokens=12, temperature=0.0, use_draft=False, lookup=False).text


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags, request_changes",
    [
        (("--tree-topk", "2"), {"enabled": False}),
        (("--tree-topk", "2", "--tree-nodes", "6"), {"enabled": False}),
        (("--lookup", "--suffix"), {"lookup": False}),
        (("--lookup", "--lookup-candidates", "3"), {"lookup": False}),
        (("--lookup", "--suffix"), {"enabled": False, "lookup": False}),
    ],
    ids=["tree-off", "tree-nodes-off", "suffix-lookup-off", "candidates-lookup-off", "all-off"],
)
def test_a_client_can_ask_for_plain_decoding_whatever_the_server_drafts_with(
    tmp_path, plain_text, flags, request_changes
):
    process, url = start(tmp_path, *flags)
    try:
        status, body = complete(url, speculative=request_changes)
        assert status == 200, body
        assert body["choices"][0]["text"] == plain_text
        status, body = complete(url, speculative={"num_draft": "²"})  # row 9: a Unicode digit is no number
        assert status == 400 and body["error"]["param"] == "speculative.num_draft", body
        status, body = complete(url, speculative={"suffix": True, "lookup": False})
        assert status == 400 and body["error"]["param"] == "speculative.suffix", body
        assert "--" not in body["error"]["message"]  # it names the request's fields, not command-line flags
        assert complete(url)[0] == 200  # and it keeps serving
    finally:
        process.terminate()
        process.wait(timeout=HANG_LIMIT)
    assert "Traceback" not in url.log.read_text()


@pytest.mark.parametrize("flags", [("--tree-topk", "2", "--no-draft"), ("--tree-nodes", "8", "--no-draft")])
def test_a_tree_without_a_drafter_stops_serve_at_start_in_one_line(flags):
    port = str(free_port())
    run = subprocess.run(
        [sys.executable, "-m", "mlxspec", "serve", "--port", port, *flags],
        capture_output=True,
        text=True,
        timeout=HANG_LIMIT,
    )
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1 and "--no-draft" in lines[0], run.stderr
    assert "serving" not in run.stderr
