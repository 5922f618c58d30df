"""A feature-level draft head: one decoder layer of the target's own family that runs in the target's feature space.

    f'_{t+1} = Block( fc( [ norm_e(embed(x_{t+1})) ; norm_h(f_t) ] ) )      logits = lm_head(norm(f'_{t+1}))

f_t is the target's final hidden state at position t (what mlx-lm's `model.model` returns), x_{t+1} the token after
it, and the result predicts the token x_{t+2}. Two styles share this module:
- EAGLE (trained by `mlxspec train-heads --kind eagle`): no input norms; the output goes through the target's own
  final norm and LM head (shared, not copied), and the normed result is fed to the next depth;
- native MTP heads (DeepSeek-V3, GLM-4.5, Qwen3.5/3.6, Qwen3-Next, MiMo; mtp_weights.py): input norms, `eh_proj`
  or `fc`, the head's own final norm, and the un-normed block output fed to the next depth, as vLLM and SGLang run
  them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxspec.decoding.target_features import final_norm, output_head, text_model
from mlxspec.drafting.heads.files import base_model_identity, load_trained_head, read_head_config, save_head_files
from mlxspec.errors import UserError
from mlxspec.model_files import lazy_model

CONFIG_FILE, WEIGHTS_FILE = "eagle_config.json", "eagle.safetensors"


@dataclass
class FeatureHeadConfig:
    block_config: dict  # the mlx-lm config its one decoder layer is built from (the target's, one layer)
    kind: str = "eagle"  # "eagle" or the MTP family ("deepseek_v3", "qwen3_next", "mimo", ...)
    input_norms: bool = False  # RMSNorm the embedding and the feature before fc (MTP's enorm/hnorm)
    hidden_first: bool = False  # fc reads [feature ; embedding] (MiMo) instead of [embedding ; feature]
    fc_bias: bool = False
    own_norm: bool = False  # a final norm of its own (MTP) instead of the target's
    feed_normed: bool = True  # the next depth reads the normed output (EAGLE) or the raw block output (MTP)
    norm_eps: float = 1e-6
    blank_first_embedding: bool = False  # the row at position 0 reads a zero embedding (DeepSeek, GLM, MiMo MTP)
    base_model: str = ""  # the base model's directory name, for people
    base_model_identity: str = ""  # medusa.base_model_identity(dir), checked at load
    acceptance: list[float] = field(default_factory=list)  # [depth] teacher-forced top-1 agreement on held-out data
    training: dict[str, Any] = field(default_factory=dict)  # steps, time, data, command

    @property
    def hidden_size(self) -> int:
        return int(self.block_config["hidden_size"])


def family_block(block_config: dict) -> nn.Module:
    """One decoder layer of the family `block_config` names, built by mlx-lm (no model file is forked)."""
    model = lazy_model({**block_config, "num_hidden_layers": 1})
    layer = model.layers[0]
    if not any(name in layer for name in ("self_attn", "attention", "attn")):
        raise UserError(f"the first {block_config.get('model_type')} layer is not an attention layer; no head fits it")
    return layer


class FeatureHead(nn.Module):
    def __init__(self, config: FeatureHeadConfig, block: nn.Module | None = None):
        super().__init__()
        self.config = config
        dims, eps = config.hidden_size, config.norm_eps
        if config.input_norms:
            self.enorm, self.hnorm = nn.RMSNorm(dims, eps=eps), nn.RMSNorm(dims, eps=eps)
        self.fc = nn.Linear(2 * dims, dims, bias=config.fc_bias)
        self.block = block if block is not None else family_block(config.block_config)
        if config.own_norm:
            self.norm = nn.RMSNorm(dims, eps=eps)

    def on_target(self, target: nn.Module) -> HeadOnTarget:
        return HeadOnTarget(self, target)

    def __call__(self, embeds: mx.array, features: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        """embeds, features [B, L, D] (x_{t+1} and f_t) -> the block's output [B, L, D] (predicts f_{t+1})."""
        if self.config.input_norms:
            embeds, features = self.enorm(embeds), self.hnorm(features)
        pair = [features, embeds] if self.config.hidden_first else [embeds, features]
        return self.block(self.fc(mx.concatenate(pair, axis=-1)), mask, cache)


class HeadOnTarget:
    """A feature head wired to its target: the target's embedding, final norm and LM head, shared."""

    target_taps: tuple[int, ...] = ()  # it reads the target's final hidden states

    def __init__(self, head: FeatureHead, target: nn.Module):
        self.head = head
        self.embed = text_model(target).model.embed_tokens
        self.norm = head.norm if head.config.own_norm else final_norm(target)
        self.lm_head = output_head(target)

    def step(
        self, tokens: mx.array, features: mx.array, mask: Any, cache: Any, at_start: bool = False
    ) -> tuple[mx.array, mx.array]:
        """tokens [B, L], features [B, L, D] -> (logits [B, L, V], the features the next depth reads [B, L, D]).
        at_start: the first row sits at position 0."""
        embeds = self.embed(tokens)
        if at_start and self.head.config.blank_first_embedding:  # as vLLM's MTP forwards mask position 0
            embeds = mx.concatenate([mx.zeros_like(embeds[:, :1]), embeds[:, 1:]], axis=1)
        out = self.head(embeds, features, mask, cache)
        normed = self.norm(out)
        return self.lm_head(normed), normed if self.head.config.feed_normed else out


def new_eagle_head(target_config: dict, base_dir: Path) -> FeatureHead:
    """An untrained EAGLE head for the target at base_dir (its config.json dict)."""
    config = FeatureHeadConfig(
        block_config=dict(target_config),
        fc_bias=True,
        norm_eps=float(target_config.get("rms_norm_eps", 1e-6)),
        base_model=base_dir.name,
        base_model_identity=base_model_identity(base_dir),
    )
    return FeatureHead(config)


def save_head(head: FeatureHead, out_dir: Path) -> None:
    save_head_files(head, head.config, out_dir, WEIGHTS_FILE, CONFIG_FILE)


TRAINER = "mlxspec train-heads --kind eagle"


def load_head(path: str | Path, base_model_dir: Path) -> FeatureHead:
    """Load an EAGLE head and refuse it if it was trained on another base model."""
    path = Path(path)
    config = read_head_config(path, CONFIG_FILE, FeatureHeadConfig, "EAGLE head", TRAINER)
    if not isinstance(config.block_config, dict) or not isinstance(config.block_config.get("hidden_size"), int):
        raise UserError(f"'{path / CONFIG_FILE}' has no block_config with a hidden_size; retrain it")
    return load_trained_head(FeatureHead, config, path, base_model_dir, WEIGHTS_FILE, "an EAGLE head", TRAINER)
