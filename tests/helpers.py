"""Running the engine and plain mlx-lm decoding side by side."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from mlxspec.decoding.assembly import build_engine
from mlxspec.decoding.sampling import SamplingConfig
from mlxspec.drafting.factory import make_drafter
from mlxspec.kernels import verify as verify_kernel
from mlxspec.options import DecodeOptions

# Seconds. Wall-clock limits in tests guard against hangs only, never against slowness: a loaded 2-core machine
# runs a subprocess many times slower than an idle one, and no test may fail because the machine is busy.
HANG_LIMIT = 1800


def speculative_tokens(
    target,
    draft,
    prompt,
    max_tokens,
    num_draft=4,
    sampling=SamplingConfig(),
    seed=0,
    kv_bits=None,
    engine_out=None,
    tree_topk=1,
    drafter=None,
    kernel="auto",
    totals=None,
    acceptance="coupled",
):
    """Generate with the engine. `draft` is a draft model (or None); `drafter` overrides it with any Drafter.

    The target runs through the verify kernel where it is built (kernel='auto'), as mlxspec's API runs it.
    `totals`, a dict, gets the drafted and accepted counts added to its "drafted" and "accepted"."""
    if drafter is None and draft is not None:
        options = DecodeOptions(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            min_p=sampling.min_p,
            num_draft=num_draft,
            kv_bits=kv_bits,
            tree_topk=tree_topk,
        )
        drafter = make_drafter(options, draft_model=draft)
    options = DecodeOptions.sampling_as(
        sampling, num_draft=num_draft, seed=seed, kv_bits=kv_bits, tree_topk=tree_topk, acceptance=acceptance
    )
    backend, _ = verify_kernel.resolve(kernel)
    engine = build_engine(verify_kernel.routed_view(target, backend), drafter, options)
    out: list[int] = []
    engine.prefill(list(prompt))
    while len(out) < max_tokens:
        step = engine.step(max_tokens - len(out))
        out += step.tokens
        if totals is not None:
            totals["drafted"] = totals.get("drafted", 0) + step.drafted
            totals["accepted"] = totals.get("accepted", 0) + step.accepted
    if engine_out is not None:
        engine_out.append(engine)
    return out


def mlx_lm_greedy(model, prompt, max_tokens):
    """mlx-lm's own greedy decoding with the target alone (the reference)."""
    tokens = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens):
        tokens.append(int(token))
    return tokens


def greedy_logit_gap(model, tokens, position):
    """Top-1 minus top-2 logit when predicting tokens[position] from tokens[:position], decoding one at a time."""
    cache = make_prompt_cache(model)
    logits = model(mx.array(tokens[:position])[None], cache=cache)[0, -1]
    top2 = mx.sort(logits)[-2:]
    return float(top2[1] - top2[0])


def assert_greedy_equal(model, prompt, got, expected):
    """Exact equality; a divergence is only tolerated where the reference itself was a near-tie (< 1e-4 logits)."""
    if got == expected:
        return
    first = (
        next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
        if any(a != b for a, b in zip(got, expected))
        else min(len(got), len(expected))
    )
    gap = greedy_logit_gap(model, list(prompt) + expected, len(prompt) + first)
    assert gap < 1e-4, f"greedy output diverged at token {first} where the logit gap is {gap:.3g} (not a near-tie)"


def assert_one_line(result, *fragments):
    code, _, err = result
    lines = err.strip().splitlines()
    assert code == 2, err
    assert "Traceback" not in err and len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def stored_curve(draft_one: float, verify_slope: float = 0.5):
    """A cost curve as if this device had measured it (one target token 10 ms, each more `verify_slope` of one;
    a draft forward `draft_one` s): whether drafting pays on the machine running the tests is a timing, which
    belongs in benchmarks, so a test of what drafts is given its device's costs."""
    from mlxspec.decoding.costs import CostCurve

    sizes = (1, 2, 4, 8, 16, 32, 64)
    return CostCurve({n: 0.01 * (1 + verify_slope * (n - 1)) for n in sizes}, draft_one, 256, "openblas")
