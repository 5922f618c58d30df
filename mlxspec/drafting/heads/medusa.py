"""Medusa heads: predict several tokens ahead from the target's own last hidden state (no second model).

Head i (1..H) reads the hidden state at position t and predicts the token at t+i+1 (the target's LM head predicts
t+1). Each head is a residual SiLU block, h + silu(W h + b), followed by the target's own LM head (memory-light,
the default) or a head-specific one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from mlxspec.decoding.draft import Draft, Drafter
from mlxspec.decoding.target_features import output_head
from mlxspec.decoding.trees import TreeShape, heads_tree_paths, rank_paths_parents
from mlxspec.drafting.heads.files import load_trained_head, read_head_config, save_head_files
from mlxspec.errors import UserError

CONFIG_FILE, WEIGHTS_FILE = "medusa_config.json", "medusa.safetensors"


@dataclass
class MedusaConfig:
    num_heads: int
    hidden_size: int
    vocab_size: int
    shared_lm_head: bool = True
    base_model: str = ""  # the base model's directory name, for people
    base_model_identity: str = ""  # base_model_identity(dir), checked at load
    topk_accuracy: list[list[float]] = field(default_factory=list)  # [head][rank] P(rank-r token is right)
    data: str = "corpus"
    style: str = "medusa"  # "hydra": each head also reads the token before the one it guesses (drafting/heads/hydra.py)


class ResBlock(nn.Module):
    def __init__(self, dims: int):
        super().__init__()
        self.linear = nn.Linear(dims, dims)
        self.linear.weight = mx.zeros_like(self.linear.weight)  # start as identity: heads begin as the LM head

    def __call__(self, h: mx.array) -> mx.array:
        return h + nn.silu(self.linear(h))


class MedusaHeads(nn.Module):
    def __init__(self, config: MedusaConfig):
        super().__init__()
        self.config = config
        self.blocks = [ResBlock(config.hidden_size) for _ in range(config.num_heads)]
        if not config.shared_lm_head:
            self.lm_heads = [
                nn.Linear(config.hidden_size, config.vocab_size, bias=False) for _ in range(config.num_heads)
            ]

    def __call__(self, hidden: mx.array, base_head) -> mx.array:
        """hidden [..., D] -> logits [H, ..., V] for tokens t+2 .. t+H+1."""
        outs = []
        for i, block in enumerate(self.blocks):
            h = block(hidden)
            outs.append(base_head(h) if self.config.shared_lm_head else self.lm_heads[i](h))
        return mx.stack(outs)


def save_medusa(heads: nn.Module, out_dir: Path) -> None:
    save_head_files(heads, heads.config, out_dir, WEIGHTS_FILE, CONFIG_FILE)


TRAINER = "mlxspec train-medusa"


STYLES = ("medusa", "hydra")


def heads_class(config: MedusaConfig) -> type:
    """The module a config's style names: Medusa heads, or Hydra heads that also read the previous token."""
    if config.style == "hydra":
        from mlxspec.drafting.heads.hydra import HydraHeads

        return HydraHeads
    return MedusaHeads


def load_medusa(path: str | Path, base_model_dir: Path) -> nn.Module:
    """Load Medusa or Hydra heads and refuse them if they were trained on another base model."""
    path = Path(path)
    config = read_head_config(path, CONFIG_FILE, MedusaConfig, "Medusa", TRAINER)
    if config.style not in STYLES:
        raise UserError(
            f"'{path / CONFIG_FILE}' says style={config.style!r}; mlxspec knows {', '.join(STYLES)}: "
            "upgrade mlxspec or retrain the heads"
        )
    hydra = config.style == "hydra"
    what, trainer = ("Hydra heads", "mlxspec train-heads --kind hydra") if hydra else ("Medusa heads", TRAINER)
    return load_trained_head(heads_class(config), config, path, base_model_dir, WEIGHTS_FILE, what, trainer)


def medusa_drafter(heads: nn.Module, target: nn.Module, tree_nodes: int | None, tree_topk: int) -> Drafter:
    """The drafter for Medusa or Hydra heads."""
    if heads.config.style == "hydra":
        from mlxspec.drafting.heads.hydra import HydraDrafter

        return HydraDrafter(heads, target, tree_nodes=tree_nodes, tree_topk=tree_topk)
    return MedusaDrafter(heads, target, tree_nodes=tree_nodes, tree_topk=tree_topk)


class MedusaDrafter(Drafter):
    """Drafts a static sparse tree (or the top-1 chain) from Medusa heads on the target's last hidden state."""

    uses_target_hidden = True

    def __init__(self, heads: MedusaHeads, target: nn.Module, tree_nodes: int | None = None, tree_topk: int = 1):
        self.heads, self.base_head = heads, output_head(target)
        self.max_depth = heads.config.num_heads  # head h guesses the token h + 1 ahead; there is no deeper guess
        self.paths = heads_tree_paths(heads.config.num_heads, heads.config.topk_accuracy, tree_nodes, tree_topk)
        self.max_rank = 1 + max(max(p) for p in self.paths)
        self.max_nodes = len(self.paths)
        self.shape_parents = rank_paths_parents(self.paths)
        self.head_index = mx.array([len(p) - 1 for p in self.paths])
        self.rank_index = mx.array([p[-1] for p in self.paths])
        self.hidden: mx.array | None = None
        self.calls = 0

    def prefill(self, prompt: list[int]) -> None:
        self.hidden = None

    def reusable(self, prompt: list[int]) -> int:
        return len(prompt) - 2  # stateless, but the last prompt row's hidden state must be recomputed

    def resume(self, prompt: list[int], reused: int) -> None:
        self.prefill(prompt)

    def set_hidden(self, hidden: mx.array | None) -> None:
        """The target's final hidden states [n, D] of the rows it kept; the last is the token before the pending one
        (lazy; no sync)."""
        self.hidden = None if hidden is None else hidden[-1]

    def propose(self, num_tokens: int, key: mx.array) -> Draft | None:
        if self.hidden is None:
            return None
        logits = self.heads(self.hidden, self.base_head)  # [H, V]
        top = mx.argsort(-logits, axis=-1)[:, : self.max_rank].astype(mx.int32)
        # Paths are in BFS order, so the nodes no deeper than num_tokens are a prefix of them.
        count = sum(len(p) <= num_tokens for p in self.paths)
        tokens = top[self.head_index, self.rank_index][:count]
        self.calls += 1
        return Draft(tokens, None, TreeShape(self.shape_parents[: count + 1]))

    def accept(self, emitted: list[int], drafted: list[int]) -> None:
        pass  # the engine hands the new hidden state over through set_hidden
