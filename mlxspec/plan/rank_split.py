"""What one rank holds of a target sharded over N ranks the way mlx-lm splits it (distributed.py), for `plan --ranks`.

- tensor: every layer's attention heads, KV heads and MLP units are split N ways; the embedding, the output head and
  the norms stay whole on every rank.
- pipeline: consecutive layers per rank (the low ranks take the extra ones); the embedding, the output head and the
  final norm are on every rank. The largest share is what must fit.
The drafter is replicated, so every rank holds all of it.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass

from mlxspec.errors import UserError
from mlxspec.plan import memory_model as mm

MODES = ("tensor", "pipeline")  # how mlx-lm splits a target across ranks (distributed.py)


@dataclass(frozen=True)
class RankSplit:
    ranks: int = 1
    mode: str = "tensor"

    @property
    def sharded(self) -> bool:
        return self.ranks > 1

    def layer_share(self, layers: int) -> float:
        """The share of the layers' weights and KV that the most loaded rank holds."""
        if not self.sharded:
            return 1.0
        if self.mode == "tensor":
            return 1 / self.ranks
        return math.ceil(layers / self.ranks) / layers

    def weight_share(self, config: dict) -> float:
        """The share of the whole model's parameters on the most loaded rank."""
        params = mm.count_parameters(config)
        layers = params.attention + params.mlp
        whole = params.total - layers  # embedding, output head, norms: on every rank
        return (whole + layers * self.layer_share(num_layers(config))) / params.total

    def describe(self) -> str:
        if self.mode == "tensor":
            return f"{self.ranks} ranks, each layer split {self.ranks} ways (tensor)"
        return f"{self.ranks} ranks, consecutive layers per rank (pipeline)"


def num_layers(config: dict) -> int:
    return int(mm.text_config(config)["num_hidden_layers"])


def check_split(config: dict, split: RankSplit, name: str) -> None:
    """Refuse a split mlx-lm cannot make, in one line naming the value and the fix."""
    if not split.sharded:
        return
    if split.mode not in MODES:
        raise UserError(f"--distributed {split.mode} is not a mode; use {' or '.join(MODES)}")
    text = mm.text_config(config)
    if split.mode == "pipeline":
        if num_layers(config) < split.ranks:
            raise UserError(f"{name} has {num_layers(config)} layers, fewer than the {split.ranks} ranks")
    else:
        for key in ("num_attention_heads", "num_key_value_heads"):
            if text.get(key) and text[key] % split.ranks:
                raise UserError(
                    f"{name} has {key}={text[key]}, which {split.ranks} ranks cannot split evenly; use a number "
                    "of ranks that divides it"
                )
    family = config.get("model_type", "")  # the module mlx-lm loads (a wrapper's, for vision-language models)
    if not mlx_lm_can_split(family, split.mode):
        other = "pipeline" if split.mode == "tensor" else "tensor"
        fix = f"use --distributed {other}" if mlx_lm_can_split(family, other) else "run it on one machine"
        raise UserError(f"mlx-lm has no {split.mode} split for {family}; {fix}")


def mlx_lm_can_split(model_type: str, mode: str) -> bool:
    """Whether mlx-lm's model file for this family has the split: `Model.shard` (tensor) or a PipelineMixin layer
    stack (pipeline). An unknown family answers False."""
    try:
        module = importlib.import_module(f"mlx_lm.models.{model_type}")
    except ImportError:
        if not model_type.endswith("_text"):
            return False
        return mlx_lm_can_split(model_type.removesuffix("_text"), mode)  # a text config of a wrapped model
    if mode == "tensor":
        return hasattr(getattr(module, "Model", None), "shard")
    from mlx_lm.models.pipeline import PipelineMixin

    return any(isinstance(v, type) and issubclass(v, PipelineMixin) for v in vars(module).values())
