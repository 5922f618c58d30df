"""`mlxspec tune`: which drafter, length and tree run fastest for a target on this machine (bench/tune.py), stored
where `generate`, `serve` and `chat` use it by default; and applying a stored choice to a run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from mlxspec.errors import UserError


def kernel_name(choice: str) -> str:
    """The kernel a run with --kernel `choice` uses, as tune keys it."""
    from mlxspec.kernels.verify import resolve

    backend, _ = resolve(choice)
    return backend.name if backend is not None else "off"


def tune_key_for(model: str | None, kernel: str) -> dict[str, str]:
    import mlx.core as mx

    from mlxspec.bench.tune import tune_key
    from mlxspec.loading import DEFAULT_TARGET, resolve_model_path

    return tune_key(resolve_model_path(model or DEFAULT_TARGET), mx.__version__, kernel_name(kernel))


def read_prompts(path: str | None) -> list[str]:
    """The calibration prompts: built in, or a file (a JSON list of strings, or paragraphs split by blank lines)."""
    from mlxspec.bench.tune import CALIBRATION

    if path is None:
        return list(CALIBRATION)
    text = Path(path).read_text(errors="replace")
    try:
        prompts = json.loads(text)
    except ValueError:
        prompts = [p.strip() for p in text.split("\n\n") if p.strip()]
    if not (isinstance(prompts, list) and prompts and all(isinstance(p, str) and p for p in prompts)):
        raise UserError(f"--prompts '{path}' holds no prompts; give a JSON list of strings or blank-line paragraphs")
    return prompts


def drafter_sources(model: str | None, target, given: dict[str, str | None]) -> list[tuple[str, str]]:
    """(kind, source) of every drafter to measure: those named on the command line, the embedded ones with the
    embedded target, else every cached drafter that fits (discovery.py)."""
    from mlxspec.loading import MODELS_DIR

    sources = [(kind, source) for kind, source in given.items() if source]
    if sources:
        return sources
    if model is None:
        embedded = (("draft", "draft"), ("eagle", "eagle"), ("dflash", "dflash"), ("medusa", "medusa"))
        return [(kind, str(MODELS_DIR / name)) for kind, name in embedded if (MODELS_DIR / name).is_dir()]
    from mlxspec.drafting.discovery import find_drafters

    found = [c for c in find_drafters(target.path, model) if c.matches]
    return [(c.kind if c.kind != "eagle3" else "eagle", str(c.path)) for c in found]


def build_speculators(target, sources: list[tuple[str, str]]) -> tuple[dict, list]:
    """{source: Speculator} (None: no drafter) and every Setting to measure, plain and lookup first."""
    from mlxspec.api import Drafters, load_drafters, speculator_with
    from mlxspec.bench.tune import settings_for

    speculators = {None: speculator_with(target, Drafters())}
    settings = settings_for("plain", None) + settings_for("lookup", None)
    for kind, source in sources:
        arguments = {"eagle": "eagle", "dflash": "dflash", "medusa": "medusa", "mtp": "mtp", "draft": "draft"}
        drafters = load_drafters(
            target, **{arguments[kind]: True if kind == "mtp" and source == str(target.path) else source}
        )
        speculators[source] = speculator_with(target, drafters)
        label, depth = kind, 0
        if drafters.feature_head is not None:
            label = (
                drafters.feature_head.config.kind if drafters.feature_head.config.kind in ("eagle", "eagle3") else "mtp"
            )
        if drafters.dflash is not None:
            depth = drafters.dflash.config.block_size - 1
        if drafters.medusa is not None:
            depth = drafters.medusa.config.num_heads
        settings += settings_for(label, source, depth)
    return speculators, settings


@click.command()
@click.option("--model", default=None, help="Target: a model directory or HF repo id [default: the embedded].")
@click.option("--draft", default=None, help="Measure this draft model (instead of what is found).")
@click.option("--eagle", default=None, help="Measure this EAGLE or EAGLE-3 head.")
@click.option("--dflash", default=None, help="Measure this DFlash drafter.")
@click.option("--medusa", default=None, help="Measure these Medusa heads.")
@click.option("--prompts", default=None, type=click.Path(exists=True, dir_okay=False), help="Calibration prompts.")
@click.option("--max-tokens", default=48, show_default=True, type=click.IntRange(8, 1024), help="Per prompt.")
@click.option("--kernel", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the stored record as one JSON object.")
@click.option(
    "--remeasure",
    is_flag=True,
    help="Measure this device's cost curves again (what -k auto decides from), e.g. after a busy first run.",
)
def tune(model, draft, eagle, dflash, medusa, prompts, max_tokens, kernel, as_json, remeasure) -> None:
    """Measure every drafter this target has, greedy and sampled, and store the fastest for generate/serve/chat."""
    import warnings

    from mlxspec.api import SlowBLASWarning
    from mlxspec.bench.exactness import probe
    from mlxspec.bench.tune import REGIMES, file_identity, measure, save_tune
    from mlxspec.loading import DEFAULT_TARGET, load_model

    warnings.simplefilter("ignore", SlowBLASWarning)  # said once below, in one line, after the model loads
    if remeasure:
        from mlxspec.decoding.costs import forget_curves

        if forget_curves():
            click.echo(
                "mlxspec tune: stored cost curves dropped; each is measured again where it is next used", err=True
            )
    key = tune_key_for(model, kernel)
    target = load_model(model or DEFAULT_TARGET)
    sources = drafter_sources(model, target, {"draft": draft, "eagle": eagle, "dflash": dflash, "medusa": medusa})
    speculators, settings = build_speculators(target, sources)
    for speculator in speculators.values():
        speculator.options = speculator.options.updated(kernel=kernel)
    ids = [target.tokenizer.encode(p) for p in read_prompts(prompts)]
    say = lambda line: click.echo(f"mlxspec tune: {line}", err=True)  # noqa: E731
    from mlxspec.platform import fast_blas_hint

    if fast_blas_hint():
        click.echo(fast_blas_hint(), err=True)
    say(f"{len(settings)} settings x {len(ids)} prompts x {max_tokens} tokens, greedy and sampled")
    regimes = {}
    for name, temperature in REGIMES.items():
        regimes[name] = measure(speculators, settings, ids, max_tokens, temperature, 0.9 if temperature else 1.0, say)
    greedy = regimes["greedy"].choice
    verdict = None
    if greedy.drafter != "plain":
        verdict = probe(speculators[greedy.source], **greedy.decode_options())
        say(verdict.line)
    chosen = {r.choice.source for r in regimes.values() if r.choice.source}
    path = save_tune(key, regimes, {source: file_identity(Path(source)) for source in chosen})
    if as_json:
        record = json.loads(path.read_text())
        record["exactness"] = verdict.line if verdict else None
        click.echo(json.dumps(record))
        return
    for name, regime in regimes.items():
        click.echo(f"# {name} (T={REGIMES[name]}): tok/s, tau")
        for row in sorted(regime.rows, key=lambda r: -r["tokens_per_second"]):
            click.echo(f"{row['mode']:40s} {row['tokens_per_second']:8.1f} {row['tau']:6.2f}")
        gain = regime.choice_tokens_per_second / regime.plain_tokens_per_second
        why = f": {regime.reason}" if regime.reason else ""
        click.echo(f"choice: {regime.choice.name} ({gain:.2f}x plain){why}\n")
    click.echo(f"stored in {path}; generate, serve and chat use it unless --no-tune")


def apply_tuned(p: dict, options: Any, drafters_named: bool) -> tuple[dict, Any, dict | None, str]:
    """A stored tune applied to a run that names no drafter, length or tree: (p, options, where it came from, the
    line to print). Anything the user set by hand wins, and so does --no-tune."""
    from mlxspec.bench.tune import BadTuneRecord, any_tune_stored, load_tune, tuned_regime
    from mlxspec.cli.options import MTP_IN_MODEL

    hand_set = (
        drafters_named
        or p["no_draft"]
        or p["lookup"]
        or p.get("suffix")
        or p.get("num_draft")
        or p.get("tree_topk", 1) > 1
    )
    if p.get("no_tune") or hand_set or p.get("tree_nodes") or p.get("distributed") or not any_tune_stored():
        return p, options, None, ""
    try:
        key = tune_key_for(p["model"], options.kernel)
    except (UserError, OSError):  # a model that cannot be read: loading it names the problem
        return p, options, None, ""
    try:
        record = load_tune(key)
    except BadTuneRecord as bad:
        return p, options, None, str(bad)
    if record is None:
        return p, options, None, ""
    regime_name, regime, why_not = tuned_regime(record, options.temperature)
    if regime is None:
        return p, options, None, f"not using the tune for this machine: {why_not}"
    choice = regime.choice
    p = dict(p)
    if choice.drafter == "plain":
        p["no_draft"] = True
    elif choice.drafter == "lookup":
        p["lookup"], p["no_draft"] = True, True
    else:
        flag = {"draft": "draft", "eagle": "eagle_path", "eagle3": "eagle_path", "dflash": "dflash_path"}
        flag |= {"medusa": "medusa_path", "mtp": "mtp_source"}
        same_model = choice.drafter == "mtp" and choice.source == key["model_path"]
        p[flag[choice.drafter]] = MTP_IN_MODEL if same_model else choice.source
    if choice.drafter not in ("plain",):
        options = options.updated(**{k: v for k, v in choice.decode_options().items() if k != "use_draft"})
    gain = regime.choice_tokens_per_second / regime.plain_tokens_per_second
    line = f"tuned on this machine for {regime_name} decoding: {choice.name} ({gain:.2f}x plain); --no-tune bypasses it"
    return p, options, {"key": key, "regime": regime_name, "choice": choice.to_dict(), "line": line}, line
