"""Same seed, same text: sampled output keyed by output position (decoding/keys.py).

With acceptance="coupled" a seed gives mlx-lm's own text for that seed, whatever drafted, at whatever draft length,
alone or in a batch; "residual" keeps Leviathan/Chen, exact in law (its law tests are in test_engine_exactness.py).
The default, "auto", is coupled where the caller gives a seed and residual where none is given.
"""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

import mlxspec
from mlxspec import UserError
from mlxspec.decoding.keys import PositionKeys

PROMPT = "def fibonacci(n):"
SETTINGS = [
    pytest.param(dict(temperature=0.7), id="T0.7"),
    pytest.param(dict(temperature=0.7, top_p=0.9), id="T0.7-top-p"),
    pytest.param(dict(temperature=1.0, min_p=0.05, top_k=40), id="T1-min-p-top-k"),
]


def mlx_lm_seeded(model, prompt: list[int], seed: int, count: int, settings: dict) -> list[int]:
    """What `mlx_lm.generate` writes with `mx.random.seed(seed)`."""
    sampler = make_sampler(
        settings["temperature"],
        top_p=settings.get("top_p", 0.0),
        min_p=settings.get("min_p", 0.0),
        top_k=settings.get("top_k", 0),
    )
    mx.random.seed(seed)
    return [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=count, sampler=sampler)]


@pytest.fixture(scope="module")
def spec():
    return mlxspec.load()


def test_position_keys_are_mlx_lms_global_key_sequence():
    """mlx-lm draws token t with the t-th key after mx.random.seed(s): one split per draw, its second half."""
    mx.random.seed(11)
    ours = PositionKeys(11)
    for position in range(40):
        want = mx.random.categorical(mx.zeros((1, 5000)))
        got = mx.random.categorical(mx.zeros((1, 5000)), key=ours.at(position))
        assert want.item() == got.item(), position
    assert mx.array_equal(ours.span(3, 4), mx.stack([ours.at(p) for p in range(3, 7)])).item()


@pytest.mark.parametrize("settings", SETTINGS)
def test_plain_decoding_with_a_seed_writes_mlx_lms_text(spec, settings):
    prompt = spec.tokenizer.encode(PROMPT)
    want = mlx_lm_seeded(spec.target.model, prompt, 5, 40, settings)
    got = spec.generate(prompt, max_tokens=40, seed=5, use_draft=False, stop_at_eos=False, **settings)
    assert got.tokens == want


@pytest.mark.parametrize(  # 20-27 s each on 2 cores: in the whole suite
    "settings", [pytest.param(*s.values, marks=pytest.mark.slow, id=s.id) for s in SETTINGS[:2]]
)
def test_every_draft_length_and_drafter_writes_the_same_text_for_a_seed(spec, settings):
    """The draft model at k = 1..4 and auto, a draft-model tree, lookup, and the EAGLE head, Medusa heads and DFlash
    drafter (chains and trees): every run equals mlx-lm's text for the seed, and the sampled drafts were really kept
    (not decoded plainly)."""
    prompt = spec.tokenizer.encode(PROMPT)
    want = mlx_lm_seeded(spec.target.model, prompt, 7, 40, settings)
    kept = 0
    runs = [dict(num_draft=k) for k in (1, 2, 3, 4, "auto")]
    runs += [dict(num_draft=3, tree_topk=2), dict(lookup=True, use_draft=False, num_draft=4)]
    for changes in runs:
        result = spec.generate(prompt, max_tokens=40, seed=7, stop_at_eos=False, **settings, **changes)
        assert result.tokens == want, changes
        kept += result.stats.accepted
    assert kept > 40  # sampled drafts were accepted, through the coupled draw
    from mlxspec.loading import MODELS_DIR

    for heads in (
        dict(eagle=MODELS_DIR / "eagle"),
        dict(medusa=MODELS_DIR / "medusa"),
        dict(dflash=MODELS_DIR / "dflash"),
    ):
        other = mlxspec.load(draft=None, **heads)
        for changes in (dict(num_draft=1), dict(num_draft=3), dict(num_draft=3, tree_topk=2, tree_nodes=6)):
            result = other.generate(prompt, max_tokens=40, seed=7, stop_at_eos=False, **changes, **settings)
            assert result.tokens == want, (heads, changes)


@pytest.mark.slow  # 10-15 s on 2 cores: in the whole suite, not the quick run
def test_a_seeded_row_writes_its_text_alone_in_a_batch_and_after_a_prompt_cache_hit(spec):
    """Eight seeded requests of different lengths through three batch rows (rows arriving and leaving between
    steps), and the same requests again on a Speculator whose prompt cache holds them: every text is the one the
    request gets alone."""
    prompts = [PROMPT, "import os\n\ndef walk(path):", "class Stack:", "def parse(argv):"] * 2
    options = [
        mlxspec.DecodeOptions(temperature=0.8, seed=seed, max_tokens=12 + 4 * seed, stop_at_eos=False)
        for seed in range(8)
    ]
    alone = [spec.generate(p, o).tokens for p, o in zip(prompts, options)]
    together = [r.tokens for r in spec.generate_batch(prompts, options, max_batch=3)]
    assert together == alone
    cached = mlxspec.load(prompt_cache=2)
    for prompt, option, want in zip(prompts[:2], options[:2], alone[:2]):
        assert cached.generate(prompt, option).tokens == want
        again = cached.generate(prompt, option)
        assert again.tokens == want and again.stats.reused_tokens > 0


def test_residual_acceptance_is_still_there_and_named(spec, cli_run):
    prompt = spec.tokenizer.encode(PROMPT)
    result = spec.generate(prompt, max_tokens=24, seed=5, temperature=0.7, acceptance="residual", num_draft=3)
    assert len(result.tokens) > 0 and result.stats.drafted > 0
    with pytest.raises(UserError, match=r"acceptance 'lossy' is not one of auto, coupled, residual"):
        spec.generate(prompt, max_tokens=4, acceptance="lossy")
    code, _, err = cli_run("generate", PROMPT, "--acceptance", "lossy", "--max-tokens", "4")
    assert code == 2 and "--acceptance" in err and "Traceback" not in err
    code, out, err = cli_run("generate", PROMPT, "--temp", "0.7", "--seed", "5", "--max-tokens", "12", "--json")
    coupled = json.loads(out)["tokens"]
    assert code == 0 and coupled == mlx_lm_seeded(spec.target.model, prompt, 5, 12, dict(temperature=0.7))


def test_auto_acceptance_is_coupled_with_a_seed_and_residual_without(spec, cli_run, monkeypatch):
    """The default rule: a given seed keeps coupled (its text is mlx-lm's for that seed, whatever drafts). No seed
    takes Leviathan/Chen, named in stats, -v and --json, and the seed it reports repeats its text under residual.
    The drawn seed is fixed here (os.urandom) so that coupled and residual texts for it are known to differ."""
    prompt = spec.tokenizer.encode(PROMPT)
    ask = dict(max_tokens=24, temperature=0.7, num_draft=3)
    seeded = spec.generate(prompt, seed=7, **ask)
    assert seeded.stats.acceptance == "coupled"
    assert seeded.tokens == mlx_lm_seeded(spec.target.model, prompt, 7, 24, dict(temperature=0.7))
    residual = spec.generate(prompt, seed=7, acceptance="residual", **ask)
    assert residual.stats.acceptance == "residual" and residual.tokens != seeded.tokens  # the rules differ at seed 7
    monkeypatch.setattr("mlxspec.speculator.os.urandom", lambda n: (7).to_bytes(n, "little"))
    unseeded = spec.generate(prompt, seed=None, **ask)
    assert unseeded.stats.seed == 7 and unseeded.stats.acceptance == "residual" and unseeded.stats.drafted > 0
    assert unseeded.tokens == residual.tokens  # residual ran, and its printed seed repeats it
    assert spec.generate(prompt, seed=None, acceptance="coupled", **ask).tokens == seeded.tokens  # named: kept
    assert spec.generate(prompt, seed=None, xtc_probability=0.5, **ask).stats.acceptance == "coupled"  # XTC
    assert spec.generate(prompt, seed=None, max_tokens=8, num_draft=3).stats.acceptance == ""  # greedy: no rule
    code, out, err = cli_run("generate", PROMPT, "--temp", "0.7", "--max-tokens", "8", "--json")
    assert code == 0 and json.loads(out)["stats"]["acceptance"] == "residual"
    code, out, err = cli_run("generate", PROMPT, "--temp", "0.7", "--seed", "3", "--max-tokens", "8", "-v")
    assert code == 0 and " acceptance=coupled " in err


PENALTIES = [
    pytest.param(dict(repetition_penalty=1.3), id="repetition"),
    pytest.param(dict(presence_penalty=0.8, frequency_penalty=0.4, frequency_context_size=50), id="presence-frequency"),
    pytest.param(dict(logit_bias={12: 3.0, 40: -2.0}, repetition_penalty=1.1), id="bias-repetition"),
]


@pytest.mark.parametrize("penalties", PENALTIES)
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_penalties_and_a_logit_bias_write_mlx_lms_text_under_every_drafter(spec, penalties, temperature):
    """History-dependent processors see the history plus the drafted tokens before each verified row (a tree
    node: its ancestors), so a chain, a tree and lookup write what mlx-lm's generate_step writes with the same
    processors and seed."""
    from mlx_lm.sample_utils import make_logits_processors

    prompt = spec.tokenizer.encode(PROMPT)
    sizes = {k: v for k, v in penalties.items() if k.endswith("_context_size")}
    processors = make_logits_processors(**{k: v for k, v in penalties.items() if k not in sizes}, **sizes)
    mx.random.seed(3)
    sampler = make_sampler(temperature)
    stream = generate_step(
        mx.array(prompt), spec.target.model, max_tokens=40, sampler=sampler, logits_processors=processors
    )
    want = [int(t) for t, _ in stream]
    mx.random.seed(3)
    bare = [int(t) for t, _ in generate_step(mx.array(prompt), spec.target.model, max_tokens=40, sampler=sampler)]
    assert want != bare  # the processors change the text: the test has power
    kept = 0
    for run in (
        dict(use_draft=False),
        dict(num_draft=3),
        dict(lookup=True, use_draft=False, num_draft=4),
        dict(num_draft=3, tree_topk=2),
    ):
        result = spec.generate(
            prompt, max_tokens=40, temperature=temperature, seed=3, stop_at_eos=False, **penalties, **run
        )
        assert result.tokens == want, run
        kept += result.stats.accepted
    assert kept > 10


def test_bad_penalty_settings_are_refused_by_name(spec, cli_run):
    for changes, message in (
        (dict(repetition_penalty=0.0), "repetition_penalty 0.0 must be > 0"),
        (dict(presence_penalty=float("nan")), "presence_penalty nan is not a finite number"),
        (dict(frequency_context_size=0), "frequency_context_size 0 must be a whole number"),
        (dict(logit_bias={10**7: 1.0}), "logit_bias names token 10000000"),
        (dict(logit_bias={1: "up"}), "logit_bias of token 1 is 'up'"),
    ):
        with pytest.raises(UserError, match=message):
            spec.generate(PROMPT, max_tokens=2, **changes)
    code, _, err = cli_run("generate", PROMPT, "--logit-bias", "12", "--max-tokens", "2")
    assert code == 2 and "--logit-bias '12' is not TOKEN_ID=BIAS" in err


def test_logprobs_equal_mlx_lms_under_every_drafter(spec):
    """Each token's log-probability and its top alternatives, as mlx-lm's generate_step reports them (after the
    processors, before temperature): plain decoding, a chain, a tree and lookup all report the same."""
    import numpy as np

    prompt = spec.tokenizer.encode(PROMPT)
    mx.random.seed(5)
    stream = generate_step(mx.array(prompt), spec.target.model, max_tokens=20, sampler=make_sampler(0.7))
    reference = [(int(token), np.array(logprobs)) for token, logprobs in stream]
    for run in (dict(use_draft=False), dict(num_draft=3), dict(num_draft=3, tree_topk=2), dict(lookup=True)):
        chunks = list(spec.stream(prompt, max_tokens=20, temperature=0.7, seed=5, stop_at_eos=False, logprobs=3, **run))
        got = [entry for chunk in chunks for entry in chunk.logprobs]
        assert [t for c in chunks for t in c.tokens] == [t for t, _ in reference], run
        for (value, top), (token, logprobs) in zip(got, reference, strict=True):
            assert value == pytest.approx(float(logprobs[token]), abs=1e-5)
            assert [i for i, _ in top] == np.argsort(-logprobs, kind="stable")[:3].tolist()
    with pytest.raises(UserError, match="logprobs 21 must be None or a whole number in 0..20"):
        spec.generate(prompt, max_tokens=2, logprobs=21)


@pytest.mark.parametrize(
    "xtc", [dict(xtc_probability=0.5, xtc_threshold=0.1), dict(xtc_probability=1.0, xtc_threshold=0.05, top_p=0.9)]
)
def test_xtc_writes_mlx_lms_text_under_every_drafter(spec, xtc):
    """mlx-lm draws each token's XTC coin from the global sequence before the token: two keys a position. The
    coin's key and the token's are both position-keyed, so plain decoding, a chain, a tree and lookup write
    mlx-lm's text (and XTC changes it: the test has power)."""
    tokenizer = spec.tokenizer
    prompt = tokenizer.encode(PROMPT)
    special = list(tokenizer.encode("\n")) + list(tokenizer.eos_token_ids)
    top_p = xtc.get("top_p", 0.0)
    texts = []
    for probability in (xtc["xtc_probability"], 0.0):
        sampler = make_sampler(
            0.8,
            top_p=top_p,
            xtc_probability=probability,
            xtc_threshold=xtc["xtc_threshold"],
            xtc_special_tokens=special,
        )
        mx.random.seed(4)
        texts.append(
            [int(t) for t, _ in generate_step(mx.array(prompt), spec.target.model, max_tokens=30, sampler=sampler)]
        )
    want, bare = texts
    assert want != bare
    for run in (
        dict(use_draft=False),
        dict(num_draft=3),
        dict(num_draft=3, tree_topk=2),
        dict(lookup=True, use_draft=False),
    ):
        result = spec.generate(
            prompt, max_tokens=30, temperature=0.8, seed=4, stop_at_eos=False, **{"top_p": top_p or 1.0, **xtc}, **run
        )
        assert result.tokens == want, run
    with pytest.raises(UserError, match="acceptance 'residual' does not take XTC"):
        spec.generate(prompt, max_tokens=2, temperature=0.8, xtc_probability=0.5, acceptance="residual")
    with pytest.raises(UserError, match="xtc_threshold 0.7 is outside"):
        spec.generate(prompt, max_tokens=2, temperature=0.8, xtc_threshold=0.7)
