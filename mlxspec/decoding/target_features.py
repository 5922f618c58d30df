"""The target's own features for drafters that read them, from the same forward pass: the final hidden state
(Medusa, EAGLE and MTP heads) or the outputs of chosen layers ("taps": DFlash reads five, EAGLE-3 three), and the
output head that turns a hidden state into logits exactly as the model does. Works on unmodified mlx-lm models:
`model.model` returns the final (normed) hidden states, and a tapped layer keeps its class, parameters and output;
it only records that output while a forward asks for it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn

from mlxspec.errors import UserError
from mlxspec.k_quants import KQuantLinear

if TYPE_CHECKING:
    from mlxspec.loading import LoadedModel


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
    cap = output_cap(model)

    def head(h: mx.array) -> mx.array:
        out = base(h)
        return mx.tanh(out / cap) * cap if cap else out

    return head


def output_cap(model: nn.Module) -> float | None:
    """The soft cap the model applies to its logits (Gemma 2), or None."""
    return getattr(text_model(model), "final_logit_softcapping", None) or None


def output_rows(model: nn.Module, ids: mx.array) -> mx.array:
    """[len(ids), D]: the rows of the model's output projection for these token ids, dequantized, so that
    h @ rows.T equals output_head(h)[..., ids] before any soft cap. What a hot-vocabulary head borrows instead of
    training (and storing) an output layer of its own."""
    model = text_model(model)
    layer = model.lm_head if "lm_head" in model else model.model.embed_tokens
    if isinstance(layer, KQuantLinear):
        return mx.dequantize(*layer.affine(ids), group_size=layer.group_size, bits=layer.bits)
    if "scales" not in layer:
        return layer.weight[ids]
    biases = layer["biases"][ids] if "biases" in layer else None
    mode = getattr(layer, "mode", "affine")
    return mx.dequantize(
        layer.weight[ids], layer.scales[ids], biases, group_size=layer.group_size, bits=layer.bits, mode=mode
    )


def forward_with_hidden(
    model: nn.Module, inputs: mx.array, cache: Any, taps: tuple[int, ...] = ()
) -> tuple[mx.array, mx.array]:
    """(features, logits [B, L, V]) from one forward pass. features: the final hidden states [B, L, D], or with
    `taps` the outputs of those decoder layers (0-based), concatenated in that order [B, L, len(taps) * D]."""
    if not taps:
        hidden = text_model(model).model(inputs, cache=cache)
        return hidden, output_head(model)(hidden)
    recorder = tap_recorder(model)
    recorder.wanted, recorder.rows = set(taps), {}
    try:
        hidden = text_model(model).model(inputs, cache=cache)
        rows = recorder.rows
    finally:
        recorder.wanted, recorder.rows = set(), {}
    missing = [layer for layer in taps if layer not in rows]
    if missing:  # a layer this rank does not run (a pipeline split) or that the family skips
        raise UserError(f"layer {missing[0]} of the target did not run in this forward, so it cannot be tapped")
    return mx.concatenate([rows[layer] for layer in taps], axis=-1), output_head(model)(hidden)


def decoder_layers(model: nn.Module) -> list:
    """The target's decoder layers in order, as its forward runs them (the list taps index)."""
    inner = getattr(text_model(model), "model", None)
    layers = inner.get("layers") if isinstance(inner, dict) else None
    if not isinstance(layers, list) or not layers:
        family = getattr(getattr(model, "args", None), "model_type", type(model).__name__)
        raise UserError(f"{family} keeps no list of decoder layers that mlxspec can tap; this drafter cannot run on it")
    return layers


class TapRecorder:
    """Where tapped layers write their outputs during a forward that asks for them (forward_with_hidden)."""

    def __init__(self) -> None:
        self.wanted: set[int] = set()
        self.rows: dict[int, mx.array] = {}


class TappedLayer:
    """Placed ahead of a decoder layer's own class (tap_recorder): the same layer, which also hands its output to
    the model's TapRecorder while a forward asks for this layer. Otherwise it only calls through."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = super().__call__(*args, **kwargs)
        recorder, index = self.__dict__[TAP_KEY]
        if index in recorder.wanted:
            recorder.rows[index] = out[0] if isinstance(out, tuple) else out
        return out


TAP_KEY = "_mlxspec_tap"  # in a model's and each layer's __dict__ (never its parameters)
_TAPPED_CLASSES: dict[type, type] = {}


def tap_recorder(model: nn.Module) -> TapRecorder:
    """The model's TapRecorder. On first use each decoder layer's class becomes a TappedLayer subclass of itself,
    once per model: its parameters, names and output stay as they were, so loading, quantizing and mlx-lm's own
    generate are unaffected."""
    recorder = model.__dict__.get(TAP_KEY)
    if recorder is None:
        recorder = TapRecorder()
        for index, layer in enumerate(decoder_layers(model)):
            cls = type(layer)
            if not isinstance(layer, TappedLayer) and cls not in _TAPPED_CLASSES:
                _TAPPED_CLASSES[cls] = type(cls.__name__, (TappedLayer, cls), {"__module__": cls.__module__})
            if not isinstance(layer, TappedLayer):  # (a layer shared with a model tapped before keeps its class)
                layer.__class__ = _TAPPED_CLASSES[cls]
            layer.__dict__[TAP_KEY] = (recorder, index)
        model.__dict__[TAP_KEY] = recorder
    return recorder


def target_embedding_rows(target: LoadedModel) -> int:
    """Rows of the target's input embedding: the vocabulary a drafter of it must cover."""
    embed = text_model(target.model).model.embed_tokens
    return int(getattr(embed, "num_embeddings", 0) or embed.weight.shape[0])
