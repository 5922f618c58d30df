"""The bytes a model's weights take on a device, and the dtype it computes in there."""

from __future__ import annotations

from mlxspec.plan import memory_model as mm
from mlxspec.plan.devices import Device
from mlxspec.plan.metadata import ModelMetadata


def compute_dtype(device: Device, config: dict) -> str:
    if device.backend == "cpu":
        return "float32"  # mlxspec casts to float32 on the CPU backend: half precision matmul is emulated there
    return "bfloat16" if config.get("torch_dtype", "bfloat16") == "bfloat16" else "float16"


def model_weight_bytes(meta: ModelMetadata, bits: int | None, group_size: int, device: Device) -> tuple[int, str]:
    stored = meta.config.get("quantization") or {}
    bits = bits or stored.get("bits")
    group_size = stored.get("group_size", group_size) if not bits or bits == stored.get("bits") else group_size
    dtype = compute_dtype(device, meta.config)
    params = mm.count_parameters(meta.config)
    count = f"{params.total / 1e9:.2f}B" if params.total >= 1e8 else f"{params.total / 1e6:.1f}M"  # 0.00B says nothing
    if meta.weight_bytes and (device.backend != "cpu" or stored) and bits == stored.get("bits"):
        # a quantized model keeps its codes and scales as stored on the CPU too (the kernel widens them)
        source = "the GGUF header: its own bits" if "GGUF" in meta.source else "safetensors headers"
        return meta.weight_bytes, f"{count} params, exact, from {source}"
    if not bits and device.backend == "cpu" and stored_dtype(meta.config) != "float32":
        # a 16-bit checkpoint's Linear weights stay 16-bit on the CPU (the kernel widens them); embeddings and
        # norms become float32 (loading.widen_for_cpu)
        linear = params.attention + params.mlp + params.lm_head
        held = linear * mm.DTYPE_BYTES[stored_dtype(meta.config)] + (params.total - linear) * 4
        return held, f"{count} params, {stored_dtype(meta.config)} matrices, float32 embeddings and norms"
    note = f"{count} params" + (f", {bits}-bit g{group_size}" if bits else f", {dtype}")
    return mm.weight_bytes(params, bits, group_size, dtype), note


def stored_dtype(config: dict) -> str:
    """The float dtype a checkpoint's weights are stored in (its config's torch_dtype; bfloat16 when it says none)."""
    dtype = config.get("torch_dtype") or (config.get("text_config") or {}).get("torch_dtype") or "bfloat16"
    return dtype if dtype in mm.DTYPE_BYTES else "bfloat16"
