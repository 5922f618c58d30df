"""The target's own features for drafters that read them (Medusa today, EAGLE and MTP heads next): the final hidden
state from the same forward pass, and the output head that turns a hidden state into logits exactly as the model
does. Works on unmodified mlx-lm models: `model.model` returns the final (normed) hidden states."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxspec.errors import UserError


def text_model(model: nn.Module) -> nn.Module:
    """The language model itself: wrappers of vision-language checkpoints (Qwen3.5, Gemma 3, Mistral 3) hold it as
    `language_model`, with its own `model` and `lm_head`."""
    return model.language_model if "language_model" in model else model


FINAL_NORM_NAMES = ("norm", "final_layernorm", "norm_f", "ln_f", "final_norm")


def final_norm(model: nn.Module) -> nn.Module:
    """The norm the model applies after its last layer (what feature heads reuse), found by its mlx-lm name."""
    inner = text_model(model).model
    for name in FINAL_NORM_NAMES:
        if name in inner and isinstance(inner[name], nn.Module):
            return inner[name]
    raise UserError(f"cannot find the final norm of {type(inner).__name__} (looked for {', '.join(FINAL_NORM_NAMES)})")


def output_head(model: nn.Module):
    """h -> logits exactly as the model's own __call__ computes them from model.model's output."""
    model = text_model(model)
    base = model.lm_head if "lm_head" in model else model.model.embed_tokens.as_linear
    cap = getattr(model, "final_logit_softcapping", None)

    def head(h: mx.array) -> mx.array:
        out = base(h)
        return mx.tanh(out / cap) * cap if cap else out

    return head


def forward_with_hidden(model: nn.Module, inputs: mx.array, cache: Any) -> tuple[mx.array, mx.array]:
    """(final hidden states [B, L, D], logits [B, L, V]) from one forward pass."""
    hidden = text_model(model).model(inputs, cache=cache)
    return hidden, output_head(model)(hidden)
