"""What a generation returns: streamed chunks, the final result and its statistics."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


def mode_name(
    drafter: str, *, depth: int = 0, tree_topk: int = 1, tree_nodes: int = 0, lookup_candidates: int = 1
) -> str:
    """The one name of a decoding mode, in stats.mode, `-v`, `--json`, the server's usage, chat and bench's rows.

    `drafter` is the flag that chose it ("plain", "draft", "lookup", "medusa", "eagle", "eagle3", "mtp", "dflash",
    or "lookup+draft" for lookup backed by another drafter); a tree adds its shape. No spaces, so a key=value line
    splits on them.
    """
    if lookup_candidates > 1:
        return f"{drafter}-tree-{lookup_candidates}"
    if tree_topk > 1 and tree_nodes:  # a dynamic tree: a node budget, grown `tree_topk` children at a time
        return f"{drafter}-tree-{tree_nodes}n-beam{tree_topk}"
    if tree_topk > 1:  # a static tree: depth x children per node
        return f"{drafter}-tree-{depth}x{tree_topk}"
    return drafter


@dataclass
class Stats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    drafted: int = 0  # tokens (chains) or nodes (trees) proposed
    accepted: int = 0
    tree_nodes: int = 0  # nodes verified per step by tree drafts (0 for chains)
    mode: str = ""  # what drafted, named by mode_name: "plain", "draft", "draft-tree-4x2", "lookup+medusa", ...
    num_draft: int | str = 0  # the draft length, or "auto" (adapted every step)
    seed: int = 0  # the seed used (drawn at random when none was given), so any run can be repeated
    # the rule sampled drafts were verified by ("coupled" or "residual"; "" when greedy, where both keep the same
    # tokens): a seed repeats a residual run's text only with --acceptance residual and the same drafting settings
    acceptance: str = ""
    reused_tokens: int = 0  # prompt tokens whose target cache was kept from the last run (prompt cache)
    prompt_cache: str = ""  # how: "cold", "prefix", "snapshot" (recurrent layers), "recomputed"; "" when off
    prompt_truncated_from: int = 0  # the prompt's length before --truncate cut it (0: not cut)
    note: str = ""  # why mlxspec decoded plainly instead of speculating, if it did
    kernel: str = ""  # the verify kernel's backend ("cpu") and layers routed, or why it was not used
    dtype: str = ""  # what the target computes in ("float32" on the CPU; mlx-lm keeps bf16 checkpoints in bf16)
    weights: str = ""  # a converted GGUF's block types and what each is held as ("Q4_K:4-bit,Q6_K:8-bit~7e-03")
    batch_rows: float = 1.0  # rows decoding together, on average over this run's steps (continuous batching)
    sorted_fallbacks: int = 0  # steps redone with the whole vocabulary ranked (a top-p set past the candidates)
    prompt_seconds: float = 0.0
    generation_seconds: float = 0.0
    peak_memory_bytes: int = 0

    @property
    def acceptance_rate(self) -> float:
        """alpha: the fraction of drafted tokens the target accepted."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_target_call(self) -> float:
        """tau: generated tokens per target forward pass (1.0 for plain decoding)."""
        return self.generated_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.generation_seconds if self.generation_seconds else 0.0

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def alpha_text(self) -> str:
        """alpha for a stats line: nothing drafted has no rate, so "-" rather than a 0.00 that reads as a failing
        drafter (generate -v, chat's /stats and the server's log alike; --json and usage say null)."""
        return f"{self.acceptance_rate:.2f}" if self.drafted else "-"

    @property
    def tau_text(self) -> str:
        return f"{self.tokens_per_target_call:.2f}" if self.generated_tokens else "-"

    def line(self) -> str:
        """The one stats line (generate -v, chat, the server's log): key=value pairs a script can split."""
        tree = f"tree_nodes={self.tree_nodes} " if self.tree_nodes else ""
        return (
            f"mode={self.mode} k={self.num_draft} seed={self.seed} "
            + (f"acceptance={self.acceptance} " if self.acceptance else "")
            + f"alpha={self.alpha_text} tau={self.tau_text} "
            f"gen={self.tokens_per_second:.1f} tok/s prompt={self.prompt_tokens_per_second:.1f} tok/s "
            f"tokens={self.generated_tokens} target_calls={self.target_calls} {tree}"
            f"kernel={self.kernel.split(' ')[0].rstrip(':') or 'off'} dtype={self.dtype or '-'} "
            + (f"weights={self.weights} " if self.weights else "")
            + f"peak={self.peak_memory_bytes / 2**20:.1f} MiB"
        )

    def to_dict(self) -> dict:
        out = asdict(self)
        for name in ("acceptance_rate", "tokens_per_target_call", "tokens_per_second", "prompt_tokens_per_second"):
            out[name] = getattr(self, name)
        out["acceptance_rate"] = self.acceptance_rate if self.drafted else None  # nothing drafted: no rate
        return out


@dataclass
class Chunk:
    """One streamed piece: the text and tokens accepted in a step."""

    text: str
    tokens: list[int]
    finish_reason: str | None = None  # "stop" (EOS or a stop string), "length", or None while running
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None  # per token, with logprobs asked for


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    stats: Stats = field(default_factory=Stats)
    finish_reason: str | None = None
