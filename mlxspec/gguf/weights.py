"""A GGUF file's tensors under their mlx-lm names, at their own bits, with a report of what became of each type.

Quantized matrices stay quantized (blocks.py): Q4_K and Q5_K factored as the file holds them (mlxspec's
KQuantLinear, k_quants.py), Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 exactly in MLX's affine format, re-quantized to 8 bits
with the error measured where neither holds the block (Q6_K and the rest). Float tensors keep their dtype (F32,
F16, BF16). llama.cpp's per-architecture transforms are undone: the q/k row permutation moves whole rows, so it
applies to codes, scales and biases alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mlxspec.errors import UserError
from mlxspec.gguf.architectures import Architecture, mlx_name, undo_transforms
from mlxspec.gguf.blocks import (
    EXACT,
    GROUP,
    K_QUANTS,
    SUPER_BLOCK,
    KQuantized,
    Quantized,
    exact_affine,
    k_quantized,
    requantized,
)
from mlxspec.gguf.header import TYPES, Header, TensorInfo

FLOATS = {"F32": np.float32, "F16": np.float16, "BF16": None}  # BF16: kept as bfloat16 by MLX (numpy has none)


@dataclass
class TypeReport:
    """What became of one GGUF block type."""

    tensors: int = 0
    file_bytes: int = 0
    held_bytes: int = 0
    held_as: str = ""  # "4-bit, float32 scales" / "float16"
    exact: bool = True
    error: float = 0.0  # the largest relative RMS error of a re-quantized tensor

    def line(self, type_name: str) -> str:
        how = "exact" if self.exact else f"re-quantized, relative RMS error {self.error:.1e}"
        return (
            f"{type_name}: {self.tensors} tensors, {self.file_bytes / 1e6:.0f} MB -> {self.held_as} "
            f"({self.held_bytes / 1e6:.0f} MB): {how}"
        )

    def short(self, type_name: str) -> str:
        """For the stats line: no spaces."""
        held = self.held_as.split(",")[0].replace(" ", "")
        return f"{type_name}:{held}" + ("" if self.exact else f"~{self.error:.0e}")


@dataclass
class Converted:
    arrays: dict[str, object] = field(default_factory=dict)  # numpy arrays, or MLX arrays for bfloat16
    layers: dict[str, dict] = field(default_factory=dict)  # module path -> {"group_size", "bits"}
    k_quants: dict[str, int] = field(default_factory=dict)  # module path -> bits, held factored (k_quants.py)
    report: dict[str, TypeReport] = field(default_factory=dict)

    def summary(self) -> str:
        """One line for -v and --json: each block type and what it is held as."""
        return ",".join(r.short(name) for name, r in sorted(self.report.items()))


def is_matrix_weight(name: str, tensor: TensorInfo) -> bool:
    """A Linear's or Embedding's weight: what mlx-lm can hold quantized (norms and 1-d tensors stay float)."""
    return len(tensor.shape) == 2 and name.endswith(".weight") and "norm" not in name and tensor.shape[1] % GROUP == 0


SCALE_BYTES = {"Q4_K": 4, "Q5_K": 4}  # float32 products d * sc; every other type's scales are float16


def held_factored(tensor: TensorInfo) -> bool:
    """Whether a matrix is held as K-quant super-blocks (every row a whole number of them)."""
    return tensor.type_name in K_QUANTS and tensor.shape[-1] % SUPER_BLOCK == 0


def held_bytes(name: str, tensor: TensorInfo) -> int:
    """The bytes a tensor takes once converted and loaded on the CPU (from the header alone, for the planner):
    a K-quant matrix at its bits with sc and m per 32 values and d and dmin (widened to float32) per 256; another
    quantized matrix at its bits (Q6_K and others at 8) with a scale and a bias per 32 values; everything else
    widened to float32 there."""
    if tensor.type_name in FLOATS or not is_matrix_weight(name, tensor):
        return 4 * tensor.count
    bits = int(tensor.type_name[1]) if tensor.type_name in EXACT else 8
    if held_factored(tensor):
        return tensor.count * bits // 8 + tensor.count // GROUP * 2 + tensor.count // SUPER_BLOCK * 8
    # an embedding's lookups are the hidden state, so its scales are widened to float32 on the CPU (loading.py)
    scale_bytes = 4 if "embed_tokens" in name else SCALE_BYTES.get(tensor.type_name, 2)
    return tensor.count * bits // 8 + tensor.count // GROUP * 2 * scale_bytes


def converted_tensors(header: Header, arch: Architecture, config: dict) -> Converted:
    from mlxspec.progress import Progress

    data = np.memmap(header.path, dtype=np.uint8, mode="r")
    progress = Progress("converting tensors", len(header.tensors))
    out = Converted()
    for i, tensor in enumerate(header.tensors):
        progress.update(i)
        name = mlx_name(tensor.name, arch)
        raw = raw_blocks(data, header, tensor)
        report = out.report.setdefault(tensor.type_name, TypeReport())
        report.tensors += 1
        report.file_bytes += tensor.nbytes
        if tensor.type_name in FLOATS or not is_matrix_weight(name, tensor):
            _add_float(out, name, float_values(header, tensor, raw), tensor.type_name, arch, config, report)
            continue
        if held_factored(tensor):
            _add_k_quant(out, name, k_quantized(raw, tensor.type_name, tensor.shape), arch, config, report)
            continue
        if tensor.type_name in EXACT:
            held = exact_affine(raw, tensor.type_name, tensor.shape)
        else:
            held = requantized(float_values(header, tensor, raw))
        _add_quantized(out, name, held, arch, config, report)
    progress.close()
    return out


def raw_blocks(data: np.ndarray, header: Header, tensor: TensorInfo) -> np.ndarray:
    """A tensor's bytes in the file's memory map, one row of blocks per row: [*shape[:-1], row bytes]."""
    _, block, size = TYPES[tensor.type_id]
    start = header.data_start + tensor.offset
    return data[start : start + tensor.nbytes].reshape(*tensor.shape[:-1], tensor.shape[-1] // block * size)


def float_values(header: Header, tensor: TensorInfo, raw: np.ndarray) -> np.ndarray:
    """The tensor in float32 as the gguf package (llama.cpp's own reader) dequantizes it."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    try:
        return dequantize(raw, GGMLQuantizationType(tensor.type_id)).reshape(tensor.shape).astype(np.float32)
    except NotImplementedError:
        raise UserError(
            f"'{header.path}': tensor '{tensor.name}' is {tensor.type_name}, which the gguf package cannot "
            "dequantize; convert a Q8_0, Q4_K_M or F16 file"
        ) from None


def _add_float(out: Converted, name: str, values: np.ndarray, type_name: str, arch, config, report: TypeReport):
    """A float tensor at its own dtype; a quantized vector (rare) as float32."""
    import mlx.core as mx

    values = undo_transforms(name, values, arch, config)
    kind = type_name if type_name in FLOATS else "F32"
    if kind == "BF16":
        out.arrays[name] = mx.array(values).astype(mx.bfloat16)  # exact: the values came from bfloat16
        nbytes, report.held_as = values.size * 2, "bfloat16"
    else:
        out.arrays[name] = values.astype(FLOATS[kind])
        nbytes, report.held_as = out.arrays[name].nbytes, str(np.dtype(FLOATS[kind]))
    report.held_bytes += nbytes


def _add_quantized(out: Converted, name: str, held: Quantized, arch, config, report: TypeReport) -> None:
    prefix = name.removesuffix(".weight")
    for part in ("weight", "scales", "biases"):
        out.arrays[f"{prefix}.{part}"] = undo_transforms(name, getattr(held, part), arch, config)
    out.layers[prefix] = {"group_size": GROUP, "bits": held.bits}
    report.held_bytes += held.weight.nbytes + held.scales.nbytes + held.biases.nbytes
    report.held_as = f"{held.bits}-bit, {held.scales.dtype} scales"
    report.exact = report.exact and held.exact
    report.error = max(report.error, held.error)


def _add_k_quant(out: Converted, name: str, held: KQuantized, arch, config, report: TypeReport) -> None:
    prefix = name.removesuffix(".weight")
    for part in KQuantized.PARTS:
        out.arrays[f"{prefix}.{part}"] = undo_transforms(name, getattr(held, part), arch, config)
    out.k_quants[prefix] = held.bits
    report.held_bytes += held.nbytes
    report.held_as = f"{held.bits}-bit, K-quant super-blocks"
