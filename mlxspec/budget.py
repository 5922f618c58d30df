"""`generate --memory-budget`: plan before loading anything, then refuse, or with --auto adapt the settings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from .devices import Device, live_device, parse_size
from .errors import UserError
from .metadata import load_metadata
from .planner import PlanRequest, format_plan, make_plan, total_bytes

# Changes --auto may make by itself: each maps a planner suggestion to generate's settings.
AUTO_FIXES = {
    "--kv-bits 8": {"kv_bits": 8},
    "--kv-bits 4": {"kv_bits": 4},
    "--draft-window 1024": {"draft_window": 1024},
    "--quantize-target 4": {"quantize_target": 4},
}


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
    device = Device(f"{budget} budget", size, size, "--memory-budget", backend=live_device().backend)
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
    )
    plan = make_plan(request)
    if not plan.fits:
        fix = next((r for r in plan.recommendations if r["fits"] and r["how"] in AUTO_FIXES), None)
        if not auto or fix is None:
            advice = "; rerun with --auto to apply the first fix" if fix else ""
            raise UserError(
                f"these settings need {plan.total_bytes / 2**30:.2f} GiB but the budget is "
                f"{size / 2**30:.2f} GiB{advice}:\n{format_plan(plan)}"
            )
        settings = {**settings, **AUTO_FIXES[fix["how"]]}
        report(f"mlxspec: --auto: {fix['change']} ({fix['how']}), to fit {budget}")
        request = replace(
            request,
            kv_bits=settings.get("kv_bits"),
            draft_window=settings.get("draft_window"),
            target_bits=settings.get("quantize_target"),
        )
        assert total_bytes(request) <= size
    mx.set_memory_limit(size)
    return settings
