"""`generate --memory-budget`: plan before loading anything, then refuse, or with --auto adapt the settings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from mlxspec.errors import UserError
from mlxspec.plan.devices import Device, parse_size, this_backend
from mlxspec.plan.metadata import load_metadata
from mlxspec.plan.planner import PlanRequest, make_plan, total_bytes
from mlxspec.platform import GiB

# Changes --auto may make by itself: each maps a planner suggestion to generate's settings.
AUTO_FIXES = {
    "--kv-bits 8": {"kv_bits": 8},
    "--kv-bits 4": {"kv_bits": 4},
    "--draft-window 1024": {"draft_window": 1024},
    "--quantize-target 4": {"quantize_target": 4},
    "--draft-bits 4": {"draft_bits": 4},
}


def plan_command(model: str, draft: str | None, budget: str, request: PlanRequest) -> str:
    """The `mlxspec plan` command that reproduces this plan's numbers: the same models, context and settings."""
    words = ["mlxspec plan --model", model]
    words += ["--draft", draft] if draft else []
    words += ["--memory", budget, "--context", str(request.context), "-k", str(request.num_draft)]
    for flag, value in (
        ("--quantize-target", request.target_bits),
        ("--draft-bits", request.draft_bits),
        ("--kv-bits", request.kv_bits),
        ("--draft-window", request.draft_window),
    ):
        words += [flag, str(value)] if value else []
    return " ".join(words)


def fit_to_budget(
    model: str,
    draft: str | None,
    budget: str,
    prompt_chars: int,
    max_tokens: int,
    num_draft: int,
    settings: dict,
    auto: bool,
    report: Callable[[str], None],
) -> dict:
    """The generate settings to use under `budget`; sets MLX's memory limit to match.

    Plans before any tokenizer loads, so the prompt's length in characters bounds its length in tokens.
    """
    import mlx.core as mx

    size = parse_size(budget)
    device = Device(f"{budget} budget", size, size, "--memory-budget", backend=this_backend())
    target = load_metadata(model)
    context = prompt_chars + max_tokens
    if target.config.get("max_position_embeddings"):
        context = min(context, target.config["max_position_embeddings"])
    request = PlanRequest(
        target=target,
        device=device,
        draft=load_metadata(draft) if draft else None,
        context=context,
        target_bits=settings.get("quantize_target"),
        kv_bits=settings.get("kv_bits"),
        num_draft=num_draft,
        draft_window=settings.get("draft_window"),
        draft_bits=settings.get("draft_bits"),
    )
    plan = make_plan(request)
    if not plan.fits:
        fix = next((r for r in plan.recommendations if r["fits"] and r["how"] in AUTO_FIXES), None)
        if not auto or fix is None:
            if fix is not None:
                advice = f"rerun with --auto to apply `{fix['how']}` ({fix['change']})"
            else:
                fitting = next((r for r in plan.recommendations if r["fits"]), None)
                advice = f"try `{fitting['how']}`" if fitting else "no change mlxspec knows of fits it"
            raise UserError(
                f"these settings need {plan.total_bytes / GiB:.2f} GiB but the budget is {size / GiB:.2f} GiB; "
                f"{advice}; `{plan_command(model, draft, budget, request)}` shows the details"
            )
        settings = {**settings, **AUTO_FIXES[fix["how"]]}
        report(f"mlxspec: --auto: {fix['change']} ({fix['how']}), to fit {budget}")
        request = replace(
            request,
            kv_bits=settings.get("kv_bits"),
            draft_window=settings.get("draft_window"),
            target_bits=settings.get("quantize_target"),
            draft_bits=settings.get("draft_bits"),
        )
        assert total_bytes(request) <= size
    mx.set_memory_limit(size)
    return settings
