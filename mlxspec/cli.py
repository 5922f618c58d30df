"""The `mlxspec` command line: generate (and, as they land, plan and bench)."""

from __future__ import annotations

import json
import os
import sys

import click

from .errors import UserError


def _fail(message: str) -> None:
    click.echo(f"mlxspec: error: {message}", err=True)
    sys.exit(2)


class Group(click.Group):
    """Every UserError, from any command, becomes one line on stderr and exit status 2."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except UserError as exc:
            _fail(str(exc))
        except KeyboardInterrupt:
            click.echo("", err=True)
            sys.exit(130)


@click.group(cls=Group)
@click.version_option(package_name="mlxspec")
def cli() -> None:
    """Exact speculative decoding on MLX."""


# OpenBLAS workers otherwise spin for about 2^28 cycles after each call, competing on a small CPU with the thread
# that dispatches MLX's ops; waiting 2^4 cycles made every mode 10-30% faster here (README, "Measured").
OPENBLAS_THREAD_TIMEOUT = "4"


def reexec_with_openblas(argv: list[str]) -> None:
    """On Linux, rerun compute commands with Debian's OpenBLAS preloaded when it is installed: the mlx-cpu wheel's
    bundled reference BLAS makes verifying k tokens cost k times one. Results are identical (tested); opt out with
    MLXSPEC_NO_OPENBLAS=1. OpenBLAS reads OPENBLAS_THREAD_TIMEOUT only at start, so it is set here too."""
    import sysconfig

    if sys.platform != "linux" or os.environ.get("MLXSPEC_NO_OPENBLAS") or os.environ.get("_MLXSPEC_REEXEC"):
        return
    if len(argv) < 2 or argv[1] not in ("generate", "bench", "train-medusa"):
        return
    arch = sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu"
    library = f"/usr/lib/{arch}/openblas-pthread/libblas.so.3"
    preloaded = "blas" in os.environ.get("LD_PRELOAD", "")
    if preloaded and "OPENBLAS_THREAD_TIMEOUT" in os.environ:
        return
    env = dict(os.environ, _MLXSPEC_REEXEC="1")
    env.setdefault("OPENBLAS_THREAD_TIMEOUT", OPENBLAS_THREAD_TIMEOUT)
    if not preloaded:
        if not os.path.exists(library):
            return
        try:
            import ctypes

            ctypes.CDLL(library)  # it must load before we bet the process on it
        except OSError:
            return
        env["LD_PRELOAD"] = f"{library} {os.environ.get('LD_PRELOAD', '')}".strip()
    os.execve(sys.executable, [sys.executable, "-m", "mlxspec.cli", *argv[1:]], env)


def main() -> None:
    reexec_with_openblas(sys.argv)
    cli(prog_name="mlxspec")


def format_stats(stats) -> str:
    tree = f"tree_nodes={stats.tree_nodes} " if stats.tree_nodes else ""
    return (
        f"alpha={stats.acceptance_rate:.2f} tau={stats.tokens_per_target_call:.2f} "
        f"gen={stats.tokens_per_second:.1f} tok/s prompt={stats.prompt_tokens_per_second:.1f} tok/s "
        f"tokens={stats.generated_tokens} target_calls={stats.target_calls} {tree}"
        f"peak={stats.peak_memory_bytes / 2**20:.1f} MiB"
    )


@cli.command()
@click.argument("prompt")
@click.option(
    "--model", default=None, help="Target: an mlx-lm model directory or HF repo id [default: embedded target]."
)
@click.option(
    "--draft",
    default=None,
    help="Draft model directory or repo id [default: embedded draft with the embedded target, none otherwise].",
)
@click.option("--no-draft", is_flag=True, help="Plain decoding through the same code, for comparison.")
@click.option(
    "-k",
    "--num-draft",
    type=int,
    default=None,
    help="Tokens drafted per step (1-64) [default: adapted each step to acceptance and measured cost].",
)
@click.option("--max-tokens", type=int, default=256, show_default=True)
@click.option("--temp", type=float, default=0.0, show_default=True, help="0 is greedy.")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--top-k", type=int, default=0, show_default=True)
@click.option("--min-p", type=float, default=0.0, show_default=True)
@click.option("--seed", type=int, default=None, help="Random seed [default: random].")
@click.option("--stop", multiple=True, help="Stop when this string appears (repeatable).")
@click.option("--quantize-target", type=click.Choice(["4", "8"]), default=None, help="Quantize the target on load.")
@click.option("--kv-bits", type=click.Choice(["4", "8"]), default=None, help="Quantize both KV caches.")
@click.option("--draft-window", type=int, default=None, help="Cap the draft's KV cache at this many tokens.")
@click.option(
    "--tree-topk",
    type=int,
    default=1,
    show_default=True,
    help="Draft a tree: the draft's top-k alternatives at every depth.",
)
@click.option("--tree-nodes", type=int, default=None, help="Node budget of the tree (sets its depth).")
@click.option("--lookup", is_flag=True, help="Draft by prompt lookup; the draft model covers what does not repeat.")
@click.option(
    "--lookup-candidates",
    type=int,
    default=1,
    show_default=True,
    help="With --lookup: verify this many distinct continuations as one tree (pays where verification is flat).",
)
@click.option(
    "--no-corpus-fallback",
    is_flag=True,
    help="With --lookup: draft nothing where the text does not repeat, instead of a stdlib bigram guess.",
)
@click.option("--medusa", "medusa_path", default=None, help="Draft with Medusa heads (a train-medusa directory).")
@click.option("--memory-budget", default=None, help="Plan first (e.g. 8GB) and refuse settings that cannot fit.")
@click.option("--auto", is_flag=True, help="With --memory-budget: apply the planner's top fix instead of refusing.")
@click.option("--chat", is_flag=True, help="Apply the tokenizer's chat template.")
@click.option("--heal", is_flag=True, help="Token healing: let the first token re-complete the prompt's last one.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with tokens, text and stats.")
@click.option("-v", "--verbose", is_flag=True, help="Print a stats line to stderr.")
def generate(
    prompt,
    model,
    draft,
    no_draft,
    num_draft,
    max_tokens,
    temp,
    top_p,
    top_k,
    min_p,
    seed,
    stop,
    quantize_target,
    kv_bits,
    draft_window,
    tree_topk,
    tree_nodes,
    lookup,
    lookup_candidates,
    no_corpus_fallback,
    medusa_path,
    memory_budget,
    auto,
    chat,
    heal,
    as_json,
    verbose,
) -> None:
    """Continue PROMPT ('-' reads stdin), streaming text as the target accepts it."""
    from .api import load  # deferred: `mlxspec --help` stays instant
    from .loading import DEFAULT_DRAFT, DEFAULT_TARGET

    if prompt == "-":
        prompt = sys.stdin.read()
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little")
    if medusa_path and draft:
        raise UserError("--medusa and --draft are two drafters; pass one of them")
    draft = None if (no_draft or medusa_path) else (draft or (str(DEFAULT_DRAFT) if model is None else None))
    settings = {
        "quantize_target": int(quantize_target) if quantize_target else None,
        "kv_bits": int(kv_bits) if kv_bits else None,
        "draft_window": draft_window,
    }
    if memory_budget:
        from .budget import fit_to_budget

        settings = fit_to_budget(
            str(model or DEFAULT_TARGET),
            draft,
            memory_budget,
            len(prompt),
            max_tokens,
            num_draft or 8,
            settings,
            auto,
            report=lambda line: click.echo(line, err=True),
        )
    num_draft = "auto" if num_draft is None else num_draft
    speculator = load(model, draft, num_draft=num_draft, medusa=None if no_draft else medusa_path, **settings)
    kwargs = dict(
        max_tokens=max_tokens,
        temperature=temp,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        num_draft=num_draft,
        seed=seed,
        stop=list(stop),
        chat=chat,
        tree_topk=tree_topk,
        tree_nodes=tree_nodes,
        lookup=lookup,
        lookup_candidates=lookup_candidates,
        corpus_fallback=not no_corpus_fallback,
        heal=heal,
    )
    if as_json:
        result = speculator.generate(prompt, **kwargs)
        click.echo(
            json.dumps(
                {
                    "tokens": result.tokens,
                    "text": result.text,
                    "finish_reason": result.finish_reason,
                    "seed": seed,
                    "stats": result.stats.to_dict(),
                }
            )
        )
        return
    for chunk in speculator.stream(prompt, **kwargs):
        click.echo(chunk.text, nl=False)
    click.echo()
    stats = speculator.last_stats
    if stats.note:
        from .costs import fast_blas_hint

        click.echo(f"mlxspec: {stats.note}", err=True)
        if fast_blas_hint():
            click.echo(fast_blas_hint(), err=True)
    if verbose:
        click.echo(format_stats(stats), err=True)


def _read_prompts(path, tokenizer) -> list[list[int]]:
    """JSONL: one object per line with "prompt" (text) or "tokens" (ids)."""
    prompts = []
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError as exc:
        raise UserError(f"cannot read prompts file '{path}': {exc.strerror}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            prompts.append(list(item["tokens"]) if "tokens" in item else tokenizer.encode(item["prompt"]))
        except (json.JSONDecodeError, KeyError, TypeError):
            raise UserError(f'{path}:{number} is not a JSON object with "prompt" or "tokens"') from None
    if not prompts:
        raise UserError(f"prompts file '{path}' holds no prompts")
    return prompts


@cli.command()
@click.option("--model", default=None, help="Target [default: embedded target].")
@click.option("--draft", default=None, help="Draft [default: embedded draft with the embedded target].")
@click.option("--medusa", "medusa_path", default=None, help="Medusa heads [default: embedded heads, if shipped].")
@click.option("-k", "--num-draft", "num_drafts", type=int, multiple=True, help="Draft length(s) to compare [2 4 6].")
@click.option("--temp", "temps", type=float, multiple=True, help="Temperature(s) [0 and 0.7].")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option(
    "--modes", default="mlx-lm,plain,draft,adaptive,tree,lookup,medusa", show_default=True, help="Mode families to run."
)
@click.option("--prompts", "prompts_file", default=None, help="JSONL prompts [default: held-out stdlib files].")
@click.option("--num-prompts", type=int, default=8, show_default=True)
@click.option("--prompt-tokens", type=int, default=128, show_default=True)
@click.option("--max-tokens", type=int, default=128, show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option("--verify-curve", is_flag=True, help="Time one target forward over 1..32 tokens and stop.")
@click.option("--profile", is_flag=True, help="Also report the per-step time split of the draft-model mode.")
@click.option("--json", "json_out", default=None, help="Also write the results to this JSON file.")
@click.option("--plot", "plot_path", default=None, help="Also draw speedup vs k and tok/s per mode to a PNG.")
def bench(
    model,
    draft,
    medusa_path,
    num_drafts,
    temps,
    top_p,
    modes,
    prompts_file,
    num_prompts,
    prompt_tokens,
    max_tokens,
    repeats,
    verify_curve,
    profile,
    json_out,
    plot_path,
) -> None:
    """Compare plain decoding, mlx-lm's speculative decoding and mlxspec's modes on the same prompts."""
    import mlx.core as mx

    from . import bench as bench_module
    from .api import load
    from .costs import blas_in_use, fast_blas_hint
    from .loading import MODELS_DIR

    if plot_path:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UserError("--plot needs matplotlib: pip install -e '.[plot]'") from None
    num_drafts = num_drafts or (2, 4, 6)
    temps = temps or (0.0, 0.7)
    if medusa_path is None and model is None and (MODELS_DIR / "medusa" / "medusa_config.json").exists():
        medusa_path = str(MODELS_DIR / "medusa")
    speculator = load(model, draft or "auto", num_draft=max(num_drafts))
    heads = None
    if medusa_path:
        from .medusa import load_medusa

        heads = load_medusa(medusa_path, speculator.target.path)
    if fast_blas_hint():
        click.echo(fast_blas_hint(), err=True)
    if verify_curve:
        click.echo(bench_module.verify_curve_report(speculator))
        return
    if speculator.draft is None and heads is None:
        raise UserError("bench compares drafters; pass --draft or --medusa")
    prompts = (
        _read_prompts(prompts_file, speculator.tokenizer)
        if prompts_file
        else bench_module.heldout_prompts(speculator.tokenizer, num_prompts, prompt_tokens)
    )
    mode_fns = bench_module.build_modes(speculator, tuple(num_drafts), set(modes.split(",")), heads)
    everything, by_temp = {}, {}
    timeout = os.environ.get("OPENBLAS_THREAD_TIMEOUT")
    click.echo(
        f"# {len(prompts)} prompts x {max_tokens} tokens, median of {repeats} passes that each run every mode in "
        f"turn; speedup is the median within-pass ratio to the first mode; {blas_in_use()} BLAS"
        + (f" (OPENBLAS_THREAD_TIMEOUT={timeout})" if timeout else "")
        + f", device {mx.default_device()}"
    )
    for temp in temps:
        click.echo(f"\n## temperature {temp}" + (f", top-p {top_p}" if top_p < 1 else ""))
        results = bench_module.run_modes(
            mode_fns, prompts, max_tokens, temp, top_p, repeats, progress=lambda s: click.echo(f"  {s}", err=True)
        )
        click.echo(bench_module.format_table(results))
        by_temp[str(temp)] = results
        everything[str(temp)] = [bench_module.asdict(r) for r in results]
        if profile and speculator.draft is not None:
            split = bench_module.profile_split(speculator, prompts[:2], max_tokens, max(num_drafts), temp)
            total = sum(split.values())
            click.echo(
                f"per-step split, draft k={max(num_drafts)} (profiling adds syncs): "
                + ", ".join(f"{phase} {1e3 * sec:.2f} ms ({100 * sec / total:.0f}%)" for phase, sec in split.items())
            )
            everything[f"profile {temp}"] = split
    if json_out:
        with open(json_out, "w") as f:
            json.dump(
                {"prompts": len(prompts), "max_tokens": max_tokens, "blas": blas_in_use(), "results": everything},
                f,
                indent=1,
            )
    if plot_path:
        bench_module.plot(by_temp, plot_path)


@cli.command()
@click.option("--model", "model", default=None, help="Target: preset name, model directory, config.json or repo id.")
@click.option("--draft", default=None, help="Draft model, same forms as --model.")
@click.option("--medusa-heads", type=int, default=0, help="Plan for this many Medusa heads on the target.")
@click.option("--device", default=None, help="Device preset (see --list) [default: this machine].")
@click.option("--memory", default=None, help="A memory budget instead of a device, e.g. 16GB.")
@click.option("--context", type=int, default=4096, show_default=True)
@click.option("--batch", type=int, default=1, show_default=True)
@click.option("--target-bits", type=click.Choice(["4", "8"]), default=None, help="Quantize the target [as stored].")
@click.option("--draft-bits", type=click.Choice(["4", "8"]), default=None)
@click.option("--group-size", type=int, default=64, show_default=True)
@click.option("--kv-bits", type=click.Choice(["4", "8"]), default=None)
@click.option("-k", "--num-draft", type=int, default=4, show_default=True)
@click.option("--tree-nodes", type=int, default=None)
@click.option("--draft-window", type=int, default=None, help="Cap the draft's KV cache at this many tokens.")
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
    as_json,
    list_presets,
) -> None:
    """Will the target, its drafter and both KV caches fit the device at this context? Reads metadata only."""
    from .devices import PRESETS, resolve_device
    from .metadata import load_metadata, preset_names
    from .planner import PlanRequest, format_plan, make_plan

    if list_presets:
        click.echo("models:  " + ", ".join(preset_names()))
        click.echo("devices: " + ", ".join(PRESETS))
        return
    if model is None:
        from .loading import DEFAULT_DRAFT, DEFAULT_TARGET

        model, draft = str(DEFAULT_TARGET), draft or str(DEFAULT_DRAFT)
    if context < 1 or batch < 1:
        raise UserError(f"context {context} and batch {batch} must be at least 1")
    device_spec = resolve_device(device, memory)
    request = PlanRequest(
        target=load_metadata(model),
        device=device_spec,
        draft=load_metadata(draft) if draft else None,
        medusa_heads=medusa_heads,
        context=context,
        batch=batch,
        target_bits=int(target_bits) if target_bits else None,
        group_size=group_size,
        draft_bits=int(draft_bits) if draft_bits else None,
        kv_bits=int(kv_bits) if kv_bits else None,
        num_draft=num_draft,
        tree_nodes=tree_nodes,
        draft_window=draft_window,
    )
    result = make_plan(request)
    click.echo(json.dumps(result.to_dict(), indent=1) if as_json else format_plan(result))


@cli.command("train-medusa")
@click.option("--model", default=None, help="Frozen target [default: embedded target].")
@click.option("--out", "out_dir", required=True, help="Output directory (resumes from its checkpoint).")
@click.option("--heads", type=int, default=4, show_default=True)
@click.option("--steps", type=int, default=400, show_default=True)
@click.option("--batch-size", type=int, default=8, show_default=True)
@click.option("--seq-len", type=int, default=256, show_default=True)
@click.option("--lr", type=float, default=1e-3, show_default=True)
@click.option(
    "--data",
    type=click.Choice(["corpus", "self-distill"]),
    default="corpus",
    show_default=True,
    help="Stdlib text, or the target's own greedy continuations of it.",
)
@click.option("--full-lm-heads", is_flag=True, help="Give each head its own LM head (more memory).")
@click.option("--seed", type=int, default=0, show_default=True)
def train_medusa_command(model, out_dir, heads, steps, batch_size, seq_len, lr, data, full_lm_heads, seed) -> None:
    """Train Medusa heads on a frozen target; writes medusa.safetensors and medusa_config.json."""
    from pathlib import Path

    from .loading import DEFAULT_TARGET, load_model
    from .medusa_train import MedusaTrainConfig, train_medusa

    if heads < 1 or steps < 1:
        raise UserError(f"--heads {heads} and --steps {steps} must be at least 1")
    target = load_model(model or DEFAULT_TARGET)
    config = MedusaTrainConfig(
        num_heads=heads,
        steps=steps,
        batch_size=batch_size,
        seq_len=seq_len,
        lr=lr,
        seed=seed,
        data=data,
        shared_lm_head=not full_lm_heads,
    )
    train_medusa(target, Path(out_dir), config, log=lambda line: click.echo(line, err=True))
    click.echo(f"saved Medusa heads to {out_dir}")


if __name__ == "__main__":
    main()
