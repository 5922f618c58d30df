// Affine-quantized weights multiplied in registers (see matmul_affine.h).
//
// Layout of the work: the output columns (weight rows) are split into one contiguous range per thread,
// depending only on N. A tile holds RB rows of x and CB rows of w; for each group it widens the CB rows' codes
// (16 bytes at a time: 32 four-bit or 16 eight-bit codes) to float lanes and accumulates x * q, then adds
// scale * that to the row's total. At 4 bits the low nibbles of 16 bytes are the even values of 32 and the high
// nibbles the odd ones, so x is permuted once per call to match (even values first, then odd, per 32).
// With AVX-512 (compiled for it: -march=native), 2- to 5-bit codes are looked up among the group's values instead
// of converted, and 8-bit codes widened 16 a vector, for the row counts where that measured faster; every such
// tile computes the AVX2 tile's values in its order, so the bits do not depend on which tile ran.
#include "matmul_affine.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "mlx/types/bf16.h"
#include "mlx/types/half_types.h"
#include "cpu_common.h"
#include "affine_codes.h"
#include "affine_tiles_avx512.h"
#include "half_convert.h"
#include "thread_pool.h"

namespace mlxspec {

namespace {


#if !defined(__AVX2__)
// The portable path's helpers, in the extension's 16-lane generic vectors (NEON and others). On AVX2 GCC compiles
// these badly: it widens the upper 8 of 16 codes one byte at a time and builds `vector * scalar` broadcasts
// through the stack (10x slower), so AVX2 has its own tile below.
typedef uint8_t vbyte16 __attribute__((vector_size(16)));

inline vfloat load(const float* p) {
  vfloat v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline float reduce(vfloat v) {  // one fixed order for every dot product
  float lanes[kLanes];
  std::memcpy(lanes, &v, sizeof(v));
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int i = 0; i < width; ++i) lanes[i] += lanes[i + width];
  }
  return lanes[0];
}

inline vfloat splat(float value) {
  vfloat v;
  for (int i = 0; i < kLanes; ++i) v[i] = value;
  return v;
}

inline vfloat widen_bytes(vbyte16 b) {
  return __builtin_convertvector(__builtin_convertvector(b, vint), vfloat);
}

// Codes of 32 values at 4 bits (16 bytes): the even values (low nibbles), then the odd ones (high nibbles).
inline void codes4(const uint8_t* p, vfloat& even, vfloat& odd) {
  vbyte16 b;
  std::memcpy(&b, p, sizeof(b));
  even = widen_bytes(b & 15);
  odd = widen_bytes(b >> 4);
}

// Sixteen codes of Bits (2, 3, 5 or 6) from 2 * Bits bytes of MLX's little-endian bit stream.
template <int Bits>
inline vfloat stream_codes(const uint8_t* p) {
  vfloat v;
  for (int half = 0; half < 2; ++half) {
    uint64_t word = 0;
    std::memcpy(&word, p + half * Bits, Bits);
    for (int i = 0; i < 8; ++i) v[half * 8 + i] = float((word >> (Bits * i)) & ((1u << Bits) - 1));
  }
  return v;
}

inline vfloat codes8(const uint8_t* p) {
  vbyte16 b;
  std::memcpy(&b, p, sizeof(b));
  return widen_bytes(b);
}
#endif


#if defined(__AVX2__)
// The AVX2 tile, in its own 8-lane registers (64-byte generic vectors spill on AVX2's 16 registers): RB rows of x
// (permuted to the codes' order) and CB weight rows from `first`. Each 16 bytes of codes are widened, dequantized
// (scale * q + bias, one FMA per 8 lanes) and multiplied into two accumulators per (row, weight row).
template <int Bits, int RB, int CB, typename Rows>
void tile(const Rows& r, const float* x, int64_t k, int64_t first, float* out, int64_t ldo) {
  static const StreamCodes<(Bits == 4 || Bits == 8) ? 2 : Bits> stream;
  __m256 acc[RB][CB][2];
  for (int i = 0; i < RB; ++i)
    for (int j = 0; j < CB; ++j) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
  const uint8_t* w[CB];
  for (int j = 0; j < CB; ++j) w[j] = r.w + (first + j) * r.row_bytes;
  constexpr int kPerChunk = Bits == 4 ? 32 : 16;  // values per 16 bytes of codes
  // One loop over the chunks, each taking its group's scale and bias afresh: with a loop per group GCC kept the
  // broadcast scales in registers across the group and spilled the accumulators instead (a store and a reload on
  // every chain, 1.45x slower at M = 1 on Zen 3). The products and their order are the same either way.
  // A K-quant's scales are formed once a super-block, 8 lanes at a time, and broadcast from memory (TileScales):
  // formed per chunk in scalar code they cost its one-row tile a third of its speed. An affine group's are two
  // loads, taken per chunk (through memory they measured slower).
  constexpr bool kBySuperBlock = Rows::kScalesBySuperBlock;
  TileScales<CB, Rows> scales;
  if constexpr (kBySuperBlock) scales.load(r, first, 0);
  for (int64_t c = 0, g = 0, group_end = r.group_size; c < k; c += kPerChunk) {
    if (c == group_end) {  // no division per chunk: a counter
      ++g;
      group_end += r.group_size;
      if constexpr (kBySuperBlock) scales.load(r, first, g);
    }
    if constexpr (RB == 1) prefetch_ahead<CB>(w, uint64_t(c) * Bits / 8);
    for (int j = 0; j < CB; ++j) {
      __m256 s, b;
      if constexpr (kBySuperBlock) {
        s = _mm256_broadcast_ss(&scales.scale_of(j));
        b = _mm256_broadcast_ss(&scales.bias_of(j));
      } else {
        float scale, bias;
        r.group_scale(first + j, g, scale, bias);
        s = _mm256_set1_ps(scale);
        b = _mm256_set1_ps(bias);
      }
      if constexpr (Bits != 4 && Bits != 8) {
        __m256 q0, q1;
        stream(w[j] + uint64_t(c) * Bits / 8, r.end, q0, q1);  // c >= 0: a shift, not a signed division
        q0 = _mm256_fmadd_ps(q0, s, b);
        q1 = _mm256_fmadd_ps(q1, s, b);
        for (int i = 0; i < RB; ++i) {
          const float* xi = x + i * k + c;
          acc[i][j][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xi), q0, acc[i][j][0]);
          acc[i][j][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xi + 8), q1, acc[i][j][1]);
        }
      } else if constexpr (Bits == 4) {
        // Even values, then odd ones: two dequantized vectors live at a time, so six rows' accumulators fit.
        // Each accumulator still takes its products in the same order (even, then odd) whatever RB is.
        const Codes16<(RB <= 4)> codes(w[j] + c / 2);
        const auto even = codes.low_nibbles();
        const __m256 q0 = _mm256_fmadd_ps(even.low(), s, b);
        const __m256 q1 = _mm256_fmadd_ps(even.high(), s, b);
        for (int i = 0; i < RB; ++i) {
          const float* xi = x + i * k + c;
          acc[i][j][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xi), q0, acc[i][j][0]);
          acc[i][j][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xi + 8), q1, acc[i][j][1]);
        }
        const auto odd = codes.high_nibbles();
        const __m256 q2 = _mm256_fmadd_ps(odd.low(), s, b);
        const __m256 q3 = _mm256_fmadd_ps(odd.high(), s, b);
        for (int i = 0; i < RB; ++i) {
          const float* xi = x + i * k + c;
          acc[i][j][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xi + 16), q2, acc[i][j][0]);
          acc[i][j][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xi + 24), q3, acc[i][j][1]);
        }
      } else {
        const Codes16<(RB <= 4)> codes(w[j] + c);
        const __m256 q0 = _mm256_fmadd_ps(codes.low(), s, b);
        const __m256 q1 = _mm256_fmadd_ps(codes.high(), s, b);
        for (int i = 0; i < RB; ++i) {
          const float* xi = x + i * k + c;
          acc[i][j][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xi), q0, acc[i][j][0]);
          acc[i][j][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xi + 8), q1, acc[i][j][1]);
        }
      }
    }
  }
  for (int i = 0; i < RB; ++i) {
    for (int j = 0; j < CB; ++j) out[i * ldo + j] = reduce8(acc[i][j][0], acc[i][j][1]);
  }
}
#else
// The portable tile in the extension's 16-lane vectors: each weight chunk dequantized in registers (scale * q +
// bias), then multiplied into every row's accumulator.
template <int Bits, int RB, int CB, typename Rows>
void tile(const Rows& r, const float* x, int64_t k, int64_t first, float* out, int64_t ldo) {
  vfloat acc[RB][CB] = {};
  const uint8_t* w[CB];
  for (int j = 0; j < CB; ++j) w[j] = r.w + (first + j) * r.row_bytes;
  constexpr int kPerChunk = Bits == 4 ? 32 : 16;  // values per 16 bytes of codes
  for (int64_t g = 0; g < r.groups; ++g) {
    vfloat scale[CB], bias[CB];
    for (int j = 0; j < CB; ++j) {
      float s, b;
      r.group_scale(first + j, g, s, b);
      scale[j] = splat(s);
      bias[j] = splat(b);
    }
    for (int64_t c = g * r.group_size; c < (g + 1) * r.group_size; c += kPerChunk) {
      for (int j = 0; j < CB; ++j) {
        if constexpr (Bits != 4 && Bits != 8) {
          const vfloat q = stream_codes<Bits>(w[j] + c * Bits / 8) * scale[j] + bias[j];
          for (int i = 0; i < RB; ++i) acc[i][j] += load(x + i * k + c) * q;
        } else if constexpr (Bits == 4) {
          vfloat even, odd;
          codes4(w[j] + c / 2, even, odd);
          even = even * scale[j] + bias[j];
          odd = odd * scale[j] + bias[j];
          for (int i = 0; i < RB; ++i) {
            acc[i][j] += load(x + i * k + c) * even;
            acc[i][j] += load(x + i * k + c + kLanes) * odd;
          }
        } else {
          const vfloat q = codes8(w[j] + c) * scale[j] + bias[j];
          for (int i = 0; i < RB; ++i) acc[i][j] += load(x + i * k + c) * q;
        }
      }
    }
  }
  for (int i = 0; i < RB; ++i) {
    for (int j = 0; j < CB; ++j) out[i * ldo + j] = reduce(acc[i][j]);
  }
}
#endif

// cb weight rows, Step (1 or 2) a tile: tile(CB, done) for each, CB a std::integral_constant of 1 or 2 (2 only
// while two rows are left).
template <int Step, typename Tile>
inline void by_weight_rows(int cb, Tile&& tile) {
  for (int64_t done = 0; done < cb; done += Step) {
    if constexpr (Step == 2) {
      if (cb - done >= 2) {
        tile(std::integral_constant<int, 2>{}, done);
        continue;
      }
    }
    tile(std::integral_constant<int, 1>{}, done);
  }
}

template <int Bits, int RB, typename Rows>
void tile_columns(const Rows& r, const float* x, int64_t k, int64_t c, int cb, float* out, int64_t ldo) {
#if defined(__AVX512F__)
  if constexpr (Bits == 4) {  // two weight rows a tile: AVX-512's 32 registers hold 8 rows' accumulators for both
    by_weight_rows<2>(cb, [&](auto columns, int64_t done) {
      avx512::tile4_lookup<RB, columns()>(r, x, k, c + done, out + done, ldo);
    });
    return;
  }
  // (From 5 rows on, the AVX2 tile below was faster here: 7-8 against 4 GiB/s on the 5-bit shapes at M = 5.)
  if constexpr ((Bits == 2 || Bits == 3 || Bits == 5) && RB <= 4) {
    by_weight_rows<2>(cb, [&](auto columns, int64_t done) {
      avx512::tile16<avx512::StreamLookup<Bits>, RB, columns()>(r, x, k, c + done, out + done, ldo);
    });
    return;
  }
  if constexpr (Bits == 8) {  // one weight row a tile: two measured slower at every M (23 against 18 GiB/s at M = 1)
    by_weight_rows<1>(cb, [&](auto columns, int64_t done) {
      avx512::tile16<avx512::Wide8, RB, columns()>(r, x, k, c + done, out + done, ldo);
    });
    return;
  }
#endif
  // Three or more rows of x take one weight row a tile, fewer take two: the accumulators stay in AVX2's 16
  // registers, and two weight rows give one row of x independent chains to overlap.
  by_weight_rows<RB >= 3 ? 1 : 2>(
      cb, [&](auto columns, int64_t done) { tile<Bits, RB, columns()>(r, x, k, c + done, out + done, ldo); });
}

constexpr int kColumns = 4;  // weight rows a thread takes at a time (a multiple of every tile's CB)
#if defined(__AVX512F__)
constexpr int kMaxTileRows = 8;  // rows of x that share one widening of the codes (AVX-512's 32 registers)
#else
constexpr int kMaxTileRows = 6;  // rows of x that share one widening of the codes
#endif

template <int Bits, typename Rows>
void tile_rows(const Rows& r, const float* x, int rows, int64_t k, int64_t c, int cb, float* out,
               int64_t ldo) {
  switch (rows) {
    case 1: tile_columns<Bits, 1>(r, x, k, c, cb, out, ldo); break;
    case 2: tile_columns<Bits, 2>(r, x, k, c, cb, out, ldo); break;
    case 3: tile_columns<Bits, 3>(r, x, k, c, cb, out, ldo); break;
    case 4: tile_columns<Bits, 4>(r, x, k, c, cb, out, ldo); break;
    case 5: tile_columns<Bits, 5>(r, x, k, c, cb, out, ldo); break;
#if defined(__AVX512F__)
    case 6: tile_columns<Bits, 6>(r, x, k, c, cb, out, ldo); break;
    case 7: tile_columns<Bits, 7>(r, x, k, c, cb, out, ldo); break;
    default: tile_columns<Bits, 8>(r, x, k, c, cb, out, ldo); break;
#else
    default: tile_columns<Bits, 6>(r, x, k, c, cb, out, ldo); break;
#endif
  }
}

template <int Bits, typename Rows>
void multiply_columns(const Rows& r, const float* x, int64_t m, int64_t k, int64_t n, int64_t begin,
                      int64_t end, float* y) {
  // Each weight chunk is widened once per tile (split_rows), so a row's bits do not depend on M.
  for (int64_t c = begin; c < end; c += kColumns) {
    const int cb = int(std::min<int64_t>(kColumns, end - c));
    split_rows(m, kMaxTileRows,
               [&](int64_t i, int rows) { tile_rows<Bits>(r, x + i * k, rows, k, c, cb, y + i * n + c, n); });
  }
}

thread_local std::vector<float> tls_permuted;

// x permuted to the codes' order (at 4 bits per 32 values: the even ones, then the odd ones, as the nibbles lie),
// then the column ranges over the threads.
template <typename Rows>
void multiply(const float* x, int64_t m, int64_t k, int64_t n, const Rows& rows, int bits, float* y) {
  if (tls_permuted.size() < size_t(m * k)) tls_permuted.resize(m * k);
  float* xp = tls_permuted.data();
  for (int64_t i = 0; i < m; ++i) {
    const float* src = x + i * k;
    float* dst = xp + i * k;
    if (bits == 4) {
      for (int64_t c = 0; c < k; c += 32) {
        for (int t = 0; t < 16; ++t) {
          dst[c + t] = src[c + 2 * t];
          dst[c + 16 + t] = src[c + 2 * t + 1];
        }
      }
    } else {
      std::memcpy(dst, src, k * sizeof(float));
    }
  }
  auto run = [&](int64_t begin, int64_t end) {
    switch (bits) {
      case 2: multiply_columns<2>(rows, xp, m, k, n, begin, end, y); break;
      case 3: multiply_columns<3>(rows, xp, m, k, n, begin, end, y); break;
      case 4: multiply_columns<4>(rows, xp, m, k, n, begin, end, y); break;
      case 5: multiply_columns<5>(rows, xp, m, k, n, begin, end, y); break;
      case 6: multiply_columns<6>(rows, xp, m, k, n, begin, end, y); break;
      default: multiply_columns<8>(rows, xp, m, k, n, begin, end, y); break;
    }
  };
  split_columns(n, kColumns, n * k * bits / 8, run);
}

}  // namespace

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
    float* y) {
  const AffineWeights<Scale> rows{w, w + n * k * bits / 8, scales, biases, k * bits / 8, k / group_size, group_size};
  multiply(x, m, k, n, rows, bits, y);
}

void kquant_matmul(const float* x, int64_t m, int64_t k, int64_t n, const KQuantWeights& w, int bits, float* y) {
  multiply(x, m, k, n, w, bits, y);
}

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
    float* y) {
  const int64_t groups = k / group_size, row_bytes = k * bits / 8;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int64_t c = 0; c < k; ++c) {
        const int64_t bit = (j * row_bytes) * 8 + c * bits;  // MLX's little-endian bit stream
        const unsigned pair = w[bit / 8] | (bit / 8 + 1 < n * row_bytes ? unsigned(w[bit / 8 + 1]) << 8 : 0u);
        const int q = int((pair >> (bit % 8)) & ((1u << bits) - 1));
        const int64_t g = j * groups + c / group_size;
        const double value = double(static_cast<float>(scales[g])) * q + double(static_cast<float>(biases[g]));
        sum += double(x[i * k + c]) * value;
      }
      y[i * n + j] = float(sum);
    }
  }
}

#define MLXSPEC_AFFINE(Scale)                                                                                        \
  template void affine_matmul<Scale>(const float*, int64_t, int64_t, int64_t, const uint8_t*, const Scale*,          \
                                     const Scale*, int, int, float*);                                                \
  template void affine_matmul_reference<Scale>(const float*, int64_t, int64_t, int64_t, const uint8_t*, const Scale*, \
                                               const Scale*, int, int, float*);

MLXSPEC_AFFINE(float)
MLXSPEC_AFFINE(mlx::core::bfloat16_t)
MLXSPEC_AFFINE(mlx::core::float16_t)

}  // namespace mlxspec
