// The AVX-512 tiles of the affine kernel (matmul_affine.cpp), one per way of reading codes: 4-bit nibbles looked up
// (tile4_lookup), and 16 values at a time (tile16) from MLX's 2/3/5-bit stream looked up or 8-bit codes widened.
// Each computes the AVX2 tile's values, products and sums in its order, so a row's bits do not depend on which ran;
// matmul_affine.cpp picks them for the row counts where they measured faster.
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "affine_codes.h"
#include "matmul_affine.h"

namespace mlxspec::avx512 {


// A tile's accumulators zeroed and its CB weight rows' first bytes.
template <int RB, int CB, int CBW, typename Rows>
inline void start_tile(const Rows& r, int64_t first, __m512 (&acc)[RB][CB], const uint8_t* (&w)[CBW]) {
  static_assert(CB == CBW);
  for (int i = 0; i < RB; ++i)
    for (int j = 0; j < CB; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int j = 0; j < CB; ++j) w[j] = r.w + (first + j) * r.row_bytes;
}

// Each 16-lane accumulator ended as the AVX2 tile ends its two 8-lane ones (lanes 0-7 and 8-15): reduce8.
template <int RB, int CB>
inline void store_sums(const __m512 (&acc)[RB][CB], float* out, int64_t ldo) {
  for (int i = 0; i < RB; ++i) {
    for (int j = 0; j < CB; ++j) {
      const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[i][j]), 1));
      out[i * ldo + j] = reduce8(_mm512_castps512_ps256(acc[i][j]), high);
    }
  }
}

// At 4 bits on AVX-512 the codes are looked up, not converted: a group's 16 possible values scale * q + bias (one
// FMA, the same rounding as the AVX2 tile's) fill one register, and vpermps picks 16 of them at once by the low 4
// bits of each 32-bit lane, so a byte widened to a lane indexes its low nibble as it is and its high nibble shifted
// down. Per 32 values that is 4 instructions before the row's 2 FMAs, against 12 in the AVX2 tile, which bounds the
// one-row product. Lanes 0-7 and 8-15 of an accumulator take exactly the AVX2 tile's two accumulators' products in
// the same order, and the same reduce8 ends them: the bits are the AVX2 tile's.
template <int RB, int CB, typename Rows>
void tile4_lookup(const Rows& r, const float* x, int64_t k, int64_t first, float* out, int64_t ldo) {
  __m512 acc[RB][CB];
  const uint8_t* w[CB];
  start_tile(r, first, acc, w);
  const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  TileScales<CB, Rows> scales;
  for (int64_t g = 0; g < r.groups; ++g) {
    scales.load(r, first, g);
    __m512 values[CB];
    for (int j = 0; j < CB; ++j) {
      values[j] = _mm512_fmadd_ps(codes, _mm512_set1_ps(scales.scale_of(j)), _mm512_set1_ps(scales.bias_of(j)));
    }
    for (int64_t c = g * r.group_size; c < (g + 1) * r.group_size; c += 32) {
      if constexpr (RB == 1) prefetch_ahead<CB>(w, uint64_t(c) / 2);
      __m512 even[CB], odd[CB];
      for (int j = 0; j < CB; ++j) {
        const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[j] + c / 2)));
        even[j] = _mm512_permutexvar_ps(bytes, values[j]);
        odd[j] = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), values[j]);
      }
      // Each row of x loaded once for all CB weight rows: one load per FMA bounded the many-row tile (prefill).
      for (int i = 0; i < RB; ++i) {
        const __m512 x_even = _mm512_loadu_ps(x + i * k + c), x_odd = _mm512_loadu_ps(x + i * k + c + 16);
        for (int j = 0; j < CB; ++j) {
          acc[i][j] = _mm512_fmadd_ps(x_even, even[j], acc[i][j]);
          acc[i][j] = _mm512_fmadd_ps(x_odd, odd[j], acc[i][j]);
        }
      }
    }
  }
  store_sums<RB, CB>(acc, out, ldo);
}

// 2, 3 and 5 bits on AVX-512, MLX's bit stream looked up as the 4-bit tile looks up nibbles: 16 codes' bytes are
// spread one code to a 32-bit lane (the 16 bytes read copied to each 128-bit lane, one byte shuffle, one shift per
// lane, as StreamCodes does 8 at a time), and the lane's low bits index the group's values. At 5 bits the 32 values
// fill two registers and vpermt2ps picks by the low 5 bits; at 2 and 3 bits the 16-entry table repeats the 4 or 8
// values, so the bits above a code need no mask. The same values, products and order as the AVX2 tile: its bits.
template <int Bits>
struct StreamLookup {
  static_assert(Bits == 2 || Bits == 3 || Bits == 5);
  static constexpr int kBits = Bits;
  __m512i select, shifts;
  StreamLookup() {
    alignas(64) int8_t bytes[64];
    alignas(64) int32_t shift[16];
    for (int i = 0; i < 16; ++i) {
      const int first = Bits * i / 8;
      for (int b = 0; b < 4; ++b) bytes[i * 4 + b] = int8_t(std::min(first + b, 15));
      shift[i] = Bits * i - 8 * first;
    }
    select = _mm512_load_si512(bytes);
    shifts = _mm512_load_si512(shift);
  }
  // The group's dequantized values: two registers at 5 bits (codes 0-15, 16-31), one (repeating) below.
  static void values(__m512 s, __m512 b, __m512& low, __m512& high) {
    const __m512i index = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    if constexpr (Bits == 5) {
      low = _mm512_fmadd_ps(_mm512_cvtepi32_ps(index), s, b);
      high = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(index, _mm512_set1_epi32(16))), s, b);
    } else {  // entry i holds code i mod 2^Bits
      low = high = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(index, _mm512_set1_epi32((1 << Bits) - 1))), s, b);
    }
  }
  __m512 operator()(const uint8_t* p, const uint8_t* end, __m512 low, __m512 high) const {
    __m512i both;
    if (p + 16 <= end) {
      both = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    } else {
      alignas(16) uint8_t tail[16] = {};  // the weights' last bytes: never read past them
      std::memcpy(tail, p, 2 * Bits);
      both = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(tail)));
    }
    const __m512i lanes = _mm512_srlv_epi32(_mm512_shuffle_epi8(both, select), shifts);
    if constexpr (Bits == 5) return _mm512_permutex2var_ps(low, lanes, high);
    return _mm512_permutexvar_ps(lanes, low);
  }
};

// The tile of the codes read 16 values at a time (Codes: StreamLookup<2, 3 or 5> or Wide8): per group the codes'
// values (low, high) are prepared once per weight row, then each 16 codes become 16 weights for every row of x.
template <typename Codes, int RB, int CB, typename Rows>
void tile16(const Rows& r, const float* x, int64_t k, int64_t first, float* out, int64_t ldo) {
  constexpr int Bits = Codes::kBits;
  static const Codes lookup;
  __m512 acc[RB][CB];
  const uint8_t* w[CB];
  start_tile(r, first, acc, w);
  TileScales<CB, Rows> scales;
  for (int64_t g = 0; g < r.groups; ++g) {
    scales.load(r, first, g);
    __m512 low[CB], high[CB];
    for (int j = 0; j < CB; ++j) {
      lookup.values(_mm512_set1_ps(scales.scale_of(j)), _mm512_set1_ps(scales.bias_of(j)), low[j], high[j]);
    }
    for (int64_t c = g * r.group_size; c < (g + 1) * r.group_size; c += 16) {
      if constexpr (RB == 1) prefetch_ahead<CB>(w, uint64_t(c) * Bits / 8);
      // (Here each row of x is loaded once per weight row: loading it once for all of them measured slower.)
      for (int j = 0; j < CB; ++j) {
        const __m512 q = lookup(w[j] + uint64_t(c) * Bits / 8, r.end, low[j], high[j]);
        for (int i = 0; i < RB; ++i) acc[i][j] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i * k + c), q, acc[i][j]);
      }
    }
  }
  store_sums<RB, CB>(acc, out, ldo);
}

// At 8 bits: 16 codes widened and dequantized per instruction (no lookup: 256 values fill no register), lanes 0-7
// and 8-15 as the AVX2 tile's two accumulators take them, so again its bits. The tile's "values" are the group's
// scale and bias themselves.
struct Wide8 {
  static constexpr int kBits = 8;
  static void values(__m512 s, __m512 b, __m512& low, __m512& high) {
    low = s;
    high = b;
  }
  // 16 codes are 16 bytes, never past a row's end
  __m512 operator()(const uint8_t* p, const uint8_t*, __m512 scale, __m512 bias) const {
    const __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(codes), scale, bias);
  }
};

}  // namespace mlxspec::avx512
#endif  // __AVX512F__
