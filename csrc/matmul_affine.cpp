// Affine-quantized weights multiplied in registers (see matmul_affine.h).
//
// Layout of the work: the output columns (weight rows) are split into one contiguous range per thread,
// depending only on N. A tile holds RB rows of x and CB rows of w; for each group it widens the CB rows' codes
// (16 bytes at a time: 32 four-bit or 16 eight-bit codes) to float lanes and accumulates x * q, then adds
// scale * that to the row's total. At 4 bits the low nibbles of 16 bytes are the even values of 32 and the high
// nibbles the odd ones, so x is permuted once per call to match (even values first, then odd, per 32).
#include "matmul_affine.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "mlx/types/bf16.h"
#include "mlx/types/half_types.h"
#include "cpu_common.h"
#include "thread_pool.h"

namespace mlxspec {

namespace {

typedef uint8_t vbyte16 __attribute__((vector_size(16)));

constexpr int64_t kParallelBytes = 1 << 18;  // below this many weight bytes a fork-join costs more than it saves

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

inline vfloat widen(vbyte16 b) {
  return __builtin_convertvector(__builtin_convertvector(b, vint), vfloat);
}

// Codes of 32 values at 4 bits (16 bytes): the even values, then the odd ones.
inline void codes4(const uint8_t* p, vfloat& even, vfloat& odd) {
  vbyte16 b;
  std::memcpy(&b, p, sizeof(b));
  even = widen(b & 15);
  odd = widen(b >> 4);
}

inline vfloat codes8(const uint8_t* p) {
  vbyte16 b;
  std::memcpy(&b, p, sizeof(b));
  return widen(b);
}

template <typename Scale>
struct Rows {
  const uint8_t* w;  // packed codes, row_bytes a row
  const Scale* scales;
  const Scale* biases;
  int64_t row_bytes, groups, group_size;
};

// out[i * ldo + j] for RB rows of x (permuted, kp = k) and CB weight rows from `first`.
template <int Bits, int RB, int CB, typename Scale>
void tile(const Rows<Scale>& r, const float* x, const float* xsum, int64_t k, int64_t first, float* out, int64_t ldo) {
  vfloat total[RB][CB] = {};
  const uint8_t* w[CB];
  for (int j = 0; j < CB; ++j) w[j] = r.w + (first + j) * r.row_bytes;
  constexpr int kPerChunk = Bits == 4 ? 32 : 16;  // values per 16 bytes of codes
  for (int64_t g = 0; g < r.groups; ++g) {
    vfloat acc[RB][CB] = {};
    for (int64_t c = g * r.group_size; c < (g + 1) * r.group_size; c += kPerChunk) {
      if constexpr (Bits == 4) {
        vfloat even[CB], odd[CB];
        for (int j = 0; j < CB; ++j) codes4(w[j] + c / 2, even[j], odd[j]);
        for (int i = 0; i < RB; ++i) {
          const vfloat xe = load(x + i * k + c), xo = load(x + i * k + c + kLanes);
          for (int j = 0; j < CB; ++j) {
            acc[i][j] += xe * even[j];
            acc[i][j] += xo * odd[j];
          }
        }
      } else {
        vfloat q[CB];
        for (int j = 0; j < CB; ++j) q[j] = codes8(w[j] + c);
        for (int i = 0; i < RB; ++i) {
          const vfloat xv = load(x + i * k + c);
          for (int j = 0; j < CB; ++j) acc[i][j] += xv * q[j];
        }
      }
    }
    for (int j = 0; j < CB; ++j) {
      const float scale = static_cast<float>(r.scales[(first + j) * r.groups + g]);
      for (int i = 0; i < RB; ++i) total[i][j] += acc[i][j] * scale;
    }
  }
  for (int i = 0; i < RB; ++i) {
    for (int j = 0; j < CB; ++j) {
      const Scale* bias = r.biases + (first + j) * r.groups;
      float biased = 0.0f;  // sum over groups of bias * sum(x over the group), in group order
      for (int64_t g = 0; g < r.groups; ++g) biased += static_cast<float>(bias[g]) * xsum[i * r.groups + g];
      out[i * ldo + j] = reduce(total[i][j]) + biased;
    }
  }
}

template <int Bits, int RB, typename Scale>
void tile_columns(const Rows<Scale>& r, const float* x, const float* xsum, int64_t k, int64_t c, int cb, float* out,
                  int64_t ldo) {
  // Four weight rows a tile while few rows of x share them, two when more do (the accumulators must stay in
  // registers); either way each (i, j) pair is the same sequence of operations.
  constexpr int CB = RB <= 2 ? 4 : 2;
  for (int64_t done = 0; done < cb;) {
    const int step = int(std::min<int64_t>(CB, cb - done));
    const int64_t first = c + done;
    if (step == 4) {
      tile<Bits, RB, (CB >= 4 ? 4 : 1)>(r, x, xsum, k, first, out + done, ldo);
    } else if (step == 3) {
      tile<Bits, RB, (CB >= 3 ? 3 : 1)>(r, x, xsum, k, first, out + done, ldo);
    } else if (step == 2) {
      tile<Bits, RB, 2>(r, x, xsum, k, first, out + done, ldo);
    } else {
      tile<Bits, RB, 1>(r, x, xsum, k, first, out + done, ldo);
    }
    done += step;
  }
}

constexpr int kColumns = 4;  // weight rows a thread takes at a time (a multiple of every tile's CB)

template <int Bits, typename Scale>
void multiply_columns(const Rows<Scale>& r, const float* x, const float* xsum, int64_t m, int64_t k, int64_t n,
                      int64_t begin, int64_t end, float* y) {
  for (int64_t c = begin; c < end; c += kColumns) {
    const int cb = int(std::min<int64_t>(kColumns, end - c));
    for (int64_t i = 0; i < m;) {
      const int64_t rows = std::min<int64_t>(4, m - i);
      const float* xi = x + i * k;
      const float* si = xsum + i * r.groups;
      float* yi = y + i * n + c;
      switch (rows) {
        case 4: tile_columns<Bits, 4>(r, xi, si, k, c, cb, yi, n); break;
        case 3: tile_columns<Bits, 3>(r, xi, si, k, c, cb, yi, n); break;
        case 2: tile_columns<Bits, 2>(r, xi, si, k, c, cb, yi, n); break;
        default: tile_columns<Bits, 1>(r, xi, si, k, c, cb, yi, n); break;
      }
      i += rows;
    }
  }
}

thread_local std::vector<float> tls_permuted;
thread_local std::vector<float> tls_sums;

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
  const int64_t groups = k / group_size;
  if (tls_permuted.size() < size_t(m * k)) tls_permuted.resize(m * k);
  if (tls_sums.size() < size_t(m * groups)) tls_sums.resize(m * groups);
  float* xp = tls_permuted.data();
  float* xsum = tls_sums.data();
  for (int64_t i = 0; i < m; ++i) {
    const float* src = x + i * k;
    float* dst = xp + i * k;
    if (bits == 4) {  // per 32 values: the even ones, then the odd ones (the nibbles' order)
      for (int64_t c = 0; c < k; c += 32) {
        for (int t = 0; t < 16; ++t) {
          dst[c + t] = src[c + 2 * t];
          dst[c + 16 + t] = src[c + 2 * t + 1];
        }
      }
    } else {
      std::memcpy(dst, src, k * sizeof(float));
    }
    for (int64_t g = 0; g < groups; ++g) {
      float sum = 0.0f;
      for (int64_t c = g * group_size; c < (g + 1) * group_size; ++c) sum += src[c];
      xsum[i * groups + g] = sum;
    }
  }
  const Rows<Scale> rows{w, scales, biases, k * bits / 8, groups, group_size};
  const int64_t weight_bytes = n * k * bits / 8;
  const int parts = weight_bytes < kParallelBytes ? 1 : kernel_pool().threads();
  auto run = [&](int64_t begin, int64_t end) {
    if (bits == 4) {
      multiply_columns<4>(rows, xp, xsum, m, k, n, begin, end, y);
    } else {
      multiply_columns<8>(rows, xp, xsum, m, k, n, begin, end, y);
    }
  };
  if (parts == 1) {
    run(0, n);
    return;
  }
  // Column ranges depend on N only (a multiple of kColumns each), never on M.
  const int64_t per_part = (n + parts * kColumns - 1) / (parts * kColumns) * kColumns;
  kernel_pool().run([&](int part) {
    const int64_t begin = std::min<int64_t>(n, part * per_part);
    const int64_t end = std::min<int64_t>(n, begin + per_part);
    if (begin < end) run(begin, end);
  });
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
        const uint8_t byte = w[j * row_bytes + (bits == 4 ? c / 2 : c)];
        const int q = bits == 8 ? byte : (c % 2 ? byte >> 4 : byte & 15);
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
