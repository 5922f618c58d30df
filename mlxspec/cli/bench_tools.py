"""The `mlxspec bench` subcommands: serve, agent-loop, verify-cost, acceptance and plan (runners in mlxspec/bench/).

Each prints its table as it goes, with progress and the time left on stderr; `--json FILE` keeps the report, and
`--plot FILE` draws it where a picture helps. Output paths are checked before anything runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from mlxspec.errors import UserError

JSON_OPTION = click.option("--json", "json_out", default=None, help="Also write the report to this JSON file.")


def check_writable(flag: str, path: str) -> None:
    """Refuse an output path that cannot be written: an empty name, a directory, or a missing or read-only folder."""
    target = Path(path)
    folder = target.parent
    if not path.strip() or target.is_dir():
        raise UserError(f"{flag} '{path}' is not a file name; pass a path to a file to write")
    if not folder.is_dir():
        raise UserError(f"{flag} '{path}': the folder '{folder}' does not exist; create it or pass another path")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise UserError(f"{flag} '{path}' cannot be written (permissions); pass another path")


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError(
            "--plot needs matplotlib; from a checkout: pip install -e '.[plot]'; installed with pipx: "
            "pipx inject mlxspec matplotlib"
        ) from None


def check_outputs(json_out: str | None, plot_path: str | None = None) -> None:
    """Refuse an unwritable --json or --plot, or --plot without matplotlib, before any model loads."""
    for flag, path in (("--json", json_out), ("--plot", plot_path)):
        if path is not None:
            check_writable(flag, path)
    if plot_path:
        require_matplotlib()


def write_report(report: dict, json_out: str | None, command: str) -> None:
    if json_out:
        Path(json_out).write_text(json.dumps({"command": command, **report}, indent=1) + "\n")
        click.echo(f"# report written to {json_out}", err=True)


def command_line(name: str) -> str:
    import sys

    return f"mlxspec bench {name} " + " ".join(sys.argv[3:]) if len(sys.argv) > 2 else f"mlxspec bench {name}"


@click.command("serve", short_help="Servers under load: mlxspec serve against mlx_lm.server.")
@click.argument("what", type=click.Choice(["load", "ttft", "compare", "batch"]), default="load")
@click.option("--model", default=None, help="Target [default: the embedded target].")
@click.option("--draft", default=None, help="Draft [default: the embedded draft with the embedded target].")
@click.option("-k", "--num-draft", type=click.IntRange(1, 64), default=None, help="Draft length [default: auto].")
@click.option("--clients", type=click.IntRange(1, 256), default=8, show_default=True, help="load: clients at once.")
@click.option("--loads", default="1,2,4,8", show_default=True, help="batch: the client counts, comma-separated.")
@click.option("--requests", type=click.IntRange(1, 10_000), default=10, show_default=True, help="Per client.")
@click.option("--max-tokens", type=click.IntRange(1, 100_000), default=64, show_default=True)
@click.option("--rounds", type=click.IntRange(1, 10_000), default=6, show_default=True, help="ttft/compare prompts.")
@click.option("--logs", default=".", show_default=True, help="Folder for the servers' logs.")
@JSON_OPTION
def serve(what, model, draft, num_draft, clients, loads, requests, max_tokens, rounds, logs, json_out) -> None:
    """Servers under load: `mlxspec serve` (and mlx_lm.server for compare and batch) as child processes, through
    the OpenAI-style HTTP API. WHAT: load (N clients, each greedy answer checked), ttft (a reused prefix against a
    cold one), compare (mlxspec against mlx_lm.server, same draft) or batch (1-8 clients against --max-batch 8,
    --max-batch 1 and mlx_lm.server)."""
    from mlxspec.bench.serve import ServeBenchConfig, run_serve_bench

    check_outputs(json_out)
    counts = [part.strip() for part in loads.split(",") if part.strip()]
    if not counts or not all(c.isascii() and c.isdigit() and 1 <= int(c) <= 256 for c in counts):
        raise UserError(f"--loads '{loads}' is not a list of client counts 1-256 (e.g. 1,2,4,8)")
    if not Path(logs).is_dir():
        raise UserError(f"--logs '{logs}' is not a folder; create it or pass another")
    config = ServeBenchConfig(
        what, model, draft, num_draft, clients, tuple(int(c) for c in counts), requests, max_tokens, rounds, Path(logs)
    )
    write_report(run_serve_bench(config, echo=click.echo), json_out, command_line("serve"))


@click.command("agent-loop", short_help="An agent loop: lookup and the suffix cache on files resent turn after turn.")
@click.option("--model", default=None, help="Target [default: the embedded target].")
@click.option("--draft", default=None, help="Draft [default: the embedded draft].")
@click.option("--files", type=click.IntRange(1, 64), default=3, show_default=True, help="Loops interleaved.")
@click.option("--rounds", type=click.IntRange(1, 1000), default=8, show_default=True, help="Turns per loop.")
@click.option("--first-lines", type=click.IntRange(1, 10_000), default=12, show_default=True)
@click.option("--lines-per-turn", type=click.IntRange(1, 1000), default=3, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1, 100_000), default=96, show_default=True)
@click.option("-k", "--num-draft", default="auto", show_default=True, help="Draft length, or auto.")
@JSON_OPTION
def agent_loop(json_out, **p) -> None:
    """Files edited turn after turn, each turn resending the file a few lines longer: no draft, prompt lookup, the
    shared suffix cache and the draft model, each checked to write plain decoding's text."""
    from mlxspec.api import load
    from mlxspec.bench.agent_loop import AgentLoopConfig, run_agent_loop
    from mlxspec.options import parse_num_draft

    check_outputs(json_out)
    p["num_draft"] = parse_num_draft(p["num_draft"])
    report = run_agent_loop(AgentLoopConfig(**p), load, echo=click.echo)
    write_report(report, json_out, command_line("agent-loop"))


@click.command("verify-cost", short_help="The v(n) curve: what verifying n tokens costs on this device.")
@click.option("--model", default=None, help="Target [default: the embedded target].")
@click.option("--draft", default=None, help="Draft [default: the embedded draft with the embedded target].")
@click.option("--max-tokens", type=click.IntRange(2, 64), default=32, show_default=True, help="Largest forward.")
@click.option("--context", type=click.IntRange(1, 1 << 20), default=256, show_default=True)
@click.option("--repeats", type=click.IntRange(1, 1000), default=7, show_default=True, help="Median of this many.")
@click.option("--kernel", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True)
@click.option(
    "--formats",
    is_flag=True,
    help="Also each weight format's GiB/s and v(n) (its largest layer alone) beside this machine's memory read.",
)
@click.option("--plot", "plot_path", default=None, help="Also draw v(n) against n to a PNG.")
@JSON_OPTION
def verify_cost(json_out, plot_path, **p) -> None:
    """The v(n) curve: one target forward over n tokens against one token, on this device, and the draft length
    it implies. Measured fresh and only reported: the curve `-k auto` uses is not replaced."""
    from mlxspec.bench.verify_cost import VerifyCostConfig, plot_verify_cost, run_verify_cost

    check_outputs(json_out, plot_path)
    report = run_verify_cost(VerifyCostConfig(**p), echo=click.echo)
    write_report(report, json_out, command_line("verify-cost"))
    if plot_path:
        plot_verify_cost(report, plot_path)


@click.command("acceptance", short_help="tau and alpha by depth of every drafter (counts, no timings).")
@click.option("--model", default=None, help="Target [default: the embedded target].")
@click.option("--draft", default=None, help="Draft model [default: the embedded draft with the embedded target].")
@click.option("--eagle", default=None, help="An EAGLE or EAGLE-3 head (chains and --eagle-trees).")
@click.option("--medusa", default=None, help="Medusa or Hydra heads (chains and --medusa-trees).")
@click.option("--dflash", default=None, help="A DFlash drafter (chains and --ddtrees).")
@click.option("--no-draft-model", is_flag=True, help="Leave out the draft-model row.")
@click.option("--no-lookup", is_flag=True, help="Leave out the prompt-lookup row.")
@click.option("--depth", type=click.IntRange(1, 32), default=6, show_default=True)
@click.option("--num-prompts", type=click.IntRange(1, 1000), default=8, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1, 100_000), default=128, show_default=True)
@click.option("--temp", "temps", type=click.FloatRange(0, 100), multiple=True, help="Temperature(s) [0 and 0.7].")
@click.option("--eagle-trees", default="8:2,16:4", show_default=True, help="EAGLE-2 trees, NODES:BEAM,...")
@click.option("--medusa-trees", default="8:2,16:4", show_default=True, help="Sparse trees, NODES:TOPK,...")
@click.option("--ddtrees", default="8:2,15:3", show_default=True, help="DDTrees, NODES:TOPK,...")
@JSON_OPTION
def acceptance(json_out, no_draft_model, no_lookup, temps, eagle_trees, medusa_trees, ddtrees, **p) -> None:
    """tau (tokens per target call) and alpha by depth of every drafter given, on held-out prompts, at T=0 and 0.7.
    Counts only, no timings: the same seeds give the same table on any machine."""
    from mlxspec.bench.acceptance import AcceptanceConfig, parse_trees, run_acceptance

    check_outputs(json_out)
    config = AcceptanceConfig(
        **p,
        lookup=not no_lookup,
        draft_model=not no_draft_model,
        temperatures=tuple(temps) or (0.0, 0.7),
        eagle_trees=parse_trees("--eagle-trees", eagle_trees),
        medusa_trees=parse_trees("--medusa-trees", medusa_trees),
        ddtrees=parse_trees("--ddtrees", ddtrees),
    )
    write_report(run_acceptance(config, echo=click.echo), json_out, command_line("acceptance"))


@click.command("plan", short_help="The memory planner against measured peak memory.")
@click.option("--contexts", default="256,512,1024,2048,4096", show_default=True, help="Comma-separated.")
@click.option(
    "--pairs", default="embedded,qwen2.5-0.5b-random", show_default=True, help="Target + draft pairs, or model dirs."
)
@JSON_OPTION
def plan(contexts, pairs, json_out) -> None:
    """The memory planner against MLX's measured peak memory (`mlxspec plan`'s numbers checked on this machine)."""
    from mlxspec.bench.plan_check import PAIRS, PlanCheckConfig, run_plan_check

    check_outputs(json_out)
    sizes = [c.strip() for c in contexts.split(",") if c.strip()]
    if not sizes or not all(c.isascii() and c.isdigit() and 64 <= int(c) <= 1 << 20 for c in sizes):
        raise UserError(f"--contexts '{contexts}' is not a list of contexts 64-1048576 (e.g. 256,1024,4096)")
    names = tuple(n.strip() for n in pairs.split(",") if n.strip())
    if not names or any(n not in PAIRS and not Path(n).is_dir() for n in names):
        raise UserError(f"--pairs '{pairs}': choose from {','.join(PAIRS)}, or a model directory")
    report = run_plan_check(PlanCheckConfig(tuple(int(c) for c in sizes), names), echo=click.echo)
    write_report(report, json_out, command_line("plan"))


SUBCOMMANDS = (serve, agent_loop, verify_cost, acceptance, plan)
