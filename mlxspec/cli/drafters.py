"""`mlxspec drafters`: the drafters the local Hugging Face cache holds for a target, with why each fits or not
(drafting/discovery.py). Reads metadata only: no weights are loaded and nothing is downloaded (a GGUF target is
converted once, as generate converts it)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from mlxspec.errors import UserError


def _cached_target(name: str) -> tuple[Path, str]:
    """A local model directory, or the cached snapshot of a repo id (never downloaded here)."""
    from mlxspec.drafting.discovery import cached_snapshots
    from mlxspec.loading import DEFAULT_TARGET

    if not name:
        return Path(DEFAULT_TARGET), "the embedded target"
    path = Path(name).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":  # its conversion (made once, as generate makes it)
        from mlxspec.loading import resolve_model_path

        return resolve_model_path(path), name
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(f"--model '{name}' has no config.json; pass an mlx-lm model directory or a cached repo id")
        return path, name
    for repo, snapshot in cached_snapshots():
        if repo == name:
            return snapshot, name
    raise UserError(f"--model '{name}' is neither a model directory nor a repo in the local Hugging Face cache")


def _size(size: int) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB" if size else "-"


@click.command()
@click.option(
    "--model", default="", help="Target: a model directory, a GGUF file or a cached repo id [default: the embedded]."
)
@click.option("--all", "show_all", is_flag=True, help="Also list what does not fit, with why.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the target, the pick and every candidate.")
def drafters(model: str, show_all: bool, as_json: bool) -> None:
    """List the drafters in the local Hugging Face cache that fit a target, best first, and what --draft auto picks."""
    from mlxspec.drafting.discovery import choice_line, find_drafters, hub_cache_dir, pick
    from mlxspec.loading import DEFAULT_TARGET, MODELS_DIR

    path, name = _cached_target(model)
    embedded = path.resolve() == Path(DEFAULT_TARGET).resolve()  # also when named by its path
    shipped = [(MODELS_DIR / kind) for kind in ("dflash", "eagle", "draft")] if embedded else []
    shipped = [("embedded", path) for path in shipped if path.is_dir()]  # `--eagle embedded` and so on
    candidates = find_drafters(path, name, also=shipped)
    chosen = pick(candidates)
    if as_json:
        out = {
            "target": name,
            "cache": str(hub_cache_dir()),
            "pick": chosen.to_dict() if chosen else None,
            "candidates": [c.to_dict() for c in candidates],
        }
        click.echo(json.dumps(out))
        return
    shown = candidates if show_all else [c for c in candidates if c.matches]
    click.echo(f"# drafters in {hub_cache_dir()} for {name}")
    if not shown:
        click.echo("none fit" + ("" if show_all else f" ({len(candidates)} considered; --all lists them)"))
    for c in shown:
        mark = "fits" if c.matches else "no"
        click.echo(f"{mark:4s} {c.kind:7s} {_size(c.size_bytes):>9s}  {c.source}  ({c.why})")
    click.echo(choice_line(chosen, len(candidates)))
