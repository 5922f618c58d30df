"""The OpenAI wire format without HTTP (mlxspec/openai_api.py): what a body becomes, and what is refused by name."""

import pytest

from mlxspec.results import Stats
from mlxspec.serve.openai_api import Reply, chunk, role_chunk, usage
from mlxspec.serve.openai_request import RequestError, param_named, parse_request

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]


def test_a_chat_body_becomes_messages_and_decode_option_changes():
    request = parse_request(
        {
            "model": "default",
            "messages": MESSAGES,
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 40,
            "min_p": 0.05,
            "max_tokens": 99,
            "max_completion_tokens": 50,
            "stop": "\n\n",
            "seed": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
            "speculative": {"enabled": True, "num_draft": 4, "lookup": True},
            "user": "ignored",
            "n": 1,
            "presence_penalty": 0,
        },
        "chat",
    )
    assert request.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert request.changes == {
        "temperature": 0.7,
        "top_p": 0.9,
        "min_p": 0.05,
        "top_k": 40,
        "seed": 3,
        "max_tokens": 50,  # max_completion_tokens, the newer name, wins
        "stop": ["\n\n"],
        "use_draft": True,
        "num_draft": 4,
        "lookup": True,
    }
    assert request.stream and request.include_usage


def test_a_completions_prompt_may_be_text_token_ids_or_a_batch_of_one():
    assert parse_request({"prompt": "abc"}, "text").prompt == "abc"
    assert parse_request({"prompt": [1, 2, 3]}, "text").prompt == [1, 2, 3]
    assert parse_request({"prompt": [[1, 2]]}, "text").prompt == [1, 2]
    assert parse_request({"prompt": ["abc"]}, "text").prompt == "abc"


@pytest.mark.parametrize(
    "body,kind,param",
    [
        ([], "chat", None),
        ({"messages": []}, "chat", "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "chat", "messages[0].role"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "chat", "messages[0].role"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "chat", "messages[0].content"),
        ({"messages": MESSAGES, "temperature": "0.5"}, "chat", "temperature"),
        ({"messages": MESSAGES, "temperature": True}, "chat", "temperature"),
        ({"messages": MESSAGES, "max_tokens": 0}, "chat", "max_tokens"),
        ({"messages": MESSAGES, "max_tokens": 2.5}, "chat", "max_tokens"),
        ({"messages": MESSAGES, "stop": ["a", 1]}, "chat", "stop"),
        ({"messages": MESSAGES, "n": 17}, "chat", "n"),
        ({"messages": MESSAGES, "n": "2"}, "chat", "n"),
        ({"messages": MESSAGES, "logprobs": "yes"}, "chat", "logprobs"),
        ({"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, "chat", "top_logprobs"),
        ({"messages": MESSAGES, "top_logprobs": 2}, "chat", "top_logprobs"),
        ({"messages": MESSAGES, "tool_choice": "auto"}, "chat", "tool_choice"),
        ({"messages": MESSAGES, "response_format": {"type": "json_object"}}, "chat", "response_format"),
        ({"messages": MESSAGES, "frequency_penalty": 2.5}, "chat", "frequency_penalty"),
        ({"messages": MESSAGES, "presence_penalty": "1"}, "chat", "presence_penalty"),
        ({"messages": MESSAGES, "logit_bias": {"a": 5}}, "chat", "logit_bias"),
        ({"messages": MESSAGES, "logit_bias": {"1": 500}}, "chat", "logit_bias"),
        ({"messages": MESSAGES, "logit_bias": [1, 5]}, "chat", "logit_bias"),
        ({"messages": MESSAGES, "stream": "yes"}, "chat", "stream"),
        ({"messages": MESSAGES, "speculative": {"enabled": "no"}}, "chat", "speculative.enabled"),
        ({"messages": MESSAGES, "acceptance": "lossy"}, "chat", "acceptance"),
        ({"messages": MESSAGES, "acceptance": ["residual"]}, "chat", "acceptance"),
        ({"prompt": ["a", "b"]}, "text", "prompt"),
        ({"prompt": 5}, "text", "prompt"),
        ({"prompt": "a", "echo": True}, "text", "echo"),
        ({"prompt": "a", "best_of": 2}, "text", "best_of"),
        ({"prompt": "a", "logprobs": 6}, "text", "logprobs"),
        ({"prompt": "a", "logprobs": True}, "text", "logprobs"),
    ],
)
def test_refusals_name_the_parameter(body, kind, param):
    with pytest.raises(RequestError) as refused:
        parse_request(body, kind)
    assert refused.value.status == 400 and refused.value.param == param
    assert refused.value.body()["error"]["type"] == "invalid_request_error"


def test_usage_reports_the_reused_prefix_and_the_speculative_stats():
    stats = Stats(prompt_tokens=30, generated_tokens=12, target_calls=4, drafted=12, accepted=8, reused_tokens=20)
    stats.prompt_cache, stats.mode = "prefix", "draft"
    out = usage(stats)
    assert (out["prompt_tokens"], out["completion_tokens"], out["total_tokens"]) == (30, 12, 42)
    assert out["prompt_tokens_details"] == {"cached_tokens": 20}
    assert out["speculative"]["acceptance_rate"] == pytest.approx(8 / 12, abs=1e-4)
    assert out["speculative"]["tokens_per_target_call"] == 3.0


def test_a_chat_stream_opens_with_the_role_alone_and_ends_with_the_finish_reason():
    reply = Reply("chat", "i", 7, "m", include_usage=True)
    opening = role_chunk(reply)
    assert opening["choices"][0]["delta"] == {"role": "assistant", "content": ""} and opening["usage"] is None
    text = chunk(reply, "he", None)["choices"][0]
    assert text == {"index": 0, "delta": {"content": "he"}, "logprobs": None, "finish_reason": None}
    last = chunk(reply, None, "stop")
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "stop"
    assert last["created"] == 7 and last["system_fingerprint"].startswith("fp_mlxspec_")
    assert "usage" not in chunk(Reply("chat", "i", 7, "m"), "he", None)  # no usage chunk to come: no null either


def test_option_refusals_name_the_request_parameter():
    assert param_named("seed 18446744073709551616 must be a whole number in 0..2**64-1", "messages") == "seed"
    assert param_named("num_draft 0 is outside 1..64; 4 is a good start", "prompt") == "speculative.num_draft"
    assert param_named("top_p 1.5 is outside (0, 1]; use 1.0 to disable it", "prompt") == "top_p"
    assert param_named("the prompt is empty; pass some text to continue", "prompt") == "prompt"
    assert param_named("'m' has no chat template; complete plain text instead", "messages") == "messages"
    assert param_named("something else", "prompt") is None


def test_a_request_may_choose_the_acceptance_rule():
    assert parse_request({"prompt": "a", "acceptance": "residual"}, "text").changes["acceptance"] == "residual"
    assert "acceptance" not in parse_request({"prompt": "a"}, "text").changes  # the server's default: coupled


def test_penalties_and_a_logit_bias_become_decode_options():
    """Refused by name before; now applied as mlx-lm applies them (exact under speculation: test_same_seed.py)."""
    body = {"prompt": "a", "presence_penalty": 0.5, "frequency_penalty": -0.2, "logit_bias": {"12": -100, "7": 3}}
    body.update(repetition_penalty=1.2, repetition_context_size=64)
    changes = parse_request(body, "text").changes
    assert changes["presence_penalty"] == 0.5 and changes["frequency_penalty"] == -0.2
    assert changes["logit_bias"] == {12: -100.0, 7: 3.0}
    assert changes["repetition_penalty"] == 1.2 and changes["repetition_context_size"] == 64


def test_logprobs_requests_become_the_number_of_alternatives():
    assert parse_request({"messages": MESSAGES, "logprobs": True, "top_logprobs": 3}, "chat").changes["logprobs"] == 3
    assert parse_request({"messages": MESSAGES, "logprobs": True}, "chat").changes["logprobs"] == 0
    assert "logprobs" not in parse_request({"messages": MESSAGES, "logprobs": False}, "chat").changes
    assert parse_request({"prompt": "a", "logprobs": 2}, "text").changes["logprobs"] == 2
