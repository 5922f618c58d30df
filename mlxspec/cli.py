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
def main() -> None:
    """Exact speculative decoding on MLX."""


def format_stats(stats) -> str:
    return (f"alpha={stats.acceptance_rate:.2f} tau={stats.tokens_per_target_call:.2f} "
            f"gen={stats.tokens_per_second:.1f} tok/s prompt={stats.prompt_tokens_per_second:.1f} tok/s "
            f"tokens={stats.generated_tokens} target_calls={stats.target_calls} "
            f"peak={stats.peak_memory_bytes / 2**20:.1f} MiB")


@main.command()
@click.argument("prompt")
@click.option("--model", default=None, help="Target: an mlx-lm model directory or HF repo id [default: embedded target].")
@click.option("--draft", default=None, help="Draft model directory or repo id [default: embedded draft with the "
                                            "embedded target, none otherwise].")
@click.option("--no-draft", is_flag=True, help="Plain decoding through the same code, for comparison.")
@click.option("-k", "--num-draft", type=int, default=4, show_default=True, help="Tokens drafted per step (1-64).")
@click.option("--max-tokens", type=int, default=256, show_default=True)
@click.option("--temp", type=float, default=0.0, show_default=True, help="0 is greedy.")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--top-k", type=int, default=0, show_default=True)
@click.option("--min-p", type=float, default=0.0, show_default=True)
@click.option("--seed", type=int, default=None, help="Random seed [default: random].")
@click.option("--stop", multiple=True, help="Stop when this string appears (repeatable).")
@click.option("--quantize-target", type=click.Choice(["4", "8"]), default=None, help="Quantize the target on load.")
@click.option("--kv-bits", type=click.Choice(["4", "8"]), default=None, help="Quantize both KV caches.")
@click.option("--chat", is_flag=True, help="Apply the tokenizer's chat template.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with tokens, text and stats.")
@click.option("-v", "--verbose", is_flag=True, help="Print a stats line to stderr.")
def generate(prompt, model, draft, no_draft, num_draft, max_tokens, temp, top_p, top_k, min_p, seed, stop,
             quantize_target, kv_bits, chat, as_json, verbose) -> None:
    """Continue PROMPT ('-' reads stdin), streaming text as the target accepts it."""
    from .api import load  # deferred: `mlxspec --help` stays instant

    if prompt == "-":
        prompt = sys.stdin.read()
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little")
    speculator = load(model, None if no_draft else (draft or "auto"), num_draft=num_draft,
                      quantize_target=int(quantize_target) if quantize_target else None,
                      kv_bits=int(kv_bits) if kv_bits else None)
    kwargs = dict(max_tokens=max_tokens, temperature=temp, top_p=top_p, top_k=top_k, min_p=min_p,
                  num_draft=num_draft, seed=seed, stop=list(stop), chat=chat)
    if as_json:
        result = speculator.generate(prompt, **kwargs)
        click.echo(json.dumps({"tokens": result.tokens, "text": result.text, "finish_reason": result.finish_reason,
                               "seed": seed, "stats": result.stats.to_dict()}))
        return
    for chunk in speculator.stream(prompt, **kwargs):
        click.echo(chunk.text, nl=False)
    click.echo()
    if verbose:
        click.echo(format_stats(speculator.last_stats), err=True)


if __name__ == "__main__":
    main()
