"""`mlxspec bench`: speed and acceptance of every drafting mode on held-out prompts (runner in mlxspec/bench/)."""

from __future__ import annotations

import json
import os

import click
from click.core import ParameterSource

from mlxspec.cli.bench_tools import SUBCOMMANDS, check_writable, require_matplotlib
from mlxspec.cli.options import with_options
from mlxspec.errors import UserError

BENCH_MODES = ("mlx-lm", "plain", "draft", "adaptive", "tree", "lookup", "medusa", "eagle", "dflash")


def read_prompts(path) -> list[str | list[int]]:
    """JSONL: one object per line with "prompt" (text) or "tokens" (ids); checked before any model loads."""
    prompts: list[str | list[int]] = []
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError as exc:
        raise UserError(f"cannot read prompts file '{path}': {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"prompts file '{path}' is not UTF-8 text; write it as JSONL in UTF-8") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            item = None
        tokens = item.get("tokens") if isinstance(item, dict) else None
        text = item.get("prompt") if isinstance(item, dict) else None
        if isinstance(tokens, list) and tokens and all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            prompts.append(tokens)
        elif tokens is None and isinstance(text, str) and text:
            prompts.append(text)
        else:
            raise UserError(
                f'{path}:{number} is not a JSON object with "prompt" (non-empty text) or "tokens" (a list of ids)'
            )
    if not prompts:
        raise UserError(f"prompts file '{path}' holds no prompts")
    return prompts


def tokenized(prompts: list[str | list[int]], tokenizer, vocab: int, path) -> list[list[int]]:
    """The prompts as token ids of this model, refusing an id outside its vocabulary."""
    out = [tokenizer.encode(p) if isinstance(p, str) else p for p in prompts]
    for number, tokens in enumerate(out, 1):
        bad = next((t for t in tokens if not 0 <= t < vocab), None)
        if bad is not None or not tokens:
            raise UserError(f"prompt {number} of '{path}' holds {bad!r}, not a token id of this model (0..{vocab - 1})")
    return out


DRAFTER_OPTIONS = [
    click.option("--model", default=None, help="Target [default: embedded target]."),
    click.option("--draft", default=None, help="Draft [default: embedded draft with the embedded target]."),
    click.option("--medusa", "medusa_path", default=None, help="Medusa heads [default: embedded heads, if shipped]."),
    click.option("--eagle", "eagle_path", default=None, help="EAGLE head [default: the embedded head, if shipped]."),
    click.option(
        "--mtp",
        "mtp_source",
        is_flag=False,
        flag_value="<model>",
        default=None,
        help="The native MTP head (as generate).",
    ),
    click.option(
        "--dflash",
        "dflash_path",
        is_flag=False,
        flag_value="<embedded>",
        default=None,
        help="A DFlash drafter (PATH_OR_REPO; alone, the embedded one): adds dflash chains and DDTree rows "
        "[default: the embedded drafter, if shipped, with the embedded target].",
    ),
    click.option(
        "--widen",
        default=None,
        help="Bench a function-preserving widening of the target, LAYERSxWIDTH (e.g. 24x768): the same logits at the "
        "memory traffic of a bigger model.",
    ),
    click.option(
        "--kernel",
        type=click.Choice(["auto", "on", "off"]),
        default="auto",
        show_default=True,
        help="The verify kernel for every mlxspec mode; a 'no-draft, kernel off' row then shows the kernel's share.",
    ),
]
MODE_OPTIONS = [
    click.option(
        "--modes",
        default="mlx-lm,plain,draft,adaptive,tree,lookup,medusa,eagle,dflash",
        show_default=True,
        help="Mode families to run.",
    ),
    click.option(
        "-k",
        "--num-draft",
        "num_drafts",
        type=click.IntRange(1, 64),
        multiple=True,
        help="Draft lengths, repeatable [2 4 6; lookup 4 8].",
    ),
    click.option("--temp", "temps", type=float, multiple=True, help="Temperature(s) [0 and 0.7]."),
    click.option("--top-p", type=float, default=1.0, show_default=True),
    click.option(
        "--residual",
        is_flag=True,
        help="Also run each sampled chain mode under Leviathan/Chen acceptance ('... acceptance=residual' rows), "
        "to compare it with the default coupled rule.",
    ),
    click.option(
        "--only",
        default=None,
        help="Run only these modes, comma-separated as the table names them, the first the baseline "
        "(e.g. 'mlxspec plain,mlxspec lookup k=auto').",
    ),
]
WORKLOAD_OPTIONS = [
    click.option("--prompts", "prompts_file", default=None, help="JSONL prompts [default: held-out stdlib files]."),
    click.option("--num-prompts", type=click.IntRange(min=1), default=8, show_default=True),
    click.option("--prompt-tokens", type=click.IntRange(min=1), default=128, show_default=True),
    click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True),
    click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True),
]
OUTPUT_OPTIONS = [
    click.option("--verify-curve", is_flag=True, help="The v(n) curve and stop (as `bench verify-cost`)."),
    click.option(
        "--profile",
        is_flag=True,
        help="Also report the per-step time split of plain decoding and each drafter at the largest -k.",
    ),
    click.option("--json", "json_out", default=None, help="Also write the results to this JSON file."),
    click.option("--plot", "plot_path", default=None, help="Also draw speedup vs k and tok/s per mode to a PNG."),
]


@click.group(invoke_without_command=True)
@with_options(DRAFTER_OPTIONS, MODE_OPTIONS, WORKLOAD_OPTIONS, OUTPUT_OPTIONS)
@click.pass_context
def bench(ctx: click.Context, **p) -> None:
    """Compare plain decoding, mlx-lm's speculative decoding and mlxspec's modes on the same prompts; or, with a
    subcommand, benchmark a server, an agent loop, the verification cost, acceptance by depth or the planner."""
    if ctx.invoked_subcommand is not None:
        given = [name for name in p if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)]
        if given:
            flag = next(o for o in ctx.command.params if o.name == given[0]).opts[-1]
            raise UserError(
                f"{flag} belongs to `mlxspec bench` itself; put the options of `bench {ctx.invoked_subcommand}` "
                "after its name (see its --help)"
            )
        return
    families = {m.strip() for m in p["modes"].split(",") if m.strip()}
    unknown = sorted(families - set(BENCH_MODES))
    if unknown or not families:
        what = unknown[0] if unknown else repr(p["modes"])
        raise UserError(f"--modes {what} is not a mode; choose from {','.join(BENCH_MODES)}")
    texts = read_prompts(p["prompts_file"]) if p["prompts_file"] else None
    for flag, path in (("--json", p["json_out"]), ("--plot", p["plot_path"])):
        if path is not None:
            check_writable(flag, path)  # before the benchmark runs, so no results are lost at the end
    if p["plot_path"]:
        require_matplotlib()
    from mlxspec.bench import runner
    from mlxspec.decoding.costs import verify_cost_line
    from mlxspec.platform import fast_blas_hint

    num_drafts = p["num_drafts"] or (2, 4, 6)
    speculator, medusa, eagle, dflash = load_contenders(p, max(num_drafts))
    if fast_blas_hint():
        click.echo(fast_blas_hint(), err=True)
    if p["verify_curve"]:  # the same as `bench verify-cost`: measured and reported, never stored
        from mlxspec.bench.verify_cost import VerifyCostConfig, run_verify_cost

        target = str(speculator.target.path) if p["model"] else None
        draft = str(speculator.draft.path) if speculator.draft is not None else None
        run_verify_cost(VerifyCostConfig(target, draft, kernel=p["kernel"]), echo=click.echo)
        return
    click.echo(verify_cost_line(speculator.target, speculator.draft, max(num_drafts) + 1, kernel=p["kernel"]))
    if speculator.draft is None and medusa is None and eagle is None and dflash is None and "lookup" not in families:
        raise UserError("bench compares drafters; pass --draft, --medusa, --eagle or --dflash, or run --modes lookup")
    prompts = (
        tokenized(texts, speculator.tokenizer, speculator.vocab_size, p["prompts_file"])
        if texts
        else runner.heldout_prompts(speculator.tokenizer, p["num_prompts"], p["prompt_tokens"])
    )
    run_and_report(p, speculator, (medusa, eagle, dflash), families, tuple(num_drafts), prompts)


def load_contenders(p: dict, max_draft: int) -> tuple:
    """(the Speculator with the target and its draft model, one with Medusa heads, one with a feature head, one
    with a DFlash drafter; each None when absent), the embedded ones by default with the embedded target, all on
    the widened target with --widen."""
    from mlxspec.api import load
    from mlxspec.bench import runner
    from mlxspec.loading import MODELS_DIR
    from mlxspec.speculator import Speculator

    model, medusa_path, eagle_path, mtp_source = p["model"], p["medusa_path"], p["eagle_path"], p["mtp_source"]
    widen_spec = None
    if p["widen"]:
        from mlxspec.bench.widen import WidenSpec

        widen_spec = WidenSpec.parse(p["widen"])
    if medusa_path is None and model is None and (MODELS_DIR / "medusa" / "medusa_config.json").exists():
        medusa_path = str(MODELS_DIR / "medusa")  # widened with the target below: its function is preserved too
    if eagle_path is None and mtp_source is None and model is None and (MODELS_DIR / "eagle").exists():
        eagle_path = str(MODELS_DIR / "eagle")  # widened with the target below: its function is preserved too
    # The embedded draft with the embedded target; otherwise only what was passed (no default prompt lookup).
    speculator = load(model, p["draft"] or ("auto" if model is None else None), num_draft=max_draft)
    speculator.options = speculator.options.updated(kernel=p["kernel"]).validate()
    original = speculator.target  # heads are checked against the target they were trained on
    if widen_spec is not None:  # the target first: a spec that cannot hold it is named as given
        # A new Speculator, not a swapped attribute: its drafting provider must time the widened target's cost curve
        # (with the old one kept there, -k auto chose lengths from the embedded target's curve).
        widened = runner.widened_target(speculator.target, widen_spec)
        speculator = Speculator(widened, speculator.draft, options=speculator.options)
        click.echo(f"# target: {speculator.target.path.name}, {runner.parameter_count(speculator.target)}")
    head = None
    if mtp_source:
        from mlxspec.drafting.heads.mtp_weights import load_mtp_head

        head = load_mtp_head(original, None if mtp_source == "<model>" else mtp_source)
    elif eagle_path:
        from mlxspec.drafting.eagle3.files import load_eagle_head
        from mlxspec.drafting.eagle3.model import Eagle3Head

        head = load_eagle_head(eagle_path, original)
        if widen_spec is not None and isinstance(head, Eagle3Head):
            raise UserError("an EAGLE-3 head is not widened with the target yet; drop --widen or --eagle")
        if widen_spec is not None:
            from mlxspec.bench.widen import widen_head

            head = widen_head(head, widen_spec)
    medusa = None
    if medusa_path:
        from mlxspec.drafting.heads.medusa import load_medusa

        heads = load_medusa(medusa_path, original.path)
        if widen_spec is not None:
            from mlxspec.bench.widen import widen_medusa

            heads = widen_medusa(heads, widen_spec)
        medusa = Speculator(speculator.target, None, medusa=heads, options=speculator.options)
    eagle = Speculator(speculator.target, None, feature_head=head, options=speculator.options) if head else None
    return speculator, medusa, eagle, load_dflash_contender(p, speculator, original, widen_spec)


def load_dflash_contender(p: dict, speculator, original, widen_spec):
    """The Speculator drafting with --dflash (the embedded drafter by default with the embedded target), on the
    widened target with a widened drafter under --widen; None without one."""
    from mlxspec.loading import MODELS_DIR
    from mlxspec.speculator import Speculator

    source = p["dflash_path"]
    if source == "<embedded>" or (source is None and p["model"] is None):
        source = MODELS_DIR / "dflash" if (MODELS_DIR / "dflash" / "config.json").exists() else None
        if source is None and p["dflash_path"]:
            raise UserError("no DFlash drafter is shipped with this install; pass --dflash PATH_OR_REPO")
    if source is None:
        return None
    from mlxspec.drafting.dflash.files import load_dflash

    drafter = load_dflash(source, original)  # checked against the target it was made for
    if widen_spec is not None:
        from mlxspec.bench.widen import widen_dflash

        drafter = widen_dflash(drafter, widen_spec, widen_spec.layers)
    return Speculator(speculator.target, None, dflash=drafter, options=speculator.options)


def run_and_report(
    p: dict, speculator, contenders: tuple, families: set[str], num_drafts: tuple[int, ...], prompts: list[list[int]]
) -> None:
    """Every mode at every temperature, printed as tables; --json, --plot and --profile as asked."""
    import mlx.core as mx

    from mlxspec.bench import runner
    from mlxspec.platform import blas_in_use

    lookup_ks = tuple(p["num_drafts"]) or (4, 8)  # -k reaches lookup too; without it, lookup's own lengths
    medusa, eagle, dflash = contenders
    mode_fns = runner.build_modes(
        speculator, num_drafts, families, medusa, eagle=eagle, lookup_ks=lookup_ks, dflash=dflash
    )
    if p.get("residual"):
        mode_fns = runner.with_residual_twins(mode_fns)
    if p.get("only"):  # a shorter run: these modes, by the names the table prints, in this order
        names = [w.strip() for w in p["only"].split(",") if w.strip()]
        unknown = next((name for name in names if name not in mode_fns), None)
        if unknown is not None or not names:
            raise UserError(f"--only names {unknown!r}, which is not a mode here; choose from {', '.join(mode_fns)}")
        mode_fns = {name: mode_fns[name] for name in names}
    max_tokens, everything, by_temp = p["max_tokens"], {}, {}
    timeout = os.environ.get("OPENBLAS_THREAD_TIMEOUT")
    click.echo(
        f"# {len(prompts)} prompts x {max_tokens} tokens, median of {p['repeats']} passes that each run every mode "
        f"in turn; speedup is the median within-pass ratio to the first mode, 'vs own' to mlxspec's own plain "
        f"decoding; {blas_in_use()} BLAS"
        + (f" (OPENBLAS_THREAD_TIMEOUT={timeout})" if timeout else "")
        + f", device {mx.default_device()}"
    )
    top_p = p["top_p"]
    for temp in p["temps"] or (0.0, 0.7):
        click.echo(f"\n## temperature {temp}" + (f", top-p {top_p}" if top_p < 1 else ""))
        results = runner.run_modes(
            mode_fns, prompts, max_tokens, temp, top_p, p["repeats"], progress=lambda s: click.echo(f"  {s}", err=True)
        )
        click.echo(runner.format_table(results))
        if note := runner.noise_note(results, p["repeats"]):
            click.echo(note)
        by_temp[str(temp)] = results
        everything[str(temp)] = [runner.asdict(r) for r in results]
        if p["profile"]:
            everything.update(profile_splits(speculator, eagle, dflash, prompts, num_drafts, max_tokens, temp))
    if p["json_out"]:
        with open(p["json_out"], "w") as f:
            summary = {"prompts": len(prompts), "max_tokens": max_tokens, "blas": blas_in_use(), "results": everything}
            json.dump(summary, f, indent=1)
    if p["plot_path"]:
        from mlxspec.bench.plot import plot

        plot(by_temp, p["plot_path"])


for _command in SUBCOMMANDS:
    bench.add_command(_command)


def profile_splits(speculator, eagle, dflash, prompts, num_drafts, max_tokens, temp) -> dict:
    """--profile: the per-step time split of plain decoding and of each drafter here at the largest -k, printed
    and returned for --json."""
    from mlxspec.bench.profile import profile_split
    from mlxspec.speculator import Speculator

    plain = Speculator(speculator.target, None, options=speculator.options)
    found = {}
    for kind, profiled in (("plain", plain), ("draft", speculator), ("eagle", eagle), ("dflash", dflash)):
        if profiled is None or (kind == "draft" and speculator.draft is None):
            continue
        k = 0 if kind == "plain" else max(num_drafts)
        if kind == "dflash":
            k = min(k, dflash.dflash.config.block_size - 1)
        split = profile_split(profiled, prompts[:2], max_tokens, k, temp)
        per_step = split.pop("tokens")
        total = sum(split.values())
        click.echo(
            f"per-step split, {kind} k={k} (profiling adds syncs; {per_step:.2f} tokens per step, "
            f"{1e3 * total / per_step:.1f} ms per token): "
            + ", ".join(f"{phase} {1e3 * sec:.2f} ms ({100 * sec / total:.0f}%)" for phase, sec in split.items())
        )
        found[f"profile {temp}" if kind == "draft" else f"profile {kind} {temp}"] = {**split, "tokens": per_step}
    return found
