"""`mlxspec plan`: will a target and its drafter fit this device (planner in mlxspec/plan/). Imports no MLX."""

from __future__ import annotations

import json

import click

from mlxspec.errors import UserError
from mlxspec.plan.rank_split import MODES


@click.command()
@click.option("--model", "model", default=None, help="Target: preset name, model directory, config.json or repo id.")
@click.option("--draft", default=None, help="Draft model, same forms as --model.")
@click.option("--medusa-heads", type=click.IntRange(min=0), default=0, help="Plan for this many Medusa heads.")
@click.option("--device", default=None, help="Device preset, e.g. m2-16gb (see --list) [default: this machine].")
@click.option(
    "--memory",
    default=None,
    help="A budget instead of a device: 16GB is 10^9-byte units (14.90 GiB), all of it usable. A 16 GB Mac lets "
    "MLX use about 10.7 GiB: use --device m2-16gb for that.",
)
@click.option("--context", type=click.IntRange(min=1), default=None, help="[default: 4096, or the model's own if less]")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--target-bits", type=click.Choice(["4", "8"]), default=None, help="Quantize the target [as stored].")
@click.option("--draft-bits", type=click.Choice(["4", "8"]), default=None, help="Quantize the draft [as stored].")
@click.option("--group-size", type=click.Choice(["32", "64", "128"]), default="64", show_default=True)
@click.option("--kv-bits", type=click.Choice(["4", "8"]), default=None)
@click.option("-k", "--num-draft", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--tree-nodes", type=click.IntRange(min=1), default=None)
@click.option(
    "--draft-window", type=click.IntRange(min=1), default=None, help="Cap the draft's KV cache at this many tokens."
)
@click.option(
    "--ranks",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Plan one of N machines sharing the target (generate --distributed); --device is each machine.",
)
@click.option(
    "--distributed",
    type=click.Choice(MODES),
    default=None,
    help="How --ranks split the target: each layer (tensor) or by layers (pipeline) [default: tensor].",
)
@click.option("--json", "as_json", is_flag=True)
@click.option("--list", "list_presets", is_flag=True, help="List model and device presets.")
def plan(
    model,
    draft,
    medusa_heads,
    device,
    memory,
    context,
    batch,
    target_bits,
    draft_bits,
    group_size,
    kv_bits,
    num_draft,
    tree_nodes,
    draft_window,
    ranks,
    distributed,
    as_json,
    list_presets,
) -> None:
    """Will the target, its drafter and both KV caches fit the device at this context? Reads metadata only."""
    from mlxspec.plan.devices import PRESETS, resolve_device
    from mlxspec.plan.format import format_plan
    from mlxspec.plan.metadata import load_metadata, preset_names
    from mlxspec.plan.planner import PlanRequest, make_plan
    from mlxspec.plan.rank_split import RankSplit, check_split

    if list_presets:
        click.echo("models:  " + ", ".join(preset_names()))
        click.echo("devices: " + ", ".join(PRESETS))
        return
    if model is None:
        from mlxspec.loading import DEFAULT_DRAFT, DEFAULT_TARGET

        model, draft = str(DEFAULT_TARGET), draft or str(DEFAULT_DRAFT)
    device_spec = resolve_device(device, memory)
    target = load_metadata(model)
    own_context = target.config.get("max_position_embeddings")
    if context is None:
        context = min(4096, own_context) if isinstance(own_context, int) else 4096
    elif isinstance(own_context, int) and context > own_context:
        raise UserError(f"--context {context} is past {target.name}'s own context of {own_context}; plan at most that")
    if distributed and ranks == 1:
        raise UserError(f"--distributed {distributed} plans several machines; pass --ranks N (e.g. --ranks 2)")
    split = RankSplit(ranks, distributed or "tensor")
    check_split(target.config, split, target.name)
    request = PlanRequest(
        target=target,
        device=device_spec,
        draft=load_metadata(draft) if draft else None,
        medusa_heads=medusa_heads,
        context=context,
        batch=batch,
        target_bits=int(target_bits) if target_bits else None,
        group_size=int(group_size),
        draft_bits=int(draft_bits) if draft_bits else None,
        kv_bits=int(kv_bits) if kv_bits else None,
        num_draft=num_draft,
        tree_nodes=tree_nodes,
        draft_window=draft_window,
        split=split,
    )
    result = make_plan(request)
    click.echo(json.dumps(result.to_dict(), indent=1) if as_json else format_plan(result))
