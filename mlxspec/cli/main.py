"""The `mlxspec` command line: a lazy dispatcher and one-line errors. Each command lives in its own module of this
package and is imported only when it runs, so `mlxspec --help` and `mlxspec plan` never import MLX."""

from __future__ import annotations

import importlib
import os
import sys

import click

from mlxspec.errors import UserError
from mlxspec.platform import reexec_with_openblas

__all__ = ["cli", "main"]


def _fail(message: str, status: int = 2) -> None:
    # One line: a multi-line message (e.g. a plan) is folded, so a script reading stderr gets one record.
    click.echo(f"mlxspec: error: {' '.join(str(message).split())}", err=True)
    sys.exit(status)


# command name -> (module, attribute, one-line help shown by `mlxspec --help` without importing the module)
COMMANDS = {
    "generate": ("mlxspec.cli.generate", "generate", "Continue PROMPT, streaming text as the target accepts it."),
    "chat": ("mlxspec.cli.serve", "chat", "Talk to the model in the terminal (one conversation, prompt cache on)."),
    "serve": ("mlxspec.cli.serve", "serve", "An OpenAI-compatible HTTP server (/v1/completions, /v1/chat/...)."),
    "plan": ("mlxspec.cli.plan", "plan", "Will a target and its drafter fit this device? Imports no MLX."),
    "drafters": ("mlxspec.cli.drafters", "drafters", "Drafters in the local Hugging Face cache that fit a target."),
    "tune": ("mlxspec.cli.tune", "tune", "Measure every drafter on this machine; generate uses the fastest."),
    "bench": ("mlxspec.cli.bench", "bench", "Speed and acceptance of every drafting mode on held-out prompts."),
    "train-heads": ("mlxspec.cli.train", "train_heads", "Train an EAGLE feature head by self-distillation."),
    "train-medusa": ("mlxspec.cli.train", "train_medusa", "Train Medusa heads by self-distillation."),
}


class Group(click.Group):
    """Commands imported on first use; every UserError, from any command, becomes one line on stderr and exit 2."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attribute, _ = COMMANDS[name]
        return getattr(importlib.import_module(module), attribute)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, short) for name, (_, _, short) in COMMANDS.items()])

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except UserError as exc:
            _fail(str(exc))
        except BrokenPipeError:  # caught here: click's own handler around invoke would exit 1
            _quiet_stdout()
            sys.exit(0)  # `mlxspec generate ... | head`: the reader has what it wanted


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
    if sys.stderr is None:  # nowhere to say anything
        sys.exit(2)
    if sys.stdout is None:  # started with stdout closed (`>&-`)
        _fail("standard output is closed, so there is nowhere to write; redirect it (e.g. > out.txt or > /dev/null)")
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


if __name__ == "__main__":
    main()
