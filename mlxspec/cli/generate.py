"""`mlxspec generate` behind its click options: refuse contradictions, build DecodeOptions, plan against a memory
budget, load, and print text, JSON or stats."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

import click

from mlxspec.cli.options import MODEL_OPTIONS, SAMPLING_OPTIONS, logit_bias_from, with_options
from mlxspec.errors import UserError
from mlxspec.options import DecodeOptions
from mlxspec.plan.rank_split import MODES


def drafters_given(p: dict) -> list[str]:
    """The drafters named on the command line, as the flags that named them."""
    flags = (
        ("--draft", "draft"),
        ("--medusa", "medusa_path"),
        ("--eagle", "eagle_path"),
        ("--mtp", "mtp_source"),
        ("--dflash", "dflash_path"),
    )
    return [f"{flag} {p[key]}" if p[key] != "<model>" else flag for flag, key in flags if p.get(key)]


def check_contradictions(p: dict) -> None:
    """Flags that contradict each other, or do nothing without another, are refused instead of ignored."""
    given = drafters_given(p)
    if p["no_draft"] and given:
        raise UserError(f"--no-draft contradicts {given[0]}; pass one of them")
    if len(given) > 1:
        raise UserError(f"{given[0].split()[0]} and {given[1].split()[0]} are two drafters; pass one of them")
    heads = p["medusa_path"] or p.get("eagle_path") or p.get("mtp_source") or p.get("dflash_path")
    if p.get("mtp_bits") and not p.get("mtp_source"):
        raise UserError(f"--mtp-bits {p['mtp_bits']} quantizes an MTP head, and this run has none; pass --mtp too")
    if p["draft_bits"] and (p["no_draft"] or heads):
        raise UserError(f"--draft-bits {p['draft_bits']} quantizes a draft model, and this run has none")
    if p.get("draft_vocab") and (p["no_draft"] or heads):
        raise UserError(f"--draft-vocab {p['draft_vocab']} cuts a draft model's output layer, and this run has none")
    if p["memory_budget"] is not None:  # an empty value is refused by name, not ignored
        from mlxspec.plan.devices import parse_size

        parse_size(p["memory_budget"])
    if p.get("distributed") and p["memory_budget"]:
        raise UserError(
            f"--memory-budget plans one machine; for --distributed {p['distributed']} plan each rank with "
            "`mlxspec plan --ranks N` and drop --memory-budget"
        )
    if p["auto"] and not p["memory_budget"]:
        raise UserError("--auto applies the planner's fix for --memory-budget; pass --memory-budget too (e.g. 8GB)")
    if p["lookup_candidates"] is not None and not (p["lookup"] or p.get("suffix")):
        raise UserError(f"--lookup-candidates {p['lookup_candidates']} needs --lookup")
    if p["no_corpus_fallback"] and not (p["lookup"] or p.get("suffix")):
        raise UserError("--no-corpus-fallback needs --lookup")
    tree = "--tree-topk" if (p.get("tree_topk") or 1) > 1 else "--tree-nodes" if p.get("tree_nodes") else None
    if p["no_draft"] and tree:
        raise UserError(f"{tree} drafts a tree from a draft model or heads, and --no-draft leaves none; drop one")


def options_from(p: dict) -> DecodeOptions:
    return DecodeOptions(
        max_tokens=p["max_tokens"],
        stop=list(p["stop"]),
        temperature=p["temp"],
        top_p=p["top_p"],
        top_k=p["top_k"],
        min_p=p["min_p"],
        seed=p["seed"],
        acceptance=p.get("acceptance") or "auto",
        repetition_penalty=p.get("repetition_penalty"),
        repetition_context_size=p.get("repetition_context_size", 20),
        presence_penalty=p.get("presence_penalty"),
        frequency_penalty=p.get("frequency_penalty"),
        presence_context_size=p.get("penalty_context_size", 20),
        frequency_context_size=p.get("penalty_context_size", 20),
        logit_bias=logit_bias_from(p.get("logit_bias") or ()),
        xtc_probability=p.get("xtc_probability", 0.0),
        xtc_threshold=p.get("xtc_threshold", 0.1),
        chat=p.get("chat", False),
        heal=p.get("heal", False),
        truncate=p.get("truncate", False),
        num_draft=p["num_draft"] or "auto",
        tree_topk=p["tree_topk"],
        tree_nodes=p["tree_nodes"],
        lookup=p["lookup"] or p.get("suffix", False),
        suffix=p.get("suffix", False),
        lookup_candidates=p["lookup_candidates"] or 1,
        corpus_fallback=not p["no_corpus_fallback"],
        kv_bits=int(p["kv_bits"]) if p["kv_bits"] else None,
        kernel=p["kernel"],
        draft_window=p["draft_window"],
    )


def load_speculator(p: dict, options: DecodeOptions, prompt_chars: int, echo: Callable, prompt_cache: int = 0):
    """The Speculator the command-line options ask for (generate, chat and serve; each has refused contradictory
    flags first, with check_contradictions): a stored tune applied where nothing is set by hand, planned against
    --memory-budget for prompt_chars + max_tokens, then loaded."""
    speculator, _, notes = load_tuned_speculator(p, options, prompt_chars, echo, prompt_cache)
    for note in notes:
        echo(f"mlxspec: {note}", err=True)
    return speculator


def load_tuned_speculator(p: dict, options: DecodeOptions, prompt_chars: int, echo: Callable, prompt_cache: int = 0):
    """load_speculator's (Speculator, the tune it follows or None, what chose the drafter). The notes are printed
    once generation starts, so a prompt refused after loading still gets its one line alone."""
    from mlxspec.cli.tune import apply_tuned

    p, options, tuned, line = apply_tuned(p, options, bool(drafters_given(p)))
    speculator = _load(p, options, prompt_chars, echo, prompt_cache)
    notes = [line] if line else []
    if speculator.cross_tokenizer:  # a draft with another tokenizer: say how it drafts, once
        notes.append(speculator.cross_tokenizer)
    if tuned is not None and speculator.drafter_choice is None:  # --json says who chose: the stored tune
        chosen = {**tuned["choice"], "by": "mlxspec tune"}
        speculator.drafter_choice = {"line": tuned["line"], "chosen": chosen, "considered": 0, "passed_over": []}
    choice = speculator.drafter_choice if speculator.reports and tuned is None else None
    # Nothing fits: lookup, as before, said with -v (and in --json), not on every run.
    if choice is not None and (choice["chosen"] is not None or p.get("verbose")):
        notes.append(f"{choice['line']}; `mlxspec drafters` lists what was considered")
    return speculator, tuned, notes


def _load(p: dict, options: DecodeOptions, prompt_chars: int, echo: Callable, prompt_cache: int):
    from mlxspec.api import SlowBLASWarning, load
    from mlxspec.cli.options import MTP_IN_MODEL
    from mlxspec.kernels.verify import KernelMissingWarning
    from mlxspec.loading import DEFAULT_DRAFT, DEFAULT_TARGET

    model, draft = p["model"], p["draft"]
    heads = p["medusa_path"] or p.get("eagle_path") or p.get("mtp_source") or p.get("dflash_path")
    draft_arg = None if (p["no_draft"] or heads) else (draft or "auto")
    settings = {
        "quantize_target": int(p["quantize_target"]) if p["quantize_target"] else None,
        "draft_bits": int(p["draft_bits"]) if p["draft_bits"] else None,
        "draft_vocab": p.get("draft_vocab"),
        "kv_bits": options.kv_bits,
        "draft_window": options.draft_window,
    }
    if p["memory_budget"]:
        from mlxspec.plan.budget import fit_to_budget

        planned_draft = draft or (str(DEFAULT_DRAFT) if model is None and draft_arg == "auto" else None)
        settings = fit_to_budget(
            str(DEFAULT_TARGET if model is None else model),
            planned_draft,
            p["memory_budget"],
            prompt_chars,
            options.max_tokens,
            options.depth,
            settings,
            p["auto"],
            report=lambda line: echo(line, err=True),
        )
    # The plan may have changed the KV bits or the draft window: they travel on in the options, once.
    options = options.updated(kv_bits=settings.pop("kv_bits"), draft_window=settings.pop("draft_window"))
    import warnings

    warnings.simplefilter("ignore", SlowBLASWarning)  # the CLI says these its own way, in report()
    warnings.simplefilter("ignore", KernelMissingWarning)
    speculator = load(
        model,
        draft_arg,
        medusa=p["medusa_path"],
        eagle=p.get("eagle_path"),
        mtp=True if p.get("mtp_source") == MTP_IN_MODEL else p.get("mtp_source"),
        dflash=p.get("dflash_path"),
        mtp_bits=int(p["mtp_bits"]) if p.get("mtp_bits") else None,
        options=options,
        prompt_cache=prompt_cache,
        distributed=p.get("distributed"),
        **settings,
    )
    speculator.truncate_hint = "--truncate"
    return speculator


def quiet(*args, **kwargs) -> None:
    """What ranks other than 0 print: nothing (rank 0 alone prints and reports)."""


def run_generate(prompt: str, p: dict, echo: Callable) -> None:
    check_contradictions(p)
    options = options_from(p).validate()
    speculator, tuned, notes = load_tuned_speculator(p, options, len(prompt), echo)
    if not speculator.reports:
        echo, notes = quiet, []
    if p.get("check_exact"):
        check_exact(speculator, echo)
    if p["as_json"]:
        result = speculator.generate(prompt)
        stats = result.stats
        for note in notes:
            echo(f"mlxspec: {note}", err=True)
        echo(
            json.dumps(
                {
                    "tokens": result.tokens,
                    "text": result.text,
                    "finish_reason": result.finish_reason,
                    "seed": stats.seed,
                    "mode": stats.mode,
                    "num_draft": stats.num_draft,
                    "model": str(speculator.target.path),
                    "draft": str(speculator.draft.path) if speculator.draft is not None else None,
                    "drafter_choice": speculator.drafter_choice,
                    "stats": stats.to_dict(),
                }
            )
        )
        report_truncation(stats, echo)
    else:
        for number, chunk in enumerate(speculator.stream(prompt)):
            if number == 0:  # said before the text, not after it on a terminal
                for note in notes:
                    echo(f"mlxspec: {note}", err=True)
                report_truncation(speculator.last_stats, echo)
            echo(chunk.text, nl=False)
        echo()
        stats = speculator.last_stats
    report(stats, p["verbose"], echo)
    if tuned is not None and stats.generation_seconds > 0:
        from mlxspec.bench.tune import drop_if_slower

        note = drop_if_slower(
            tuned["key"], tuned["regime"], stats.generated_tokens, stats.generated_tokens / stats.generation_seconds
        )
        if note:
            echo(f"mlxspec: {note}", err=True)


def check_exact(speculator, echo: Callable) -> None:
    """--check-exact: the exactness probe first; a difference that is no near-tie stops the run (exit 1)."""
    from mlxspec.bench.exactness import probe

    result = probe(speculator)
    echo(f"mlxspec: {result.line}", err=True)
    if result.verdict == "mismatch":
        sys.exit(1)


def report_truncation(stats, echo: Callable) -> None:
    if stats.prompt_truncated_from:
        echo(
            f"mlxspec: --truncate kept the last {stats.prompt_tokens} of {stats.prompt_truncated_from} prompt tokens",
            err=True,
        )


def report(stats, verbose: bool, echo: Callable) -> None:
    """The notes a user must see (a fallback to plain decoding, a full context) and, with -v, the stats line."""
    from mlxspec.platform import fast_blas_hint

    if stats.kernel.startswith("unavailable"):
        echo(f"mlxspec: running without the verify kernel: {stats.kernel.removeprefix('unavailable: ')}", err=True)
    if stats.note:
        echo(f"mlxspec: {stats.note}", err=True)
        hint = fast_blas_hint() if "decoding plainly" in stats.note else None
        if hint:
            echo(hint, err=True)
    if stats.generated_tokens == 0 and stats.target_calls:
        echo("mlxspec: the model ended the text at once (its first token was end-of-text); nothing to show", err=True)
    if verbose:
        echo(stats.line(), err=True)


def read_prompt(prompt: str) -> tuple[str, str | None]:
    """The prompt text ('-' reads stdin as bytes) and a note when invalid UTF-8 had to be replaced."""
    if prompt == "-":
        raw = sys.stdin.buffer.read()
    else:
        raw = os.fsencode(prompt)  # argv bytes that were not UTF-8 arrive as lone surrogates
    text = raw.decode("utf-8", errors="replace")
    bad = text.count("\ufffd") - raw.decode("utf-8", errors="ignore").count("\ufffd")
    note = f"the prompt is not valid UTF-8; {bad} invalid byte sequence(s) were replaced with U+FFFD" if bad else None
    return text, note


@click.command()
@click.argument("prompt")
@with_options(MODEL_OPTIONS, SAMPLING_OPTIONS)
@click.option("--chat", is_flag=True, help="Apply the tokenizer's chat template.")
@click.option("--heal", is_flag=True, help="Token healing: let the first token re-complete the prompt's last one.")
@click.option(
    "--truncate", is_flag=True, help="Keep the prompt's last tokens that fit the context instead of refusing."
)
@click.option(
    "--distributed",
    type=click.Choice(MODES),
    default=None,
    help="Under mlx.launch: split the target across the ranks, each layer (tensor) or by layers (pipeline); the "
    "drafter runs on every rank and rank 0 prints.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with tokens, text and stats.")
@click.option("-v", "--verbose", is_flag=True, help="Print what drafted and a stats line to stderr.")
@click.option(
    "--check-exact",
    is_flag=True,
    help="First compare greedy speculative output with plain decoding on this machine (a near-tie is reported with "
    "its logit gap; any other difference stops the run).",
)
def generate(prompt: str, **params) -> None:
    """Continue PROMPT ('-' reads stdin), streaming text as the target accepts it."""
    text, note = read_prompt(prompt)
    if note:
        click.echo(f"mlxspec: {note}", err=True)
    run_generate(text, params, echo=click.echo)
