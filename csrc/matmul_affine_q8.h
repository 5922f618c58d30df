// mlx-lm's affine weights (w = scale * q + bias per group) against activations quantized to int8, the way llama.cpp
// computes: an explicit, lossy opt-in (`--activations int8`), never the default.
//
// Each row of x is quantized per block of 32 values: d = max|x| / 127, xq = round(x / d) (to nearest, ties to even),
// and the block's sum of xq kept. A block's dot product is then exact in integers, dot(q, xq), and
//   y[i][j] = sum over blocks b of  d_ib * (scale_jg * dot(q_jb, xq_ib) + bias_jg * sum(xq_ib)),
// in one fixed order whatever M, the tile or the thread: a row's bits do not depend on the rows beside it, so
// speculative decoding in this mode still equals plain decoding in this mode bit for bit.
#pragma once

#include <cstdint>

namespace mlxspec {

// Bits 4, 5 and 8 (what GGUF files convert into); k a multiple of group_size, group_size a multiple of 32.
bool affine_q8_supported(int bits);

template <typename Scale>
void affine_matmul_q8(const float* x, int64_t m, int64_t k, int64_t n, const uint8_t* w, const Scale* scales,
                      const Scale* biases, int group_size, int bits, float* y);

// The scalar reference of the same product (the same quantization of x, then double accumulation).
template <typename Scale>
void affine_matmul_q8_reference(const float* x, int64_t m, int64_t k, int64_t n, const uint8_t* w,
                                const Scale* scales, const Scale* biases, int group_size, int bits, float* y);

}  // namespace mlxspec
