// AVX2 helpers the affine kernels share (matmul_affine.cpp with float activations, matmul_affine_q8.cpp with int8
// ones, and the AVX-512 tiles of affine_tiles_avx512.h): widening codes, MLX's bit stream of 2, 3, 5 or 6 bits a
// value, the one fixed-order lane reduction, and the one-row tiles' prefetch hint.
#pragma once

#if defined(__AVX2__)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace mlxspec {

inline __m256 widen8(__m128i bytes) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
}

// Sixteen bytes of codes widened to float, eight values a vector, two ways with the same values (so a row's bits do
// not depend on which): widen8's lane-crossing vpmovzxbd, which Zen 3 issues one every two cycles and which bounds
// the one-row tile (1.3x slower in cache); or, InLane, the bytes loaded into both 128-bit lanes and spread by one
// in-lane byte shuffle a vector, which holds two more constants in registers: the AVX2 tiles of up to four rows take
// it (1.2-1.35x at M = 2-4 on Zen 3), five and six rows have no registers left for it.
template <bool InLane>
struct Codes16;

template <>
struct Codes16<false> {
  __m128i bytes;
  explicit Codes16(const uint8_t* p) : bytes(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))) {}
  Codes16(__m128i b) : bytes(b) {}
  __m256 low() const { return widen8(bytes); }  // bytes 0-7
  __m256 high() const { return widen8(_mm_srli_si128(bytes, 8)); }  // bytes 8-15
  Codes16 low_nibbles() const { return Codes16(_mm_and_si128(bytes, _mm_set1_epi8(15))); }
  Codes16 high_nibbles() const { return Codes16(_mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(15))); }
};

template <>
struct Codes16<true> {
  __m256i bytes;  // the same sixteen bytes in both lanes
  explicit Codes16(const uint8_t* p)
      : bytes(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))) {}
  Codes16(__m256i b) : bytes(b) {}
  __m256 low() const {
    return _mm256_cvtepi32_ps(_mm256_shuffle_epi8(bytes, _mm256_setr_epi8(
        0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1, 4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7, -1,
        -1, -1)));
  }
  __m256 high() const {
    return _mm256_cvtepi32_ps(_mm256_shuffle_epi8(bytes, _mm256_setr_epi8(
        8, -1, -1, -1, 9, -1, -1, -1, 10, -1, -1, -1, 11, -1, -1, -1, 12, -1, -1, -1, 13, -1, -1, -1, 14, -1, -1, -1,
        15, -1, -1, -1)));
  }
  Codes16 low_nibbles() const { return Codes16(_mm256_and_si256(bytes, _mm256_set1_epi8(15))); }
  Codes16 high_nibbles() const { return Codes16(_mm256_and_si256(_mm256_srli_epi16(bytes, 4), _mm256_set1_epi8(15))); }
};

inline float reduce8(__m256 a, __m256 b) {  // one fixed order for every dot product
  const __m256 sum = _mm256_add_ps(a, b);
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
  const __m128 quarter = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(quarter, _mm_movehdup_ps(quarter)));
}

// Sixteen codes of Bits (2, 3, 5 or 6) from 2 * Bits bytes of MLX's little-endian bit stream, as two vectors of
// eight: both halves of a register hold the 16 bytes read, each 32-bit lane takes the four bytes that hold its code
// (one byte shuffle), shifts it down and masks it. One 16-byte load: narrower copies stall store forwarding.
template <int Bits>
struct StreamCodes {
  __m256i select[2], shifts, mask;
  StreamCodes() {
    alignas(32) int8_t bytes[2][32];
    alignas(32) int32_t shift[8];
    for (int part = 0; part < 2; ++part) {
      for (int i = 0; i < 8; ++i) {
        const int first = Bits * i / 8;
        for (int b = 0; b < 4; ++b) bytes[part][i * 4 + b] = int8_t(std::min(part * Bits + first + b, 15));
        shift[i] = Bits * i - 8 * first;
      }
      select[part] = _mm256_load_si256(reinterpret_cast<const __m256i*>(bytes[part]));
    }
    shifts = _mm256_load_si256(reinterpret_cast<const __m256i*>(shift));
    mask = _mm256_set1_epi32((1 << Bits) - 1);
  }
  void operator()(const uint8_t* p, const uint8_t* end, __m256& first, __m256& second) const {
    const __m256i both = load_both_lanes(p, end);
    first = code_lanes(_mm256_shuffle_epi8(both, select[0]));
    second = code_lanes(_mm256_shuffle_epi8(both, select[1]));
  }
  // The same sixteen codes as 32-bit integers (the int8-activation path packs them to bytes).
  void ints(const uint8_t* p, const uint8_t* end, __m256i& first, __m256i& second) const {
    const __m256i both = load_both_lanes(p, end);
    first = int_lanes(_mm256_shuffle_epi8(both, select[0]));
    second = int_lanes(_mm256_shuffle_epi8(both, select[1]));
  }
  // Each branch broadcasts on its own: the common one then loads straight into both lanes (vbroadcasti128 from
  // memory), with no lane-crossing insert after the join.
  static __m256i load_both_lanes(const uint8_t* p, const uint8_t* end) {
    if (p + 16 <= end) return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    alignas(16) uint8_t tail[16] = {};  // the weights' last bytes: never read past them
    std::memcpy(tail, p, 2 * Bits);
    return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(tail)));
  }
  __m256i int_lanes(__m256i spread) const { return _mm256_and_si256(_mm256_srlv_epi32(spread, shifts), mask); }
  __m256 code_lanes(__m256i spread) const { return _mm256_cvtepi32_ps(int_lanes(spread)); }
};

// One row's tile streams CB weight rows at once, more streams than the hardware prefetcher follows well: at M = 1 a
// hint kPrefetchAhead bytes ahead of each row's chunk took 8-bit rows from about 9 to 12-13 GiB/s and plain
// decoding about 1.15-1.2x on the Zen 4 host of 2026-12-07 (docs/benchmarks.md); a hint once per cache line did
// not pay there. With more rows the tile is busier per byte and the hint was mixed. A hint past a row's end never
// faults, and it changes no bits; the address is formed as an integer, since a pointer past its array's end is not
// a valid C++ pointer.
constexpr uint64_t kPrefetchAhead = 4096;

template <int CB>
inline void prefetch_ahead(const uint8_t* const* w, uint64_t byte) {
  for (int j = 0; j < CB; ++j) {
    const uintptr_t ahead = reinterpret_cast<uintptr_t>(w[j]) + byte + kPrefetchAhead;
    _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T0);
  }
}

}  // namespace mlxspec
#endif
