"""The `mlxspec` command line: the group, one-line errors, and `generate`. plan and bench live in cli_tools.py,
train-heads and train-medusa in train_command.py."""

from __future__ import annotations

import os
import sys

import click

from .cli_options import MODEL_OPTIONS, SAMPLING_OPTIONS, with_options
from .errors import UserError
from .platform import reexec_with_openblas
from .rank_split import MODES

__all__ = ["cli", "main", "reexec_with_openblas"]


def _fail(message: str, status: int = 2) -> None:
    # One line: a multi-line message (e.g. a plan) is folded, so a script reading stderr gets one record.
    click.echo(f"mlxspec: error: {' '.join(str(message).split())}", err=True)
    sys.exit(status)


class Group(click.Group):
    """Every UserError, from any command, becomes one line on stderr and exit status 2."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except UserError as exc:
            _fail(str(exc))


@click.group(cls=Group)
@click.version_option(package_name="mlxspec")
def cli() -> None:
    """Exact speculative decoding on MLX."""


def _quiet_stdout() -> None:
    """After a failed write (a full disk, a closed pipe), point stdout at /dev/null so Python's exit-time flush
    does not print a second error."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> None:
    """Run the command line: usage errors and UserErrors print one line and exit 2; Ctrl-C exits 130."""
    argv = sys.argv if argv is None else argv
    reexec_with_openblas(argv)
    try:
        cli.main(args=argv[1:], prog_name="mlxspec", standalone_mode=False)
        sys.stdout.flush()
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help())
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx else "mlxspec"
        _fail(f"{exc.format_message()} (see `{command} --help`)")
    except click.ClickException as exc:
        _fail(exc.format_message(), exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        click.echo("", err=True)
        sys.exit(130)
    except BrokenPipeError:
        _quiet_stdout()
        sys.exit(0)  # `mlxspec generate ... | head`: the reader has what it wanted
    except OSError as exc:
        if exc.errno is None:
            raise
        _quiet_stdout()
        _fail(f"cannot write the output: {exc.strerror}")
    except UserError as exc:
        _fail(str(exc))
    except RuntimeError as exc:
        if "[ring]" not in str(exc) and "peer" not in str(exc):
            raise
        _fail(f"another distributed rank stopped ({exc}); this rank stops too", 1)


def format_stats(stats) -> str:
    tree = f"tree_nodes={stats.tree_nodes} " if stats.tree_nodes else ""
    return (
        f"mode={stats.mode.replace(' ', '-')} k={stats.num_draft} seed={stats.seed} "
        f"alpha={stats.acceptance_rate:.2f} tau={stats.tokens_per_target_call:.2f} "
        f"gen={stats.tokens_per_second:.1f} tok/s prompt={stats.prompt_tokens_per_second:.1f} tok/s "
        f"tokens={stats.generated_tokens} target_calls={stats.target_calls} {tree}"
        f"kernel={stats.kernel.split(' ')[0].rstrip(':') or 'off'} "
        f"peak={stats.peak_memory_bytes / 2**20:.1f} MiB"
    )


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


@cli.command()
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
def generate(prompt: str, **params) -> None:
    """Continue PROMPT ('-' reads stdin), streaming text as the target accepts it."""
    from .generate_command import run_generate

    text, note = read_prompt(prompt)
    if note:
        click.echo(f"mlxspec: {note}", err=True)
    run_generate(text, params, echo=click.echo)


def _register_tools() -> None:
    from . import cli_tools, serve_command, train_command

    for command in (
        cli_tools.plan,
        cli_tools.bench,
        train_command.train_heads,
        train_command.train_medusa,
        serve_command.serve,
        serve_command.chat,
    ):
        cli.add_command(command)


_register_tools()

if __name__ == "__main__":
    main()
