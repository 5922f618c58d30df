"""The verify kernel: a matmul for 1..32 rows that reads each weight once for all of them (csrc/), and the
routed view of a target that sends its Linear, QuantizedLinear and tied-embedding LM head through it, and its
attention through the kernel's row-equivalent attention (kernels/attention.py).

Why: MLX's CPU matmul packs the whole weight matrix on every small-M call, so verifying K+1 tokens costs far more
than one token. The kernel makes a row's result independent of how many rows came with it, so speculative output
equals mlxspec's plain decoding bit for bit (plain decoding runs through the same kernel at M = 1).

Backends plug in through `VerifyBackend` (kernels/backend.py); the CPU extension is the one built here. A CUDA
(`mx.fast.cuda_kernel`) or Metal (`mx.fast.metal_kernel`) version implements the same methods and is chosen by
device, never by guess.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, NamedTuple

import mlx.core as mx
import mlx.nn as nn

from mlxspec.errors import UserError
from mlxspec.k_quants import PARTS, KQuantEmbedding, KQuantLinear
from mlxspec.kernels.activations import swiglu_stand_in
from mlxspec.kernels.attention import SDPA_NAME, attention_stand_in, kernel_attention
from mlxspec.kernels.backend import CPUExtension, CPUInt8Activations, VerifyBackend
from mlxspec.kernels.many_rows import MAX_ROWS, in_row_chunks, prompt_rows_active, widened_product
from mlxspec.kernels.many_rows import rows_of as _rows
from mlxspec.kernels.norms import rms_norm_stand_in
from mlxspec.kernels.rebinding import StandIn, routed_class
from mlxspec.options import KERNEL_CHOICES

FLOAT_DTYPES = (mx.float32, mx.bfloat16, mx.float16)


@functools.lru_cache(maxsize=1)
def cpu_backend() -> tuple[CPUExtension | None, str]:
    """(the CPU backend, "") or (None, why not): not built, built for another MLX, or failing its self-test."""
    try:
        from mlxspec import _verify_kernel as module
    except ImportError:
        return None, "not built (no C++ compiler or CMake at install time); reinstall mlxspec where they are"
    if module.built_with_mlx != mx.__version__:
        return None, f"built for MLX {module.built_with_mlx}, running MLX {mx.__version__}; reinstall mlxspec"
    if not hasattr(module, "verify_attention"):
        return None, "built by an older mlxspec (no attention kernel); reinstall mlxspec"
    backend = CPUExtension(module)
    try:
        x, w = mx.arange(6, dtype=mx.float32).reshape(2, 3), mx.arange(12, dtype=mx.float32).reshape(4, 3)
        if not mx.array_equal(backend.matmul(x, w), x @ w.T).item():
            return None, "failed its self-test against mx.matmul; reinstall mlxspec"
    except Exception as error:  # e.g. a nanobind ABI other than MLX's: the array type is not recognised
        return None, f"cannot run with this MLX ({type(error).__name__}); reinstall mlxspec"
    return backend, ""


def resolve(choice: str) -> tuple[VerifyBackend | None, str]:
    """(backend, "") or (None, status) for choice auto/on/off. The status starts with "unavailable:" where the kernel
    was wanted on this device and is missing; 'on' without a usable kernel is refused by name."""
    if choice not in KERNEL_CHOICES:
        raise UserError(f"kernel {choice!r} is not one of {', '.join(KERNEL_CHOICES)}")
    if choice == "off":
        return None, "off (kernel='off')"
    named = choice in ("on", "int8")  # asked for by name: refused where it cannot run, never silently replaced
    if mx.default_device() != mx.cpu:
        why = f"no verify kernel for {mx.default_device()} yet; MLX's matmul is used"
        if named:
            raise UserError(f"--kernel {choice}: {why}; use --kernel auto or off")
        return None, f"off ({why})"
    backend, why = cpu_backend()
    if backend is None and named:
        raise UserError(f"--kernel {choice}: the verify kernel is unavailable: {why}; use --kernel auto or off")
    if backend is not None and choice == "int8":
        return int8_backend(), ""
    return backend, "" if backend is not None else f"unavailable: {why}"


@functools.lru_cache(maxsize=1)
def int8_backend() -> CPUInt8Activations:
    """The int8-activation variant of the built CPU kernel (one instance, so routed views are kept per backend)."""
    return CPUInt8Activations(cpu_backend()[0].module)


def row_ops():
    """The kernel's sampling row ops (logsumexp, top_candidates) where they run on the default device, else None."""
    return cpu_backend()[0] if mx.default_device() == mx.cpu else None


class KernelMissingWarning(RuntimeWarning):
    """The verify kernel was wanted (kernel='auto' on a CPU) but is not built or does not match this MLX."""


@functools.lru_cache(maxsize=1)
def warn_once_without_kernel(status: str) -> None:
    warnings.warn(f"mlxspec is running without the verify kernel: {status}", KernelMissingWarning, stacklevel=4)


# ---- routing: layer classes that call the kernel for up to MAX_ROWS rows, MLX's own op beyond ----


@functools.lru_cache(maxsize=1)
def _reference_blas() -> bool:
    """MLX's CPU matmul resolves to the reference BLAS (about 1 GFLOP/s): the kernel in chunks is faster there."""
    from mlxspec.platform import blas_in_use

    return blas_in_use() == "reference"


class VerifyLinear(nn.Linear):
    backend: VerifyBackend

    def __call__(self, x: mx.array) -> mx.array:
        y = _dense_call(self.backend, self.weight, x)
        if y is None:
            return super().__call__(x)
        return y + self.bias if "bias" in self else y


def _dense_call(backend: VerifyBackend, weight: mx.array, x: mx.array) -> mx.array | None:
    """The kernel's x @ weight.T, or None to use MLX's own matmul (another dtype; many rows with a real BLAS)."""
    mixed = x.dtype == mx.float32 and weight.dtype in (mx.bfloat16, mx.float16)  # 16-bit weights kept on the CPU
    if (x.dtype != weight.dtype and not mixed) or (_rows(x) > MAX_ROWS and not _reference_blas()):
        return None
    if _rows(x) > MAX_ROWS:
        return in_row_chunks(x, lambda rows: backend.matmul(rows, weight))
    return backend.matmul(x, weight)


def _widening(backend: VerifyBackend, x: mx.array) -> bool:
    """A prompt chunk's product by GEMM on widened weights (many_rows.py), where a real BLAS runs it."""
    return (
        prompt_rows_active()
        and _rows(x) > MAX_ROWS
        and x.dtype == mx.float32
        and not _reference_blas()
        and getattr(backend, "widens", lambda: False)()
    )


def _quantized_call(layer, x: mx.array) -> mx.array | None:
    """The kernel's product for a QuantizedLinear/QuantizedEmbedding layer, or None to use MLX's own op."""
    if x.dtype not in (mx.float32, layer.scales.dtype):
        return None  # float32 rows with float16 scales: the kernel and MLX both give float32
    operands = (layer.weight, layer.scales, layer.biases, layer.group_size, layer.bits)
    if _rows(x) <= MAX_ROWS:
        return layer.backend.qmatmul(x, *operands)
    if _widening(layer.backend, x):
        w, scales, biases = operands[:3]
        return widened_product(x, layer.backend.widen_affine, (w, scales, biases), (layer.group_size, layer.bits))
    # MLX's CPU quantized_matmul re-reads every weight for every row (0.4 GiB/s): a prefill goes through the kernel
    return in_row_chunks(x, lambda rows: layer.backend.qmatmul(rows, *operands))


class VerifyQuantizedLinear(nn.QuantizedLinear):
    backend: VerifyBackend

    def __call__(self, x: mx.array) -> mx.array:
        y = _quantized_call(self, x)
        if y is None:
            return super().__call__(x)
        return y + self.bias if "bias" in self else y


class VerifyEmbedding(nn.Embedding):
    """Embedding lookups unchanged; the tied LM head (`as_linear`) through the kernel."""

    backend: VerifyBackend

    def as_linear(self, x: mx.array) -> mx.array:
        y = _dense_call(self.backend, self.weight, x)
        return super().as_linear(x) if y is None else y


class VerifyQuantizedEmbedding(nn.QuantizedEmbedding):
    backend: VerifyBackend

    def as_linear(self, x: mx.array) -> mx.array:
        y = _quantized_call(self, x)
        return super().as_linear(x) if y is None else y


def _kquant_call(layer: KQuantLinear, x: mx.array) -> mx.array | None:
    """The kernel's product for a K-quant layer (float32 rows and scales, as on the CPU), or None for MLX's ops."""
    if x.dtype != mx.float32 or layer.super_scales.dtype != mx.float32 or layer.super_mins.dtype != mx.float32:
        return None
    if _rows(x) <= MAX_ROWS:
        return layer.backend.kquant_matmul(x, layer)
    if _widening(layer.backend, x):
        parts = tuple(getattr(layer, name) for name in PARTS)
        return widened_product(x, layer.backend.widen_kquant, parts, (layer.bits,))
    return in_row_chunks(x, lambda rows: layer.backend.kquant_matmul(rows, layer))


class VerifyKQuantLinear(KQuantLinear):
    backend: VerifyBackend

    def __call__(self, x: mx.array) -> mx.array:
        y = _kquant_call(self, x)
        if y is None:
            return super().__call__(x)
        return y + self.bias if "bias" in self else y


class VerifyKQuantEmbedding(KQuantEmbedding):
    backend: VerifyBackend

    def as_linear(self, x: mx.array) -> mx.array:
        y = _kquant_call(self, x)
        return super().as_linear(x) if y is None else y


def _quantized_supported(layer) -> bool:
    return (
        getattr(layer, "mode", "affine") == "affine"
        and layer.bits in (2, 3, 4, 5, 6, 8)
        and layer.group_size in (32, 64, 128)
        and layer.get("biases") is not None
        and layer.scales.dtype in FLOAT_DTYPES
    )


ROUTES: dict[type, tuple[type, callable]] = {
    nn.Linear: (VerifyLinear, lambda m: m.weight.dtype in FLOAT_DTYPES),
    nn.QuantizedLinear: (VerifyQuantizedLinear, _quantized_supported),
    nn.Embedding: (VerifyEmbedding, lambda m: m.weight.dtype in FLOAT_DTYPES),
    nn.QuantizedEmbedding: (VerifyQuantizedEmbedding, _quantized_supported),
    KQuantLinear: (VerifyKQuantLinear, lambda m: True),
    KQuantEmbedding: (VerifyKQuantEmbedding, lambda m: True),
}


def _retyped(layer: nn.Module, cls: type, backend: VerifyBackend) -> nn.Module:
    """A `cls` layer sharing `layer`'s arrays and settings (no copy), calling `backend`."""
    routed = cls.__new__(cls)
    routed.__dict__.update(layer.__dict__)
    dict.update(routed, layer)  # the arrays themselves; nn.Module.update would walk parameters
    routed.backend = backend
    return routed


def route_layer(layer: nn.Module, backend: VerifyBackend) -> nn.Module:
    """`layer` as its kernel-calling class when the kernel supports it, else `layer` itself."""
    route = ROUTES.get(type(layer))
    if route is None or not route[1](layer):
        return layer
    return _retyped(layer, route[0], backend)


def count_routed(model: nn.Module) -> int:
    """Layers of `model` that call the kernel: routed leaves and attention modules."""
    routed_types = tuple(cls for cls, _ in ROUTES.values())
    return sum(
        isinstance(layer, routed_types) or SDPA_NAME in getattr(layer, "routed", ())
        for _, layer in model.named_modules()
    )


VIEWS_KEY = "_mlxspec_routed_views"  # in a model's __dict__ (not its parameters): (backend, attention) -> its view


def routed_view(model: nn.Module, backend: VerifyBackend | None, attention: bool = True) -> nn.Module:
    """`model` with its supported Linear/QuantizedLinear/Embedding leaves, and (unless attention=False, for
    benchmarks) its attention, calling `backend`, built once per model and backend and kept: a second module tree
    sharing every array (no copy). The model itself is never changed, so mlx-lm's own generate on it, or a stream
    with the kernel off, never sees the kernel. None: `model` itself."""
    if backend is None:
        return model
    views = model.__dict__.setdefault(VIEWS_KEY, {})
    key = (backend.name, attention)
    if key not in views:
        views[key] = _view(model, _Routing(backend, stand_ins(backend, attention)), {})
    return views[key]


def stand_ins(backend: VerifyBackend, attention: bool) -> tuple[StandIn, ...]:
    """The mlx-lm functions the view's modules call the kernel for instead: attention (unless attention=False),
    swiglu and the RMS norm (both bitwise MLX's, so always)."""
    found = [swiglu_stand_in(backend), rms_norm_stand_in(backend)]
    if attention:
        found.append(attention_stand_in(kernel_attention(backend, MAX_ROWS)))
    return tuple(s for s in found if s is not None)


class _Routing(NamedTuple):
    backend: VerifyBackend
    stand_ins: tuple[StandIn, ...]


def _view(value: Any, routing: _Routing, memo: dict[int, Any]) -> Any:
    """A copy of the module tree under `value` with routed leaves and attention; arrays and plain attributes shared,
    and a module reached twice (a tied or aliased layer) copied once."""
    if id(value) in memo:
        return memo[id(value)]
    if isinstance(value, nn.Module):
        routed = route_layer(value, routing.backend)
        if routed is value:
            cls = routed_class(value.__class__, routing.stand_ins)  # the class itself where no stand-in applies
            routed = cls.__new__(cls)
            routed.__dict__.update({k: v for k, v in value.__dict__.items() if k != VIEWS_KEY})
            memo[id(value)] = routed
            dict.update(routed, {key: _view(item, routing, memo) for key, item in value.items()})
        memo[id(value)] = routed
        return routed
    if isinstance(value, (list, tuple)):
        return type(value)(_view(item, routing, memo) for item in value)
    if isinstance(value, dict):
        return {key: _view(item, routing, memo) for key, item in value.items()}
    return value  # arrays and everything else: shared
