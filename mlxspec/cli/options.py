"""Click options shared by `generate`, `chat` and `serve`: the model and its drafter, and the sampling defaults."""

from __future__ import annotations

from collections.abc import Callable

import click

from mlxspec.errors import UserError

MTP_IN_MODEL = "<model>"  # --mtp with no value: the head is in the model's own files


def num_draft_option(ctx, param, value):
    if value is None:
        return None
    from mlxspec.options import parse_num_draft

    try:
        return parse_num_draft(value)
    except UserError as exc:
        raise click.BadParameter(str(exc)) from None


MODEL_OPTIONS = [
    click.option(
        "--model",
        default=None,
        help="Target: an mlx-lm model directory, a GGUF file (converted once) or an HF repo id [default: embedded].",
    ),
    click.option(
        "--draft",
        default=None,
        help="Draft model directory or repo id [default: the embedded draft with the embedded target; prompt lookup "
        "with any other target].",
    ),
    click.option("--no-draft", is_flag=True, help="Plain decoding through the same code (no drafter at all)."),
    click.option("--no-tune", is_flag=True, help="Ignore what `mlxspec tune` stored for this model and machine."),
    click.option(
        "-k",
        "--num-draft",
        default=None,
        callback=num_draft_option,
        help="Tokens drafted per step, 1-64, or 'auto' [default: auto, adapted to acceptance and measured cost].",
    ),
    click.option("--quantize-target", type=click.Choice(["4", "8"]), default=None, help="Quantize the target on load."),
    click.option(
        "--draft-bits",
        type=click.Choice(["4", "8"]),
        default=None,
        help="Quantize the draft model on load (a quantized one re-quantized where it holds more bits).",
    ),
    click.option(
        "--draft-vocab",
        type=click.IntRange(min=1),
        default=None,
        help="Cut the draft model's output layer to its N most frequent tokens (FR-Spec); output stays exact.",
    ),
    click.option("--kv-bits", type=click.Choice(["4", "8"]), default=None, help="Quantize both KV caches."),
    click.option(
        "--kernel",
        type=click.Choice(["auto", "on", "off", "int8"]),
        default="auto",
        show_default=True,
        help="The verify kernel (reads each weight once for all verified tokens): auto uses it where built for the "
        "device. int8: activations rounded to int8 per block of 32 against 4-, 5- and 8-bit weights, as llama.cpp "
        "computes (lossy: a different model's text; see docs/benchmarks.md).",
    ),
    click.option(
        "--draft-window", type=click.IntRange(min=1), default=None, help="Cap the draft's KV cache at this many tokens."
    ),
    click.option(
        "--tree-topk",
        type=click.IntRange(min=1),
        default=1,
        show_default=True,
        help="Draft a tree: the top-k alternatives at every depth.",
    ),
    click.option(
        "--tree-nodes",
        type=click.IntRange(min=1),
        default=None,
        help="Node budget of the tree (sets its depth, at most 64).",
    ),
    click.option("--lookup", is_flag=True, help="Draft by prompt lookup; the draft model covers what does not repeat."),
    click.option(
        "--lookup-candidates",
        type=click.IntRange(min=1),
        default=None,
        help="With --lookup: verify this many distinct continuations as one tree [default: 1, a chain].",
    ),
    click.option(
        "--no-corpus-fallback", is_flag=True, help="With --lookup: no stdlib bigram guess where nothing repeats."
    ),
    click.option(
        "--suffix",
        is_flag=True,
        help="Prompt lookup that also searches earlier outputs (a suffix cache shared across requests: serve, chat); "
        "implies --lookup.",
    ),
    click.option(
        "--medusa",
        "medusa_path",
        default=None,
        help="Draft with Medusa or Hydra heads (a `train-heads --kind medusa|hydra` directory, or embedded).",
    ),
    click.option(
        "--eagle",
        "eagle_path",
        default=None,
        help="Draft with an EAGLE head: a train-heads --kind eagle directory, or an EAGLE-3 head (SafeAILab or "
        "vLLM speculators format; a directory or Hugging Face repo).",
    ),
    click.option(
        "--mtp",
        "mtp_source",
        is_flag=False,
        flag_value=MTP_IN_MODEL,
        default=None,
        help="Draft with the model's native MTP head: alone, from its own files; or from PATH_OR_REPO of the original "
        "checkpoint (mlx_lm.convert drops MTP tensors).",
    ),
    click.option(
        "--mtp-bits",
        type=click.Choice(["4", "8"]),
        default=None,
        help="Quantize the MTP head too [default: its checkpoint's precision; quantizing it lowers acceptance].",
    ),
    click.option(
        "--dflash",
        "dflash_path",
        default=None,
        help="Draft whole blocks with a DFlash drafter: PATH_OR_REPO of z-lab's, or of train-heads --kind dflash. "
        "-k sets the block (k+1 rows); --tree-topk/--tree-nodes make a DDTree of it.",
    ),
    click.option("--memory-budget", default=None, help="Plan first (e.g. 8GB) and refuse settings that cannot fit."),
    click.option("--auto", is_flag=True, help="With --memory-budget: apply the planner's top fix instead of refusing."),
]

SAMPLING_OPTIONS = [
    click.option("--max-tokens", type=click.IntRange(min=1), default=256, show_default=True),
    click.option("--temp", type=float, default=0.0, show_default=True, help="0 is greedy."),
    click.option("--top-p", type=float, default=1.0, show_default=True),
    click.option("--top-k", type=int, default=0, show_default=True),
    click.option("--min-p", type=float, default=0.0, show_default=True),
    click.option(
        "--seed",
        type=click.IntRange(0, 2**64 - 1),
        default=None,
        help="Random seed [default: random, printed by -v and --json beside the acceptance rule that ran; both "
        "together repeat the run].",
    ),
    click.option(
        "--acceptance",
        type=click.Choice(["auto", "coupled", "residual"]),
        default="auto",
        show_default=True,
        help="How sampled drafts are kept: coupled gives one text per seed whatever drafts (mlx-lm's own text for "
        "that seed); residual is Leviathan/Chen rejection, exact in law only, keeping more drafted tokens: its text "
        "for a seed depends on the draft lengths too, so it repeats with the same drafter, -k and stored cost curve "
        "(-k auto then sizes drafts by the text and that curve alone); auto is coupled with --seed and residual "
        "without (-v and --json say which ran).",
    ),
    click.option("--repetition-penalty", type=float, default=None, help="mlx-lm's multiplicative repetition penalty."),
    click.option("--repetition-context-size", type=int, default=20, show_default=True),
    click.option("--presence-penalty", type=float, default=None, help="Subtracted once from every recent token."),
    click.option("--frequency-penalty", type=float, default=None, help="Subtracted per occurrence of a recent token."),
    click.option(
        "--penalty-context-size",
        type=int,
        default=20,
        show_default=True,
        help="Tokens the presence and frequency penalties look back over.",
    ),
    click.option("--logit-bias", multiple=True, help="TOKEN_ID=BIAS added to that token's logit (repeatable)."),
    click.option("--xtc-probability", type=float, default=0.0, show_default=True, help="XTC, as mlx-lm samples."),
    click.option("--xtc-threshold", type=float, default=0.1, show_default=True),
    click.option("--stop", multiple=True, help="Stop when this string appears (repeatable)."),
]


def logit_bias_from(pairs: tuple[str, ...]) -> dict[int, float] | None:
    """--logit-bias ID=BIAS pairs -> {id: bias}; a malformed pair is refused by name."""
    bias = {}
    for pair in pairs:
        token, _, value = pair.partition("=")
        try:
            bias[int(token)] = float(value)
        except ValueError:
            raise UserError(f"--logit-bias {pair!r} is not TOKEN_ID=BIAS (e.g. --logit-bias 1234=-5)") from None
    return bias or None


def with_options(*groups: list[Callable]) -> Callable:
    """Apply option groups in the order listed (click shows them in that order in --help)."""

    def apply(command: Callable) -> Callable:
        for option in reversed([o for group in groups for o in group]):
            command = option(command)
        return command

    return apply
