"""The plan as text: the items, the verdict, the max contexts and the suggestions."""

from __future__ import annotations

from mlxspec.plan.planner import Plan
from mlxspec.platform import GiB


def _size(num_bytes: int) -> str:
    return f"{num_bytes / GiB:.2f} GiB" if num_bytes >= GiB / 10 else f"{num_bytes / 2**20:.1f} MiB"


def format_plan(plan: Plan) -> str:
    r = plan.request
    head = (
        f"{r['target']}"
        + (f" + draft {r['draft']}" if r["draft"] else "")
        + (f" + {r['medusa_heads']} Medusa heads" if r["medusa_heads"] else "")
    )
    where = f"each of {r['ranks']} x {r['device']} ({r['distributed']})" if r.get("distributed") else r["device"]
    lines = [
        f"{head} on {where} at context {r['context']} (batch {r['batch']})",
        f"budget {plan.budget_bytes / GiB:.2f} GiB: {r['device_source']}",
        f"computed in {r['dtype']} on the {r['backend'].upper()}"
        + (" (MLX's CPU backend computes in float32; --device plans a Mac's GPU)" if r["backend"] == "cpu" else ""),
        "",
    ]
    for item in plan.items:
        lines.append(f"  {item.name:18s} {item.bytes / GiB:9.3f} GiB  {item.note}")
    lines.append(f"  {'total':18s} {plan.total_bytes / GiB:9.3f} GiB  of {plan.budget_bytes / GiB:.2f} GiB")
    lines.append("")
    drafted = bool(r["draft"] or r["medusa_heads"])
    verdict = "FITS" if plan.fits else "DOES NOT FIT"
    if drafted:  # with no drafter there is no overhead to state
        verdict += (
            f": drafter overhead {plan.drafter_overhead_bytes / GiB:.3f} GiB "
            f"({plan.drafter_overhead_percent:.1f}% of the budget)"
        )
    lines.append(verdict)
    for name, ctx in plan.max_context.items():
        wanted = name == "target alone" or (name == "target + draft" and r["draft"]) or (drafted and "medusa" in name)
        if wanted:
            lines.append(f"  max context, {name:16s} {ctx if ctx is not None else 'none fits'}")
    if plan.recommendations:
        lines.append("")
        goal = "what to change" if not plan.fits else "to fit a longer context"
        lines.append(f"{goal} (flags of `mlxspec generate`), cheapest first:")
        for rec in plan.recommendations:
            verdict = "fits" if rec["fits"] else "still too big"
            lines.append(
                f"  {rec['how']:20s} {rec['change']}: saves {_size(rec['saving_bytes'])}, "
                f"{_size(rec['total_bytes'])} in all, {verdict}, max context {rec['max_context'] or 'none'}"
            )
    for note in plan.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)
