// The AVX2 paths of the row-equivalent attention (verify_attention.cpp): one query row's scores against its keys,
// and its output from its probabilities, with the key's or value's dims in the 8 lanes, read in place.
#pragma once

#if defined(__AVX2__)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attention_problem.h"

namespace mlxspec {

// Eight keys' dot products with one query row, as one vector of eight scores. Each key's product is the same
// operations whatever its place among the eight: eight lanes over d (lane l sums d = l, l + 8, ... in order, then
// the tail d >= D8 one by one), then one fixed tree of pairwise sums. A key's score so depends only on q and that
// key, never on the keys beside it or on S, so a row's bits do not depend on the rows or keys that came with it.
inline __m256 eight_scores(const float* q, const float* const keys[8], int64_t D) {
  __m256 acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
  const int64_t D8 = D / 8 * 8;
  for (int64_t d = 0; d < D8; d += 8) {
    const __m256 qd = _mm256_loadu_ps(q + d);
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(keys[j] + d), acc[j]);
  }
  const __m256 s01 = _mm256_hadd_ps(acc[0], acc[1]), s23 = _mm256_hadd_ps(acc[2], acc[3]);
  const __m256 s45 = _mm256_hadd_ps(acc[4], acc[5]), s67 = _mm256_hadd_ps(acc[6], acc[7]);
  const __m256 t0 = _mm256_hadd_ps(s01, s23), t1 = _mm256_hadd_ps(s45, s67);
  __m256 sums = _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
  if (D8 < D) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, sums);
    for (int j = 0; j < 8; ++j)
      for (int64_t d = D8; d < D; ++d) lanes[j] = std::fma(q[d], keys[j][d], lanes[j]);
    sums = _mm256_load_ps(lanes);
  }
  return sums;
}

// Row r's scores against all S keys into scores[0, S): eight keys at a time, a short last group padded with a
// zero key (whose score is never read). Keys are read in place when their values are contiguous, else copied.
inline void row_scores(const AttentionProblem& p, int64_t b, int64_t kv_head, const float* q, float* scores, std::vector<float>& rows,
                const std::vector<float>& zeros) {
  const int64_t S = p.keys, D = p.dim;
  const bool contiguous = p.k.col == 1;
  if (!contiguous) rows.resize(8 * D);
  for (int64_t j0 = 0; j0 < S; j0 += 8) {
    const float* keys[8];
    for (int j = 0; j < 8; ++j) {
      if (j0 + j >= S) {
        keys[j] = zeros.data();
      } else if (contiguous) {
        keys[j] = p.k.at(b, kv_head, j0 + j);
      } else {
        const float* src = p.k.at(b, kv_head, j0 + j);
        for (int64_t d = 0; d < D; ++d) rows[j * D + d] = src[d * p.k.col];
        keys[j] = rows.data() + j * D;
      }
    }
    alignas(32) float out[8];
    _mm256_store_ps(out, _mm256_mul_ps(eight_scores(q, keys, D), _mm256_set1_ps(p.scale)));
    for (int j = 0; j < 8 && j0 + j < S; ++j) scores[j0 + j] = out[j];
  }
}

// Row r's output: sum over its attended keys, in key order, of p_j * v_j, 64 value dims at a time in registers
// (one FMA per lane per key; the tail dims by scalar FMAs, the same operation), then times `inverse`.
inline void row_values(const AttentionProblem& p, int64_t b, int64_t kv_head, const float* probabilities, float inverse, float* dst,
                std::vector<float>& row) {
  const int64_t S = p.keys, Dv = p.value_dim, Dv8 = Dv / 8 * 8;
  const bool contiguous = p.v.col == 1;
  for (int64_t d0 = 0; d0 < Dv8; d0 += 64) {
    const int vecs = int(std::min<int64_t>(64, Dv8 - d0) / 8);
    __m256 acc[8];
    for (int c = 0; c < 8; ++c) acc[c] = _mm256_setzero_ps();
    for (int64_t j = 0; j < S; ++j) {
      const float pj = probabilities[j];
      if (pj < 0.0f) continue;  // excluded
      const float* v = p.v.at(b, kv_head, j) + d0 * p.v.col;
      const __m256 weight = _mm256_set1_ps(pj);
      if (contiguous) {
        for (int c = 0; c < vecs; ++c) acc[c] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(v + 8 * c), acc[c]);
      } else {
        row.resize(64);
        for (int d = 0; d < 8 * vecs; ++d) row[d] = v[d * p.v.col];
        for (int c = 0; c < vecs; ++c) acc[c] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(row.data() + 8 * c), acc[c]);
      }
    }
    for (int c = 0; c < vecs; ++c) _mm256_storeu_ps(dst + d0 + 8 * c, _mm256_mul_ps(acc[c], _mm256_set1_ps(inverse)));
  }
  for (int64_t d = Dv8; d < Dv; ++d) {
    float acc = 0.0f;
    for (int64_t j = 0; j < S; ++j) {
      if (probabilities[j] >= 0.0f) acc = std::fma(probabilities[j], p.v.at(b, kv_head, j)[d * p.v.col], acc);
    }
    dst[d] = acc * inverse;
  }
}

}  // namespace mlxspec
#endif
