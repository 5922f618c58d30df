"""`mlxspec chat` as a user runs it: a process reading lines from stdin, with the embedded target and draft."""

import json
import signal
import subprocess
import sys
import threading
import time

import pytest
from helpers import HANG_LIMIT

PROMPT = "def add(a, b):"
CHAT = [sys.executable, "-m", "mlxspec", "chat", "--temp", "0"]


def test_a_scripted_session_answers_exactly_reuses_the_conversation_and_obeys_commands():
    script = f"{PROMPT}\n/stats\n    return a + b\n/stats\n/reset\n/nonsense\n/stats\n/exit\n"
    run = subprocess.run(
        [*CHAT, "--max-tokens", "16"], input=script, capture_output=True, text=True, timeout=HANG_LIMIT
    )
    assert run.returncode == 0, run.stderr
    reference = subprocess.run(
        [sys.executable, "-m", "mlxspec", "generate", "--chat", PROMPT, "--max-tokens", "16", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    out = run.stdout
    first_answer = out.split(">>> ", 2)[1]  # after the first prompt mark, up to the next
    assert first_answer.startswith(json.loads(reference.stdout)["text"])
    stats = [line for line in out.splitlines() if "alpha=" in line]
    assert len(stats) == 3  # /stats after each answer, and again after /reset (the last answer's)
    assert "(cold)" in stats[0] and "tokens=16" in stats[0]
    # The second turn resent the first question and answer: all but the pending token was reused.
    reused = int(stats[1].split("reused=")[1].split()[0])
    prompt = int(stats[1].split("prompt=")[1].split()[0])
    assert "(prefix)" in stats[1] and 16 < reused < prompt
    assert "(a new conversation)" in out and "(unknown command /nonsense;" in out


def test_ctrl_c_stops_the_answer_not_the_session():
    process = subprocess.Popen(
        [*CHAT, "--max-tokens", "480"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(iter(lambda: process.stdout.read(1), "")))
    reader.start()
    process.stdin.write(f"{PROMPT}\n")
    process.stdin.flush()
    deadline = time.monotonic() + 120
    while "".join(output).count(">>> ") < 1 or len("".join(output).split(">>> ", 1)[1]) < 20:
        assert time.monotonic() < deadline and process.poll() is None, "".join(output)
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    process.stdin.write("/stats\n/exit\n")
    process.stdin.flush()
    assert process.wait(timeout=HANG_LIMIT) == 0, process.stderr.read()
    reader.join(timeout=10)
    out = "".join(output)
    assert " [stopped]" in out
    stats = next(line for line in out.splitlines() if "alpha=" in line)
    assert int(stats.split("tokens=")[1].split()[0]) < 480


def test_a_model_without_a_chat_template_is_refused_in_one_line(tiny_dirs):
    run = subprocess.run(
        [*CHAT, "--model", str(tiny_dirs["target"])], input="hi\n", capture_output=True, text=True, timeout=HANG_LIMIT
    )
    assert run.returncode == 2
    assert run.stderr.strip() == (
        f"mlxspec: error: '{tiny_dirs['target']}' has no chat template, so it cannot chat; continue text with "
        "`mlxspec generate` instead"
    )


def test_errors_and_notes_go_to_stderr_and_the_answers_to_stdout():
    """A too-long message is refused on stderr (stdout holds only the chat itself), and the chat goes on; invalid
    UTF-8 is replaced with U+FFFD, as generate does, not refused by the tokenizer."""
    script = ("x = 1; " * 400).encode() + b"\n" + b"def f(\xff):\n/exit\n"
    run = subprocess.run([*CHAT, "--max-tokens", "8"], input=script, capture_output=True, timeout=HANG_LIMIT)
    out, err = run.stdout.decode(), run.stderr.decode()
    assert run.returncode == 0, err
    assert "mlxspec: error: this message is" in err and "mlxspec: error" not in out
    assert "Traceback" not in err and "tokeniz" not in err.lower()
    assert out.count(">>> ") == 3  # the refused message, the one with a bad byte (answered), /exit


def test_a_system_message_too_long_for_the_context_is_named_once_up_front():
    run = subprocess.run(
        [*CHAT, "--system", "x = 1\n" * 300], input="hi\n", capture_output=True, text=True, timeout=HANG_LIMIT
    )
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert run.stderr.startswith("mlxspec: error: --system is") and "shorten it" in run.stderr


@pytest.mark.slow  # 15-60 s on 2 cores: in the whole suite, not the quick run
def test_dropping_the_oldest_turn_is_said_on_stderr():
    script = "def a():\ndef b():\ndef c():\n/exit\n"
    run = subprocess.run(
        [*CHAT, "--max-tokens", "200"], input=script, capture_output=True, text=True, timeout=HANG_LIMIT
    )
    assert run.returncode == 0, run.stderr
    assert "mlxspec: the oldest turn was dropped to leave room for an answer in the 512-token context" in run.stderr
    assert "dropped" not in run.stdout


def test_the_next_turn_goes_on_from_the_tokens_generated_not_a_re_encoding():
    """A sampled answer may be split into tokens that encoding its text would not give; the next turn's prompt keeps
    the generated tokens, so the prompt cache reuses the whole answer (it reused 17 of 58 tokens before)."""
    import types

    import mlxspec
    from mlxspec.results import Chunk
    from mlxspec.serve.chat import ChatSession

    spec = mlxspec.load(draft=None)
    tokenizer = spec.tokenizer
    answer = "    return a + b"
    split = [i for character in answer for i in tokenizer.encode(character, add_special_tokens=False)]
    assert split != tokenizer.encode(answer, add_special_tokens=False) and tokenizer.decode(split) == answer
    fed: list[list[int]] = []

    def stream(tokens):
        fed.append(list(tokens))
        yield Chunk(text=answer, tokens=split, finish_reason="stop")

    stub = types.SimpleNamespace(
        tokenizer=tokenizer, target=spec.target, options=spec.options, prompt_cache=None, stream=stream, last_stats=None
    )
    session = ChatSession(stub)
    session.answer(PROMPT, write=lambda text: None, stop=threading.Event(), note=print)
    session.answer("and subtract?", write=lambda text: None, stop=threading.Event(), note=print)
    assert fed[1][: len(fed[0]) + len(split)] == fed[0] + split
    # The rest is the template's own text: decoding the whole gives what the template renders
    assert tokenizer.decode(fed[1]) == tokenizer.decode(
        tokenizer.apply_chat_template(session.messages[:-1], add_generation_prompt=True)
    )
    session.reset()
    session.answer(PROMPT, write=lambda text: None, stop=threading.Event(), note=print)
    assert fed[2] == fed[0]
