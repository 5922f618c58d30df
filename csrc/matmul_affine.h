// mlx-lm's affine quantization, multiplied in registers: w = scale * q + bias per group of group_size values
// along K, q packed 4 or 8 bits to a value (MLX's layout: value 2b in the low nibble of byte b at 4 bits).
//
// Each group's dot product is scale * dot(x, q) + bias * sum(x): the codes are widened to float in registers
// and never written to memory, so a row of weights is read once, at the speed of the memory. Every (row of x,
// row of w) pair is computed by the same operations whatever M, the tile or the thread, so a row's bits do not
// depend on how many rows came with it.
#pragma once

#include <cstdint>

#include "affine_codes.h"
#include "half_convert.h"

namespace mlxspec {

// One weight matrix in MLX's affine layout, as both kernels (float and int8 activations) read it.
template <typename Scale>
struct AffineWeights {
  const uint8_t* w;  // packed codes, row_bytes a row
  const uint8_t* end;  // one past the last code byte
  const Scale* scales;
  const Scale* biases;
  int64_t row_bytes, groups, group_size;

  // Group g of weight row `row`: its scale and bias, widened.
  void group_scale(int64_t row, int64_t g, float& scale, float& bias) const {
    scale = to_float(scales[row * groups + g]);
    bias = to_float(biases[row * groups + g]);
  }
  static constexpr bool kScalesBySuperBlock = false;  // read one group's at a time (group_scale)
};

constexpr int kKQuantGroups = 8;  // groups of 32 a K-quant super-block

// A K-quant matrix (ggml's Q4_K and Q5_K) at the file's own size: per super-block of 256 values (8 groups of 32)
// float scales d and dmin, per group 6-bit integers sc and m, and w = d * sc * q - dmin * m. The products d * sc
// and dmin * m need at most 17 significant bits, so each group's scale and bias are float32's exactly and a row's
// bits are those of the affine kernel given the products as float32 scales and biases.
struct KQuantWeights {
  const uint8_t* w;  // packed codes as MLX packs them, row_bytes a row
  const uint8_t* end;
  const uint8_t* sub_scales;  // sc [N, K / 32]
  const uint8_t* sub_mins;  // m [N, K / 32]
  const float* super_scales;  // d [N, K / 256]
  const float* super_mins;  // dmin [N, K / 256]
  int64_t row_bytes, groups, group_size;

  void group_scale(int64_t row, int64_t g, float& scale, float& bias) const {
    const int64_t i = row * groups + g;  // groups is a multiple of 8: super-block i / 8
    scale = super_scales[i / 8] * float(sub_scales[i]);
    bias = -(super_mins[i / 8] * float(sub_mins[i]));
  }
  // One super-block's 8 groups at once (g a multiple of 8), the same products as group_scale's, 8 lanes at a
  // time where AVX2 is there: one at a time they cost as much as the 4-bit tile's lookups of the codes.
  static constexpr bool kScalesBySuperBlock = true;
  void super_block_scales(int64_t row, int64_t g, float* scale, float* bias) const {
#if defined(__AVX2__)
    const int64_t i = row * groups + g;
    const __m256 sc = widen8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sub_scales + i)));
    const __m256 m = widen8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sub_mins + i)));
    const __m256 sign = _mm256_set1_ps(-0.0f);  // -(x) flips the sign bit, as the scalar form does (0 - x would not)
    _mm256_storeu_ps(scale, _mm256_mul_ps(_mm256_set1_ps(super_scales[i / 8]), sc));
    _mm256_storeu_ps(bias, _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(super_mins[i / 8]), m), sign));
#else
    for (int j = 0; j < kKQuantGroups; ++j) group_scale(row, g + j, scale[j], bias[j]);
#endif
  }
};

// The scale and bias of group g for each of a tile's CB weight rows, formed once per group (not per chunk) and
// kept in memory, so a tile broadcasts them from there; K-quant rows form a super-block's 8 groups at once (the same
// products as group_scale's, 8 lanes at a time).
template <int CB, typename Rows>
struct TileScales {
  float scale[CB][kKQuantGroups], bias[CB][kKQuantGroups];
  int at = 0;  // the group's slot: its index in the super-block, or 0
  void load(const Rows& r, int64_t first, int64_t g) {
    if constexpr (Rows::kScalesBySuperBlock) {
      at = int(g % kKQuantGroups);
      if (at == 0) {
        for (int j = 0; j < CB; ++j) r.super_block_scales(first + j, g, scale[j], bias[j]);
      }
    } else {
      for (int j = 0; j < CB; ++j) r.group_scale(first + j, g, scale[j][0], bias[j][0]);
    }
  }
  const float& scale_of(int j) const { return scale[j][at]; }
  const float& bias_of(int j) const { return bias[j][at]; }
};

// y[m][n] = x[m][k] @ dequantize(w)[n][k].T for a K-quant matrix; k a multiple of 256, bits 4 or 5.
void kquant_matmul(const float* x, int64_t m, int64_t k, int64_t n, const KQuantWeights& w, int bits, float* y);

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
