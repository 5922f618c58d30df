// mlx-lm's affine quantization, multiplied in registers: w = scale * q + bias per group of group_size values
// along K, q packed 4 or 8 bits to a value (MLX's layout: value 2b in the low nibble of byte b at 4 bits).
//
// Each group's dot product is scale * dot(x, q) + bias * sum(x): the codes are widened to float in registers
// and never written to memory, so a row of weights is read once, at the speed of the memory. Every (row of x,
// row of w) pair is computed by the same operations whatever M, the tile or the thread, so a row's bits do not
// depend on how many rows came with it.
#pragma once

#include <cstdint>

namespace mlxspec {

// One weight matrix in MLX's affine layout, as both kernels (float and int8 activations) read it.
template <typename Scale>
struct AffineWeights {
  const uint8_t* w;  // packed codes, row_bytes a row
  const uint8_t* end;  // one past the last code byte
  const Scale* scales;
  const Scale* biases;
  int64_t row_bytes, groups, group_size;
};

// y[m][n] = x[m][k] @ dequantize(w)[n][k].T; k a multiple of group_size, group_size a multiple of 32.
template <typename Scale>
void affine_matmul(
    const float* x,
    int64_t m,
    int64_t k,
    int64_t n,
    const uint8_t* w,
    const Scale* scales,
    const Scale* biases,
    int group_size,
    int bits,
    float* y);

// The scalar reference of the same product, accumulated in double: what the tests hold the vector path against.
template <typename Scale>
void affine_matmul_reference(
    const float* x,
    int64_t m,
    int64_t k,
    int64_t n,
    const uint8_t* w,
    const Scale* scales,
    const Scale* biases,
    int group_size,
    int bits,
    float* y);

}  // namespace mlxspec
