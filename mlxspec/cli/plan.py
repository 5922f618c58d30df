"""`mlxspec plan`: will a target and its drafter fit this device (planner in mlxspec/plan/). Imports no MLX."""

from __future__ import annotations

import json
import sys

import click

from mlxspec.cli.options import with_options
from mlxspec.errors import UserError
from mlxspec.plan.rank_split import MODES

WHAT_OPTIONS = [
    click.option("--model", default=None, help="Target: preset name, model directory, config.json or repo id."),
    click.option("--draft", default=None, help="Draft model, same forms as --model."),
    click.option("--medusa-heads", type=click.IntRange(min=0), default=0, help="Plan for this many Medusa heads."),
]
WHERE_OPTIONS = [
    click.option("--device", default=None, help="Device preset, e.g. m2-16gb (see --list) [default: this machine]."),
    click.option(
        "--memory",
        default=None,
        help="A budget instead of a device: 16GB is 10^9-byte units (14.90 GiB), all of it usable. A 16 GB Mac "
        "lets MLX use about 10.7 GiB: use --device m2-16gb for that.",
    ),
    click.option(
        "--ranks",
        type=click.IntRange(min=1),
        default=1,
        show_default=True,
        help="Plan one of N machines sharing the target (generate --distributed); --device is each machine.",
    ),
    click.option(
        "--distributed",
        type=click.Choice(MODES),
        default=None,
        help="How --ranks split the target: each layer (tensor) or by layers (pipeline) [default: tensor].",
    ),
]
SETTINGS_OPTIONS = [
    click.option(
        "--context", type=click.IntRange(min=1), default=None, help="[default: 4096, or the model's own if less]"
    ),
    click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True),
    click.option(
        "--quantize-target",
        "--target-bits",
        "target_bits",
        type=click.Choice(["4", "8"]),
        default=None,
        help="Quantize the target [as stored]; the same flag as generate's.",
    ),
    click.option("--draft-bits", type=click.Choice(["4", "8"]), default=None, help="Quantize the draft [as stored]."),
    click.option("--group-size", type=click.Choice(["32", "64", "128"]), default="64", show_default=True),
    click.option("--kv-bits", type=click.Choice(["4", "8"]), default=None),
    click.option("-k", "--num-draft", type=click.IntRange(1, 64), default=4, show_default=True),
    click.option("--tree-nodes", type=click.IntRange(min=1), default=None),
    click.option(
        "--draft-window", type=click.IntRange(min=1), default=None, help="Cap the draft's KV cache at this many tokens."
    ),
]


@click.command()
@with_options(WHAT_OPTIONS, WHERE_OPTIONS, SETTINGS_OPTIONS)
@click.option("--json", "as_json", is_flag=True)
@click.option("--list", "list_presets", is_flag=True, help="List model and device presets.")
def plan(as_json: bool, list_presets: bool, **p) -> None:
    """Will the target, its drafter and both KV caches fit the device at this context? Reads metadata only. Exits
    0 when it fits, 1 when it does not."""
    from mlxspec.plan.devices import PRESETS
    from mlxspec.plan.format import format_plan
    from mlxspec.plan.metadata import preset_names
    from mlxspec.plan.planner import make_plan

    if list_presets:
        click.echo("models:  " + ", ".join(preset_names()))
        click.echo("devices: " + ", ".join(PRESETS))
        return
    result = make_plan(plan_request(p))
    click.echo(json.dumps(result.to_dict(), indent=1) if as_json else format_plan(result))
    if not result.fits:
        sys.exit(1)  # a script can test it: 0 fits, 1 does not, 2 bad input


def plan_request(p: dict):
    """The PlanRequest the option groups describe (the embedded pair when no --model is given)."""
    from mlxspec.plan.devices import resolve_device
    from mlxspec.plan.metadata import load_metadata
    from mlxspec.plan.planner import PlanRequest
    from mlxspec.plan.rank_split import RankSplit, check_split

    model, draft = p["model"], p["draft"]
    if model is None:
        from mlxspec.platform import models_dir

        model, draft = str(models_dir() / "target"), draft or str(models_dir() / "draft")
    device = resolve_device(p["device"], p["memory"])
    target = load_metadata(model)
    own_context, context = target.config.get("max_position_embeddings"), p["context"]
    if context is None:
        context = min(4096, own_context) if isinstance(own_context, int) else 4096
    elif isinstance(own_context, int) and context > own_context:
        raise UserError(f"--context {context} is past {target.name}'s own context of {own_context}; plan at most that")
    if p["distributed"] and p["ranks"] == 1:
        raise UserError(f"--distributed {p['distributed']} plans several machines; pass --ranks N (e.g. --ranks 2)")
    split = RankSplit(p["ranks"], p["distributed"] or "tensor")
    check_split(target.config, split, target.name)
    bits = {name: int(p[name]) if p[name] else None for name in ("target_bits", "draft_bits", "kv_bits")}
    return PlanRequest(
        target=target,
        device=device,
        draft=load_metadata(draft) if draft else None,
        medusa_heads=p["medusa_heads"],
        context=context,
        batch=p["batch"],
        group_size=int(p["group_size"]),
        num_draft=p["num_draft"],
        tree_nodes=p["tree_nodes"],
        draft_window=p["draft_window"],
        split=split,
        **bits,
    )
