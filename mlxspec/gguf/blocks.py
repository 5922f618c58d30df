"""GGUF's quantized blocks read into MLX's affine format (w = scale * q + bias per group of 32), kept at their bits.

Pure numpy. Each reader takes a tensor's blocks [blocks, block bytes] (ggml's layout: `ggml-common.h` and
`dequantize_row_*` in `ggml-quants.c`; the `gguf` package's `quants.py` is the same in numpy) and gives the codes
[blocks, values], scales and biases [blocks, groups]. Where a block's sub-blocks of 32 each have one scale and one
minimum, that is exact: scale * q + bias equals ggml's float value bit for bit, FMA or not, because scale * q needs at
most 22 significant bits. The scales are float16 where the file's own are (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: -8d, -16d and
-128d are exact there too), float32 where they are products d * sc (Q4_K, Q5_K).

Q4_K and Q5_K are also kept factored as the file holds them (`KQuantBlocks`: d and dmin per super-block of 256,
6-bit sc and m per 32): the kernel forms d * sc and -dmin * m in registers, exactly the float32 products above, at
the file's own size instead of two float32 numbers per 32 values.

Q6_K's sub-blocks of 16 each have their own scale; MLX's groups are at least 32 long, so one group of 32 spans two
scales and no affine code of 8 bits or fewer holds both lattices (1-4% of groups would). Q6_K, and every other
type, is therefore read to float and re-quantized to 8 bits by MLX, with its error measured (`requantized`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

GROUP = 32  # MLX's smallest group; every exact block type has sub-blocks of 32
REQUANTIZED_BITS = 8  # what a block type without an exact affine form becomes (Q6_K: the nearest, measured)


@dataclass(frozen=True)
class AffineBlocks:
    codes: np.ndarray  # uint8 [blocks, values a block]
    scales: np.ndarray  # [blocks, groups a block], float16 or float32
    biases: np.ndarray
    bits: int


def _half(column: np.ndarray) -> np.ndarray:
    """A little-endian float16 field of each block, as a [blocks, 1] float32 column."""
    return np.ascontiguousarray(column).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, run: int) -> np.ndarray:
    """Per run of `run` bytes: the low nibbles (the first `run` values), then the high nibbles (the next)."""
    blocks = qs.shape[0]
    shaped = qs.reshape(blocks, -1, 1, run) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (shaped & np.uint8(15)).reshape(blocks, -1)


def _high_bits_32(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's fifth bits: bit j of the little-endian uint32 is value j's."""
    word = np.ascontiguousarray(qh).view(np.uint32)
    return ((word >> np.arange(32, dtype=np.uint32)) & np.uint32(1)).astype(np.uint8)


def _scaled(d: np.ndarray, offset: int, bits: int, codes: np.ndarray) -> AffineBlocks:
    """Blocks of one group whose value is d * (q - offset): scale d, bias -offset * d (exact in float16 unless it
    overflows there, then float32)."""
    bias = -np.float32(offset) * d
    dtype = np.float16 if np.all(np.isfinite(bias.astype(np.float16))) else np.float32
    return AffineBlocks(codes, d.astype(dtype), bias.astype(dtype), bits)


def q4_0(blocks: np.ndarray) -> AffineBlocks:
    return _scaled(_half(blocks[:, 0:2]), 8, 4, _nibbles(blocks[:, 2:18], 16))


def q4_1(blocks: np.ndarray) -> AffineBlocks:
    return AffineBlocks(_nibbles(blocks[:, 4:20], 16), _half(blocks[:, 0:2]).astype(np.float16),
                        _half(blocks[:, 2:4]).astype(np.float16), 4)  # fmt: skip


def q5_0(blocks: np.ndarray) -> AffineBlocks:
    codes = _nibbles(blocks[:, 6:22], 16) | (_high_bits_32(blocks[:, 2:6]) << np.uint8(4))
    return _scaled(_half(blocks[:, 0:2]), 16, 5, codes)


def q5_1(blocks: np.ndarray) -> AffineBlocks:
    codes = _nibbles(blocks[:, 8:24], 16) | (_high_bits_32(blocks[:, 4:8]) << np.uint8(4))
    return AffineBlocks(codes, _half(blocks[:, 0:2]).astype(np.float16), _half(blocks[:, 2:4]).astype(np.float16), 5)


def q8_0(blocks: np.ndarray) -> AffineBlocks:
    codes = (np.ascontiguousarray(blocks[:, 2:34]).view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    return _scaled(_half(blocks[:, 0:2]), 128, 8, codes)


def k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's eight 6-bit scales and minimums from 12 bytes (ggml's get_scale_min_k4)."""
    d, m, m_d = np.split(packed.reshape(-1, 3, 4), 3, axis=1)
    scale = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    minimum = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return scale.reshape(-1, 8), minimum.reshape(-1, 8)


@dataclass(frozen=True)
class KQuantBlocks:
    """Q4_K/Q5_K super-blocks of 256 as the file holds them: w = d * sc * q - dmin * m per sub-block of 32."""

    codes: np.ndarray  # uint8 [blocks, 256]
    sub_scales: np.ndarray  # sc, uint8 [blocks, 8] (6-bit)
    sub_mins: np.ndarray  # m, uint8 [blocks, 8]
    super_scales: np.ndarray  # d, float16 [blocks, 1]
    super_mins: np.ndarray  # dmin, float16 [blocks, 1]
    bits: int

    def affine(self) -> AffineBlocks:
        """The same values as affine groups of 32: scale d * sc and bias -dmin * m, exact in float32."""
        d, dmin = self.super_scales.astype(np.float32), self.super_mins.astype(np.float32)
        scales = d * self.sub_scales.astype(np.float32)
        return AffineBlocks(self.codes, scales, -(dmin * self.sub_mins.astype(np.float32)), self.bits)


def _k_blocks(blocks: np.ndarray, codes: np.ndarray, bits: int) -> KQuantBlocks:
    """A K-quant super-block of 256: d and dmin (float16), then eight sub-blocks' 6-bit scales and minimums."""
    scale, minimum = k_scales(blocks[:, 4:16])
    d = np.ascontiguousarray(blocks[:, 0:2]).view(np.float16)
    dmin = np.ascontiguousarray(blocks[:, 2:4]).view(np.float16)
    return KQuantBlocks(codes, scale.astype(np.uint8), minimum.astype(np.uint8), d, dmin, bits)


def q4_k_blocks(blocks: np.ndarray) -> KQuantBlocks:
    return _k_blocks(blocks, _nibbles(blocks[:, 16:144], 32), 4)


def q5_k_blocks(blocks: np.ndarray) -> KQuantBlocks:
    qh = blocks[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    high = (qh & np.uint8(1)).reshape(blocks.shape[0], -1)  # sub-block j's fifth bits are bit j of the 32 bytes
    return _k_blocks(blocks, _nibbles(blocks[:, 48:176], 32) | (high << np.uint8(4)), 5)


def q4_k(blocks: np.ndarray) -> AffineBlocks:
    return q4_k_blocks(blocks).affine()


def q5_k(blocks: np.ndarray) -> AffineBlocks:
    return q5_k_blocks(blocks).affine()


BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34, "Q4_K": 144, "Q5_K": 176}
EXACT: dict[str, Callable[[np.ndarray], AffineBlocks]] = {
    "Q4_0": q4_0, "Q4_1": q4_1, "Q5_0": q5_0, "Q5_1": q5_1, "Q8_0": q8_0, "Q4_K": q4_k, "Q5_K": q5_k,
}  # fmt: skip


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes [rows, K] (K a multiple of 32) as MLX packs them: a little-endian bit stream, `bits` a value,
    in uint32 words [rows, K * bits / 32]."""
    rows, k = codes.shape
    eights = codes.reshape(rows, k // 8, 8).astype(np.uint64)
    stream = np.zeros((rows, k // 8), dtype=np.uint64)
    for i in range(8):  # eight values fill `bits` bytes exactly
        stream |= eights[:, :, i] << np.uint64(bits * i)
    as_bytes = stream.view(np.uint8).reshape(rows, k // 8, 8)[:, :, :bits]
    return np.ascontiguousarray(as_bytes).reshape(rows, k * bits // 8).view(np.uint32)


@dataclass(frozen=True)
class Quantized:
    """A matrix in MLX's affine format (mlx-lm's `weight`, `scales`, `biases`)."""

    weight: np.ndarray  # uint32 [rows, K * bits / 32]
    scales: np.ndarray  # [rows, K / 32]
    biases: np.ndarray
    bits: int
    exact: bool
    error: float = 0.0  # re-quantized: RMS error over RMS value


def exact_affine(raw: np.ndarray, type_name: str, shape: tuple[int, ...]) -> Quantized:
    """A [rows, K] tensor's blocks (raw bytes [rows, K / block * block bytes]) at their own bits, exactly."""
    rows, k = shape
    read = EXACT[type_name](np.ascontiguousarray(raw).reshape(-1, BLOCK_BYTES[type_name]))
    codes = read.codes.reshape(rows, k)
    groups = k // GROUP
    return Quantized(pack(codes, read.bits), read.scales.reshape(rows, groups), read.biases.reshape(rows, groups),
                     read.bits, exact=True)  # fmt: skip


K_QUANTS: dict[str, Callable[[np.ndarray], KQuantBlocks]] = {"Q4_K": q4_k_blocks, "Q5_K": q5_k_blocks}
SUPER_BLOCK = 256


@dataclass(frozen=True)
class KQuantized:
    """A K-quant matrix held factored (mlxspec's KQuantLinear): codes packed as MLX packs them, sc and m per 32
    values, d and dmin per 256."""

    weight: np.ndarray  # uint32 [rows, K * bits / 32]
    sub_scales: np.ndarray  # uint8 [rows, K / 32]
    sub_mins: np.ndarray
    super_scales: np.ndarray  # float16 [rows, K / 256]
    super_mins: np.ndarray
    bits: int
    PARTS = ("weight", "sub_scales", "sub_mins", "super_scales", "super_mins")

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, part).nbytes for part in self.PARTS)


def k_quantized(raw: np.ndarray, type_name: str, shape: tuple[int, ...]) -> KQuantized:
    """A [rows, K] Q4_K/Q5_K tensor's blocks (raw bytes [rows, K / 256 * block bytes]), factored as the file is."""
    rows, k = shape
    read = K_QUANTS[type_name](np.ascontiguousarray(raw).reshape(-1, BLOCK_BYTES[type_name]))
    groups, blocks = k // GROUP, k // SUPER_BLOCK
    return KQuantized(pack(read.codes.reshape(rows, k), read.bits), read.sub_scales.reshape(rows, groups),
                      read.sub_mins.reshape(rows, groups), read.super_scales.reshape(rows, blocks),
                      read.super_mins.reshape(rows, blocks), read.bits)  # fmt: skip


def requantized(values: np.ndarray, bits: int = REQUANTIZED_BITS) -> Quantized:
    """Float values [rows, K] re-quantized by MLX (groups of 32, float16 scales), with the error measured."""
    import mlx.core as mx

    matrix = mx.array(values.astype(np.float32))
    weight, scales, biases = mx.quantize(matrix, group_size=GROUP, bits=bits)
    scales, biases = scales.astype(mx.float16), biases.astype(mx.float16)
    wide = (scales.astype(mx.float32), biases.astype(mx.float32))  # as the kernel widens them
    back = mx.dequantize(weight, *wide, group_size=GROUP, bits=bits)
    error = mx.sqrt(mx.mean(mx.square(back - matrix))) / mx.maximum(mx.sqrt(mx.mean(mx.square(matrix))), 1e-30)
    return Quantized(np.array(weight), np.array(scales), np.array(biases), bits, exact=False, error=error.item())
