// Affine weights against int8 activations (see matmul_affine_q8.h): one block of 32 values at a time, the codes
// unpacked to bytes and multiplied with the block's int8 activations by maddubs (u8 x s8 pairs summed to s16) and
// madd (pairs summed to s32), the integer dot converted once and scaled. The scalar loop below serves CPUs without
// AVX2 (and is slow); the double-precision reference at the end is what the tests hold both against.
#include "matmul_affine_q8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "mlx/types/bf16.h"
#include "mlx/types/half_types.h"
#include "affine_codes.h"
#include "matmul_affine.h"
#include "half_convert.h"
#include "thread_pool.h"

namespace mlxspec {

namespace {

constexpr int kBlock = 32;  // activation values sharing one int8 scale (llama.cpp's q8_0)
constexpr int kColumns = 4;  // weight rows a thread takes at a time (a multiple of every tile's CB)
constexpr int kMaxTileRows = 4;  // rows of x that share one unpacking of a block's codes

template <typename Scale>
using Weights = AffineWeights<Scale>;

struct QuantizedRows {
  const int8_t* q;  // [m][k]: each block's 32 values in the order its codes unpack to (block_order)
  const float* d;  // [m][blocks]: the block's scale
  const float* gsum;  // [m][groups]: the weight group's sum of d * sum(xq), what the group's bias multiplies
  int64_t k, blocks, groups;
};

// One block of x to int8: d = max|x| / 127 and xq = round(x / d), ties to even (x * (1 / d), as ggml computes).
void quantize_block(const float* x, int8_t* q, float& d, float& dsum) {
  float amax = 0.0f;
  for (int c = 0; c < kBlock; ++c) amax = std::max(amax, std::fabs(x[c]));
  d = amax / 127.0f;
  const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
  int32_t sum = 0;
  for (int c = 0; c < kBlock; ++c) {
    const int v = int(std::nearbyint(x[c] * inverse));
    q[c] = int8_t(v);
    sum += v;
  }
  dsum = d * float(sum);
}

// Where each byte of a block's unpacked codes comes from. 4 bits: the low nibbles of 16 bytes (the even values),
// then the high ones (the odd). 5 bits: four vectors of eight 32-bit codes (values 0-7, 8-15, 16-23, 24-31) packed
// to bytes by packs_epi32 and packus_epi16, which work within 128-bit halves. 8 bits: as stored.
void block_order(int bits, int order[kBlock]) {
  for (int p = 0; p < kBlock; ++p) {
    if (bits == 4) {
      order[p] = p < 16 ? 2 * p : 2 * (p - 16) + 1;
    } else if (bits == 5) {
      const int half = p / 16, within = p % 16;  // 128-bit half, byte in it
      const int source = within / 4;  // 0: a's, 1: b's, 2: c's, 3: d's four values in this half
      order[p] = source * 8 + half * 4 + within % 4;
    } else {
      order[p] = p;
    }
  }
}

#if defined(__AVX2__)
template <int Bits>
struct BlockCodes;

template <>
struct BlockCodes<4> {
  __m256i operator()(const uint8_t* p, const uint8_t*) const {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), nibble = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), nibble), _mm_and_si128(bytes, nibble));
  }
};

template <>
struct BlockCodes<5> {
  StreamCodes<5> stream;
  __m256i operator()(const uint8_t* p, const uint8_t* end) const {
    __m256i a, b, c, d;
    stream.ints(p, end, a, b);
    stream.ints(p + 10, end, c, d);
    return _mm256_packus_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
  }
};

template <>
struct BlockCodes<8> {  // q - 128 as signed bytes: u8 x s8 pairs of 255 * 127 would saturate s16
  __m256i operator()(const uint8_t* p, const uint8_t*) const {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), _mm256_set1_epi8(char(0x80)));
  }
};

template <int Bits>
inline __m256i block_dot(__m256i codes, __m256i xq) {  // eight s32 lanes summing to dot(codes, xq)
  const __m256i pairs = Bits == 8
      ? _mm256_maddubs_epi16(_mm256_sign_epi8(codes, codes), _mm256_sign_epi8(xq, codes))  // |c| x (x * sign c)
      : _mm256_maddubs_epi16(codes, xq);
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

// Eight lanes of scales or biases from memory, widened to float.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const mlx::core::float16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8(const mlx::core::bfloat16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// The biases' share of one output: sum over groups of bias_g * gsum_g (8-bit: (bias + 128 scale) * gsum), eight
// groups at a time, then the rest in order. Out of the block loop: it keeps the tile's registers for the dots.
template <int Bits, typename Scale>
float bias_share(const Scale* scales, const Scale* biases, const float* gsum, int64_t groups) {
  __m256 acc = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 8 <= groups; g += 8) {
    __m256 bias = load8(biases + g);
    if (Bits == 8) bias = _mm256_fmadd_ps(_mm256_set1_ps(128.0f), load8(scales + g), bias);
    acc = _mm256_fmadd_ps(bias, _mm256_loadu_ps(gsum + g), acc);
  }
  float total = reduce8(acc, _mm256_setzero_ps());
  for (; g < groups; ++g) {
    const float bias = Bits == 8 ? std::fma(128.0f, to_float(scales[g]), to_float(biases[g])) : to_float(biases[g]);
    total = std::fma(bias, gsum[g], total);
  }
  return total;
}

template <int Bits, int RB, int CB, typename Scale>
void tile(const Weights<Scale>& r, const QuantizedRows& x, int64_t first, float* out, int64_t ldo) {
  static const BlockCodes<Bits> unpack;
  __m256 acc[RB][CB];
  for (int i = 0; i < RB; ++i)
    for (int j = 0; j < CB; ++j) acc[i][j] = _mm256_setzero_ps();
  // One loop over the blocks, each reading its group's scale afresh (as the float tile does): a loop per group
  // kept the scales in registers across it and spilled accumulators instead.
  const int64_t per_group = r.group_size / kBlock;
  for (int64_t b = 0, g = 0, group_end = per_group; b < x.blocks; ++b) {
    if (b == group_end) {
      ++g;
      group_end += per_group;
    }
    __m256i codes[CB];
    for (int j = 0; j < CB; ++j) codes[j] = unpack(r.w + (first + j) * r.row_bytes + b * kBlock * Bits / 8, r.end);
    for (int i = 0; i < RB; ++i) {
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + i * x.k + b * kBlock));
      const __m256 d = _mm256_broadcast_ss(x.d + i * x.blocks + b);
      for (int j = 0; j < CB; ++j) {
        const __m256 scale = _mm256_set1_ps(to_float(r.scales[(first + j) * r.groups + g]));
        const __m256 dot = _mm256_cvtepi32_ps(block_dot<Bits>(codes[j], xq));
        acc[i][j] = _mm256_fmadd_ps(dot, _mm256_mul_ps(d, scale), acc[i][j]);
      }
    }
  }
  for (int i = 0; i < RB; ++i) {
    for (int j = 0; j < CB; ++j) {
      const float bias = bias_share<Bits>(r.scales + (first + j) * r.groups, r.biases + (first + j) * r.groups,
                                          x.gsum + i * x.groups, r.groups);
      out[i * ldo + j] = reduce8(acc[i][j], _mm256_setzero_ps()) + bias;
    }
  }
}
#else
template <int Bits, int RB, int CB, typename Scale>
void tile(const Weights<Scale>& r, const QuantizedRows& x, int64_t first, float* out, int64_t ldo) {
  // Scalar, codes in natural order (x is not permuted without AVX2).
  for (int i = 0; i < RB; ++i) {
    for (int j = 0; j < CB; ++j) {
      const uint8_t* row = r.w + (first + j) * r.row_bytes;
      float acc = 0.0f, bias_acc = 0.0f;
      for (int64_t b = 0; b < x.blocks; ++b) {
        const int64_t g = b * kBlock / r.group_size;
        int32_t dot = 0;
        for (int c = 0; c < kBlock; ++c) {
          const int64_t bit = (b * kBlock + c) * Bits;
          const unsigned pair = row[bit / 8] | (row + bit / 8 + 1 < r.end ? unsigned(row[bit / 8 + 1]) << 8 : 0u);
          dot += int32_t((pair >> (bit % 8)) & ((1u << Bits) - 1)) * x.q[i * x.k + b * kBlock + c];
        }
        acc = std::fma(float(dot), x.d[i * x.blocks + b] * to_float(r.scales[(first + j) * r.groups + g]), acc);
      }
      for (int64_t g = 0; g < r.groups; ++g)  // raw unsigned codes here, so no 128 * scale at 8 bits
        bias_acc = std::fma(to_float(r.biases[(first + j) * r.groups + g]), x.gsum[i * x.groups + g], bias_acc);
      out[i * ldo + j] = acc + bias_acc;
    }
  }
}
#endif

template <int Bits, int RB, typename Scale>
void tile_columns(const Weights<Scale>& r, const QuantizedRows& x, int64_t c, int cb, float* out, int64_t ldo) {
  // One row of x takes four weight rows a tile (four accumulator chains), more rows two: a pair's products go in
  // the same order whatever the tile's width.
  constexpr int kWide = RB == 1 ? 4 : 2;
  int64_t done = 0;
  for (; cb - done >= kWide; done += kWide) tile<Bits, RB, kWide>(r, x, c + done, out + done, ldo);
  for (; done < cb; ++done) tile<Bits, RB, 1>(r, x, c + done, out + done, ldo);
}

template <int Bits, typename Scale>
void multiply_columns(const Weights<Scale>& r, const QuantizedRows& x, int64_t m, int64_t n, int64_t begin,
                      int64_t end, float* y) {
  for (int64_t c = begin; c < end; c += kColumns) {
    const int cb = int(std::min<int64_t>(kColumns, end - c));
    split_rows(m, kMaxTileRows, [&](int64_t i, int rows) {
      const QuantizedRows part{x.q + i * x.k, x.d + i * x.blocks, x.gsum + i * x.groups, x.k, x.blocks, x.groups};
      float* out = y + i * n + c;
      switch (rows) {
        case 1: tile_columns<Bits, 1>(r, part, c, cb, out, n); break;
        case 2: tile_columns<Bits, 2>(r, part, c, cb, out, n); break;
        case 3: tile_columns<Bits, 3>(r, part, c, cb, out, n); break;
        default: tile_columns<Bits, 4>(r, part, c, cb, out, n); break;
      }
    });
  }
}

thread_local std::vector<int8_t> tls_q;
thread_local std::vector<float> tls_d, tls_gsum;

// x's rows quantized block by block, each block's bytes in the order `bits`'s codes unpack to, with each weight
// group's sum of d * sum(xq).
QuantizedRows quantize_rows(const float* x, int64_t m, int64_t k, int bits, int group_size) {
  const int64_t blocks = k / kBlock, groups = k / group_size, per_group = group_size / kBlock;
  if (tls_q.size() < size_t(m * k)) tls_q.resize(m * k);
  if (tls_d.size() < size_t(m * blocks)) tls_d.resize(m * blocks);
  if (tls_gsum.size() < size_t(m * groups)) tls_gsum.resize(m * groups);
  int order[kBlock];
  block_order(bits, order);
#if !defined(__AVX2__)
  for (int p = 0; p < kBlock; ++p) order[p] = p;
#endif
  int8_t natural[kBlock];
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t g = 0; g < groups; ++g) {
      float gsum = 0.0f;
      for (int64_t b = g * per_group; b < (g + 1) * per_group; ++b) {
        float dsum;
        quantize_block(x + i * k + b * kBlock, natural, tls_d[i * blocks + b], dsum);
        gsum += dsum;
        int8_t* dst = tls_q.data() + i * k + b * kBlock;
        for (int p = 0; p < kBlock; ++p) dst[p] = natural[order[p]];
      }
      tls_gsum[i * groups + g] = gsum;
    }
  }
  return {tls_q.data(), tls_d.data(), tls_gsum.data(), k, blocks, groups};
}

}  // namespace

bool affine_q8_supported(int bits) {
  return bits == 4 || bits == 5 || bits == 8;
}

template <typename Scale>
void affine_matmul_q8(const float* x, int64_t m, int64_t k, int64_t n, const uint8_t* w, const Scale* scales,
                      const Scale* biases, int group_size, int bits, float* y) {
  const QuantizedRows xq = quantize_rows(x, m, k, bits, group_size);
  const int64_t weight_bytes = n * k * bits / 8;
  const Weights<Scale> r{w, w + weight_bytes, scales, biases, k * bits / 8, k / group_size, group_size};
  auto run = [&](int64_t begin, int64_t end) {
    switch (bits) {
      case 4: multiply_columns<4>(r, xq, m, n, begin, end, y); break;
      case 5: multiply_columns<5>(r, xq, m, n, begin, end, y); break;
      default: multiply_columns<8>(r, xq, m, n, begin, end, y); break;
    }
  };
  split_columns(n, kColumns, weight_bytes, run);
}

template <typename Scale>
void affine_matmul_q8_reference(const float* x, int64_t m, int64_t k, int64_t n, const uint8_t* w,
                                const Scale* scales, const Scale* biases, int group_size, int bits, float* y) {
  const int64_t groups = k / group_size, row_bytes = k * bits / 8, blocks = k / kBlock;
  std::vector<int8_t> q(kBlock);
  for (int64_t i = 0; i < m; ++i) {
    std::vector<int8_t> xq(k);
    std::vector<float> d(blocks), dsum(blocks);
    for (int64_t b = 0; b < blocks; ++b) quantize_block(x + i * k + b * kBlock, xq.data() + b * kBlock, d[b], dsum[b]);
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int64_t b = 0; b < blocks; ++b) {
        int64_t dot = 0, total = 0;
        for (int c = 0; c < kBlock; ++c) {
          const int64_t bit = (j * row_bytes) * 8 + (b * kBlock + c) * bits;  // MLX's little-endian bit stream
          const unsigned pair = w[bit / 8] | (bit / 8 + 1 < n * row_bytes ? unsigned(w[bit / 8 + 1]) << 8 : 0u);
          dot += int64_t((pair >> (bit % 8)) & ((1u << bits) - 1)) * xq[b * kBlock + c];
          total += xq[b * kBlock + c];
        }
        const int64_t g = j * groups + b * kBlock / group_size;
        sum += double(d[b]) * (double(to_float(scales[g])) * dot + double(to_float(biases[g])) * total);
      }
      y[i * n + j] = float(sum);
    }
  }
}

#define MLXSPEC_AFFINE_Q8(Scale)                                                                                   \
  template void affine_matmul_q8<Scale>(const float*, int64_t, int64_t, int64_t, const uint8_t*, const Scale*,     \
                                        const Scale*, int, int, float*);                                           \
  template void affine_matmul_q8_reference<Scale>(const float*, int64_t, int64_t, int64_t, const uint8_t*,         \
                                                  const Scale*, const Scale*, int, int, float*);

MLXSPEC_AFFINE_Q8(float)
MLXSPEC_AFFINE_Q8(mlx::core::bfloat16_t)
MLXSPEC_AFFINE_Q8(mlx::core::float16_t)

}  // namespace mlxspec
