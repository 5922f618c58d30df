"""`bench --profile`: where a decoding step's time goes (drafting, the target forward, acceptance, bookkeeping)."""

from __future__ import annotations

from typing import Any

Speculator = Any  # a mlxspec.speculator.Speculator: bench sits below the API and imports none of it


def profile_split(
    speculator: Speculator, prompts: list[list[int]], max_tokens: int, num_draft: int, temperature: float
) -> dict[str, float]:
    """Seconds per step spent drafting, verifying, accepting and on bookkeeping (profiling adds syncs), with the
    speculator's drafter (its DFlash drafter, feature head or draft model; none: plain decoding), a fixed k. The
    key "tokens" holds the tokens emitted per step."""
    from mlxspec.decoding.assembly import build_engine
    from mlxspec.drafting.factory import make_drafter
    from mlxspec.kernels import verify as verify_kernel
    from mlxspec.options import DecodeOptions

    options = DecodeOptions(temperature=temperature, num_draft=num_draft, kernel=speculator.options.kernel)
    totals: dict[str, float] = {}
    steps = produced_all = 0
    backend, _ = verify_kernel.resolve(options.kernel)
    for prompt in prompts:
        target = verify_kernel.routed_view(speculator.target.model, backend)  # as generation runs it
        head = speculator.feature_head
        drafter = make_drafter(
            options,
            draft_model=None if speculator.draft is None else speculator.draft.model,
            target_model=target,
            feature_head=None if head is None else verify_kernel.routed_view(head, backend),
            dflash=speculator.dflash,
        )
        engine = build_engine(target, drafter, options)
        engine.prefill(prompt)
        engine.profile = totals
        produced = 0
        while produced < max_tokens:
            produced += len(engine.step(max_tokens - produced).tokens)
            steps += 1
        produced_all += produced
    return {**{phase: seconds / steps for phase, seconds in totals.items()}, "tokens": produced_all / steps}
