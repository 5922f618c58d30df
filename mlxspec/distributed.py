"""The target sharded over `mx.distributed` ranks (started by `mlx.launch`), the drafter replicated on every rank.

Every rank runs the same engine on the same tokens: the draft model (or prompt lookup) is small and deterministic,
so identical inputs and seeds give identical drafts without communicating them. Only the target is split: its
tensor-parallel layers (mlx-lm's `model.shard(group)`) all-reduce inside each forward, so one verify pass of K+1
tokens pays the same two all-reduces per layer as a single token. The step's one host sync carries rank 0's
accepted count and tokens to every rank (`agree`), so ranks can never disagree on what was emitted.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from .errors import UserError

MODES = ("tensor",)  # pipeline parallelism is not built yet
LAUNCH = "mlx.launch -n 2 --backend ring --python PYTHON LAUNCHER generate ... --distributed tensor"


@dataclass
class Sharding:
    mode: str
    group: mx.distributed.Group

    @property
    def rank(self) -> int:
        return self.group.rank()

    @property
    def size(self) -> int:
        return self.group.size()

    def shard(self, model: nn.Module) -> None:
        """Split the target's layers across the ranks, in place (before its weights are read)."""
        if not hasattr(model, "shard"):
            family = getattr(getattr(model, "args", None), "model_type", type(model).__name__)
            raise UserError(f"mlx-lm cannot shard {family} for tensor parallelism; run it on one machine")
        model.shard(self.group)

    def agree(self, values: mx.array) -> mx.array:
        """Rank 0's `values` on every rank: one all-reduce, lazy, so it rides in the step's single host sync.

        Every rank's share is computed from `values` (zeros as values * 0), so the all-reduce runs after the forward's
        own on every rank: collectives must come in the same order everywhere."""
        return mx.distributed.all_sum(values * int(self.rank == 0), group=self.group)


def start(mode: str) -> Sharding:
    """Join the ranks `mlx.launch` started, or refuse in one line where there are none."""
    if mode not in MODES:
        raise UserError(f"--distributed {mode} is not built yet; use --distributed tensor")
    if not mx.distributed.is_available():
        raise UserError("this MLX build has no distributed backend; --distributed needs one (ring, MPI or JACCL)")
    group = mx.distributed.init()
    if group.size() < 2:
        raise UserError(f"--distributed {mode} runs on several ranks; start them with `{LAUNCH}`")
    return Sharding(mode, group)
