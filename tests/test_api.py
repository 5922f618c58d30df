"""The Python API's edge cases: EOS inside a draft, max_tokens mid-step, stop strings, context limits."""

import pytest
from helpers import mlx_lm_greedy

import mlxspec
from mlxspec import UserError

EOS = 7


@pytest.fixture(scope="module")
def spec(tiny_dirs):
    return mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["target"], num_draft=4)  # self-draft: all accepted


def test_eos_inside_an_accepted_draft_ends_generation_before_it(spec):
    # Find a prompt whose greedy continuation hits EOS a few tokens in, so it lands inside a 5-token step.
    for prompt in ("a", "b", "c", "d", "e", "f", "g", "ab", "ba", "gf", "fed", "cab"):
        reference = mlx_lm_greedy(spec.target.model, spec.encode(prompt), 30)
        if EOS in reference and reference.index(EOS) % 5 != 0:  # not at a step's start: inside its drafts
            break
    else:
        pytest.fail("no test prompt reaches EOS")
    result = spec.generate(prompt, max_tokens=30)
    cut = reference.index(EOS)
    assert result.tokens == reference[:cut]
    assert result.text == spec.tokenizer.decode(reference[:cut])
    assert result.finish_reason == "stop"
    # The scenario really happened: self-drafting accepts every draft, so each step emits 5 tokens, and the EOS
    # (token `cut`) sat inside a step, after at least one accepted token of that step.
    assert result.stats.target_calls == cut // 5 + 1
    assert result.stats.accepted == result.stats.drafted == 4 * result.stats.target_calls


@pytest.mark.parametrize("max_tokens", [1, 3, 5, 6])
def test_max_tokens_is_exact_even_mid_step(spec, max_tokens):
    """Self-drafting at temperature 1 accepts every draft; a step's drafts are cut to the tokens still wanted."""
    result = spec.generate("ab", max_tokens=max_tokens, temperature=1.0, seed=1, stop_at_eos=False)
    assert len(result.tokens) == max_tokens and result.finish_reason == "length"
    assert result.stats.target_calls == -(-max_tokens // 5)  # ceil: 5 tokens a full step
    assert result.stats.drafted == max_tokens - result.stats.target_calls == result.stats.accepted


def test_stop_string_truncates_text(spec):
    prompt, full = next(
        (p, r)
        for p in ("ab", "ba", "cab", "gf", "fed", "abc", "dd")
        if len((r := spec.generate(p, max_tokens=20)).text) >= 6
    )
    stop = full.text[3:5]
    result = spec.generate(prompt, max_tokens=20, stop=[stop])
    assert result.text == full.text[: full.text.index(stop)]
    assert result.finish_reason == "stop"


def test_stream_pieces_add_up_to_generate(spec):
    pieces = [c.text for c in spec.stream("cab", max_tokens=25, temperature=0.8, seed=3)]
    assert "".join(pieces) == spec.generate("cab", max_tokens=25, temperature=0.8, seed=3).text


def test_prompt_as_long_as_the_context_generates_within_it(spec):
    context = spec.target.context_length
    prompt = ("abcdefg" * 10)[:context]
    result = spec.generate(prompt, max_tokens=10, stop_at_eos=False)
    # Every prompt token has a position, so exactly one more token fits (it is never fed back).
    assert len(result.tokens) == 1 and result.finish_reason == "length"
    near_full = spec.generate(prompt[:-3], max_tokens=10, stop_at_eos=False)
    assert len(near_full.tokens) == 4 and near_full.finish_reason == "length"
    reference = mlx_lm_greedy(spec.target.model, spec.encode(prompt[:-3]), 4)
    assert near_full.tokens == reference


def test_bad_inputs_raise_user_errors(spec):
    context = spec.target.context_length
    cases = [
        dict(prompt=""),
        dict(prompt="a" * (context + 1)),
        dict(prompt="ab", num_draft=0),
        dict(prompt="ab", num_draft=65),
        dict(prompt="ab", temperature=-0.1),
        dict(prompt="ab", top_p=0.0),
        dict(prompt="ab", top_p=1.01),
        dict(prompt="ab", chat=True),  # the char tokenizer has no chat template
    ]
    for kwargs in cases:
        with pytest.raises(UserError):
            spec.generate(**kwargs)


def test_a_mismatched_tokenizer_drafts_across_vocabularies_naming_the_first_difference(tiny_dirs):
    spec = mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["mismatched"])
    assert spec.vocab_bridge is not None
    assert "token 6 is 'g' in the target's tokenizer but 'h' in the draft's" in spec.cross_tokenizer
    assert mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["draft"]).vocab_bridge is None


def test_a_recurrent_draft_with_another_tokenizer_is_refused(tiny_dirs):
    with pytest.raises(UserError, match="must be a transformer without recurrent layers"):
        spec = mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["mismatched_recurrent"])
        spec.generate("abc", max_tokens=4, num_draft=2)


def test_stats_are_consistent(tiny_dirs):
    spec = mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["draft"], num_draft=3)
    result = next(
        r
        for seed in range(20)
        if len((r := spec.generate("abc", max_tokens=30, temperature=1.0, seed=seed)).tokens) >= 10
    )
    stats = result.stats
    assert stats.generated_tokens == len(result.tokens)
    assert stats.accepted <= stats.drafted <= 3 * stats.target_calls
    assert stats.draft_calls == stats.drafted
    assert 0 <= stats.acceptance_rate <= 1 and stats.tokens_per_target_call >= 1
    assert stats.peak_memory_bytes > 0 and stats.tokens_per_second > 0


def test_no_draft_is_plain_decoding(tiny_dirs):
    spec = mlxspec.load(tiny_dirs["target"], draft=None)
    result = spec.generate("abc", max_tokens=15)
    assert result.stats.drafted == 0 and result.stats.target_calls == len(result.tokens) + (
        result.finish_reason == "stop"
    )


def test_text_stream_holds_back_a_possible_stop_string_across_steps(tiny_dirs):
    from mlxspec.loading import load_model
    from mlxspec.text import TextStream

    tokenizer = load_model(tiny_dirs["target"]).tokenizer  # one character per token: a=0, b=1, c=2, d=3, e=4
    stream = TextStream(tokenizer, stops=["cd"])
    assert stream.add([0, 1, 2], final=False) == ("ab", False)  # "c" might start "cd": held back
    assert stream.add([3, 4], final=False) == ("", True)  # "cd" arrived: nothing after "ab" is shown
    stream = TextStream(tokenizer, stops=["cd"])
    assert stream.add([0, 2], final=False) == ("a", False)
    assert stream.add([4], final=True) == ("ce", False)  # "c" was not a stop after all, and the end is final


def test_a_tree_that_no_longer_fits_the_context_is_dropped_cleanly(tiny_dirs):
    """Near the end of the context a 9-node tree cannot be verified; the step decodes plainly and stays exact."""
    spec = mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["draft"], num_draft=3)
    context = spec.target.context_length
    prompt = ("abcdefg" * 10)[: context - 6]
    tree = spec.generate(prompt, max_tokens=10, tree_topk=3, stop_at_eos=False)
    plain = spec.generate(prompt, max_tokens=10, use_draft=False, stop_at_eos=False)
    assert tree.tokens == plain.tokens and tree.finish_reason == "length"


@pytest.mark.slow  # 10-15 s on 2 cores: in the whole suite, not the quick run
def test_every_mode_fills_the_context_to_the_same_last_token(tiny_dirs):
    """At the end of the context plain decoding (which queues its next forward) and drafting stop at the same
    place: the last token fits when every token before it has a position (context - prompt + 1 tokens)."""
    spec = mlxspec.load(tiny_dirs["target"], draft=tiny_dirs["draft"], num_draft=3)
    context = spec.target.context_length
    prompt = spec.encode(("abcdefg" * 10)[: context - 9])
    plain = spec.generate(prompt, max_tokens=50, use_draft=False, stop_at_eos=False)
    drafted = spec.generate(prompt, max_tokens=50, stop_at_eos=False)
    looked_up = spec.generate(prompt, max_tokens=50, use_draft=False, lookup=True, stop_at_eos=False)
    assert len(plain.tokens) == context - len(prompt) + 1 and plain.finish_reason == "length"
    assert drafted.tokens == plain.tokens == looked_up.tokens
    assert plain.tokens == mlx_lm_greedy(spec.target.model, prompt, len(plain.tokens))


def test_load_keeps_the_options_it_is_given():
    """load(options=...) once reset num_draft, kv_bits and draft_window to its own keyword defaults."""
    from mlxspec import DecodeOptions

    given = DecodeOptions(num_draft=3, kv_bits=8, draft_window=16, temperature=0.5)
    spec = mlxspec.load(options=given)
    assert (spec.options.num_draft, spec.options.kv_bits, spec.options.draft_window) == (3, 8, 16)
    assert spec.options.temperature == 0.5
    # A keyword given beside the options replaces theirs; none given keeps the default "auto".
    assert mlxspec.load(options=given, num_draft=2, kv_bits=4).options.num_draft == 2
    assert mlxspec.load(options=given, num_draft=2, kv_bits=4).options.kv_bits == 4
    assert mlxspec.load().options.num_draft == "auto"
    result = spec.generate("import os", max_tokens=8, kv_bits=None)  # (a windowed draft cache is not quantized)
    assert result.stats.num_draft == 3 and result.stats.drafted > 0


@pytest.mark.slow  # 15-60 s on 2 cores: in the whole suite, not the quick run
def test_interleaved_streams_leave_the_model_as_it_was():
    """Kernel routing is a view built once per model: streams that close out of order neither restore plain layers
    under a running stream nor leave routed layers in the model."""
    from mlxspec.kernels import verify as verify_kernel

    spec = mlxspec.load()
    if verify_kernel.resolve("auto")[0] is None:
        pytest.skip("the verify kernel was not built on this machine (no C++ compiler at install)")
    model = spec.target.model
    layers_before = [(name, type(m), id(m)) for name, m in model.named_modules()]
    prompt_a, prompt_b = "import os", "def fibonacci(n):"
    options = dict(max_tokens=20, stop_at_eos=False)
    expected_b = mlxspec.load().generate(prompt_b, **options).tokens  # the same stream, run alone
    first = spec.stream(prompt_a, **options)
    next(first)
    second = spec.stream(prompt_b, **options)
    tokens_b = next(second).tokens
    first.close()  # the first-opened stream ends before the second
    tokens_b += [t for chunk in second for t in chunk.tokens]
    assert spec.last_stats.kernel.startswith("cpu (") and "0 layers" not in spec.last_stats.kernel
    assert tokens_b == expected_b  # still routed, and exact, after the first stream closed
    assert [(name, type(m), id(m)) for name, m in model.named_modules()] == layers_before
    assert not any(isinstance(m, verify_kernel.VerifyLinear) for _, m in model.named_modules())
