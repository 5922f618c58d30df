"""`mlxspec bench agent-loop`: an agent-loop workload for prompt lookup and the shared suffix cache.

Each turn's prompt is the opening of a held-out stdlib file, a few lines longer than the turn before (the agent
accepted some lines and resends the file); the model continues it greedily. What it writes mostly repeats what it
wrote the turn before, one turn further on: text in no prompt, which prompt lookup cannot see and the suffix cache
(earlier outputs, shared across requests) can. Several files' loops are interleaved, as agents share a server.
Every configuration runs the same turns in one process, each with a fresh Speculator (an empty suffix cache), and
must write plain decoding's text (greedy: exact).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice

from mlxspec.bench.steps import Steps, heldout_files, machine

CONFIGS = {  # name -> DecodeOptions changes (greedy, no EOS stop, so every configuration writes the same tokens)
    "no draft": dict(use_draft=False),
    "lookup": dict(use_draft=False, lookup=True),
    "lookup + suffix cache": dict(use_draft=False, lookup=True, suffix=True),
    "draft model": dict(),
    "draft model + lookup + suffix cache": dict(lookup=True, suffix=True),
}


@dataclass
class AgentLoopConfig:
    model: str | None = None
    draft: str | None = None
    files: int = 3
    rounds: int = 8
    first_lines: int = 12
    lines_per_turn: int = 3
    max_tokens: int = 96
    num_draft: int | str = "auto"  # a fixed k drafts whatever this machine's cost curve says


def file_openings(count: int, min_lines: int) -> list[list[str]]:
    """The lines of `count` held-out stdlib files with at least `min_lines` lines."""
    return list(islice((lines for lines in heldout_files() if len(lines) >= min_lines), count))


def turns(config: AgentLoopConfig) -> list[str]:
    """The loops' prompts in the order they reach the server: round by round, file by file."""
    step, first = config.lines_per_turn, config.first_lines
    openings = file_openings(config.files, first + step * config.rounds)
    return ["".join(lines[: first + step * r]) for r in range(config.rounds) for lines in openings]


def run_config(config: AgentLoopConfig, load: Callable, name: str, changes: dict, prompts: list[str]):
    """One configuration over every turn, with a fresh Speculator from `load` (mlxspec.load): (its row, its texts)."""
    from mlxspec.options import DecodeOptions

    spec = load(config.model, draft=config.draft) if config.model else load()
    options = DecodeOptions(max_tokens=config.max_tokens, temperature=0.0, stop_at_eos=False, **changes)
    options = options.updated(num_draft=config.num_draft)
    spec.generate("import os\n", options.updated(max_tokens=8, suffix=False))  # warm-up; kept out of the index
    texts, tokens, seconds, drafted, accepted, calls = [], 0, 0.0, 0, 0, 0
    wall = time.perf_counter()
    for prompt in prompts:
        result = spec.generate(prompt, options)
        texts.append(result.text)
        tokens += result.stats.generated_tokens
        seconds += result.stats.generation_seconds
        drafted, accepted = drafted + result.stats.drafted, accepted + result.stats.accepted
        calls += result.stats.target_calls
    wall = time.perf_counter() - wall
    row = {
        "config": name,
        "options": changes,
        "tokens": tokens,
        "decode_tok_s": round(tokens / seconds, 1) if seconds else 0.0,
        "wall_tok_s": round(tokens / wall, 1),
        "alpha": round(accepted / drafted, 3) if drafted else 0.0,
        "tau": round(tokens / calls, 2) if calls else 0.0,
        "drafted": drafted,
        "accepted": accepted,
    }
    return row, texts


def run_agent_loop(config: AgentLoopConfig, load: Callable, echo: Callable = print) -> dict:
    """Every configuration over the same turns, each Speculator from `load` (mlxspec.load, passed in: the API sits
    above this floor); the report, also printed row by row through `echo`."""
    from mlxspec.loading import DEFAULT_DRAFT

    prompts = turns(config)
    if config.model and not config.draft:
        config.draft = str(DEFAULT_DRAFT)  # a target of the user's own still gets the embedded draft's rows
    report = {"machine": machine(), "requests": len(prompts), "rows": []}
    steps = Steps(len(CONFIGS), f"bench agent-loop, {len(prompts)} turns each")
    reference = None
    for name, changes in CONFIGS.items():
        row, texts = run_config(config, load, name, changes, prompts)
        reference = reference or texts
        row["exact"] = texts == reference  # greedy: every configuration writes plain decoding's text
        report["rows"].append(row)
        echo(
            f"{name:38s} {row['decode_tok_s']:7.1f} tok/s decoding ({row['wall_tok_s']:6.1f} with prefill)  "
            f"alpha {row['alpha']:.2f}  tau {row['tau']:.2f}  exact {row['exact']}"
        )
        steps.done(name)
    return report
