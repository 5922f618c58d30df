// CPU implementation of the verification matmul (see verify_matmul.h).
//
// Layout of the work: the output columns (weight rows) are split into one contiguous range per
// thread, depending only on N. Each thread walks its range kColBlock weight rows at a time, turns
// them into float rows once (a no-op for float32; bf16 widening otherwise), and multiplies them with
// every row of x while they are hot in cache. Affine-quantized weights are multiplied in registers
// instead (matmul_affine.cpp). So memory
// holds each weight once for all M rows. Every dot product is one chain of 16-lane FMAs followed
// by the same reduction tree, so its bits never depend on M, on the tile, or on the thread.
#include "verify_matmul.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "mlx/allocator.h"
#include "mlx/transforms.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/utils.h"
#include "cpu_common.h"
#include "half_convert.h"
#include "matmul_affine.h"
#include "matmul_affine_q8.h"
#include "thread_pool.h"

namespace mlxspec {

using namespace mlx::core;

namespace {

constexpr int kRowBlock = 4;  // rows of x per micro-tile
constexpr int kColBlock = 4;  // weight rows (output columns) per micro-tile


inline vfloat load(const float* p) {
  vfloat v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store(float* p, vfloat v) {
  std::memcpy(p, &v, sizeof(v));
}

// One fixed reduction order for every dot product.
inline float reduce(vfloat v) {
  float lanes[kLanes];
  std::memcpy(lanes, &v, sizeof(v));
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int i = 0; i < width; ++i) lanes[i] += lanes[i + width];
  }
  return lanes[0];
}

// A span of raw weight bytes to prefetch while a tile computes: the next tile's rows. Without it
// memory idles while the second and later row blocks reuse a tile from cache.
struct Prefetch {
  const char* begin;
  int64_t bytes;
};

// out[i * ldo + j] = dot(x row i, w row j) for RB rows of x and CB weight rows, each kp long.
template <int RB, int CB>
void micro_tile(const float* x, int64_t kp, const float* const* w, float* out, int64_t ldo, Prefetch ahead) {
  vfloat acc[RB][CB] = {};
  const int64_t steps = kp / kLanes;
  // Fixed-point bytes of `ahead` per step, so each step touches about one new line.
  const int64_t step_bytes = steps ? (ahead.bytes << 16) / steps : 0;
  for (int64_t t = 0; t < steps; ++t) {
    const int64_t k = t * kLanes;
    if (step_bytes) __builtin_prefetch(ahead.begin + ((t * step_bytes) >> 16), 0, 2);
    vfloat wv[CB];
    for (int j = 0; j < CB; ++j) wv[j] = load(w[j] + k);
    for (int i = 0; i < RB; ++i) {
      vfloat xv = load(x + i * kp + k);
      for (int j = 0; j < CB; ++j) acc[i][j] += xv * wv[j];
    }
  }
  for (int i = 0; i < RB; ++i) {
    for (int j = 0; j < CB; ++j) out[i * ldo + j] = reduce(acc[i][j]);
  }
}

using TileFn = void (*)(const float*, int64_t, const float* const*, float*, int64_t, Prefetch);

template <int RB>
constexpr TileFn tile_row[kColBlock] = {&micro_tile<RB, 1>, &micro_tile<RB, 2>, &micro_tile<RB, 3>, &micro_tile<RB, 4>};
constexpr const TileFn* tile_table[kRowBlock] = {tile_row<1>, tile_row<2>, tile_row<3>, tile_row<4>};

inline int64_t padded(int64_t k) {
  return (k + kLanes - 1) / kLanes * kLanes;
}

// ---- weight sources: give float rows [row, row + count), each padded with zeros to kp ----

struct DenseFloat32 {
  const float* w;
  int64_t k;
  Prefetch raw(int64_t row, int64_t count) const {
    return {reinterpret_cast<const char*>(w + row * k), count * k * 4};
  }
  void rows(int64_t row, int count, int64_t kp, float* scratch, const float** out) const {
    for (int j = 0; j < count; ++j) {
      const float* src = w + (row + j) * k;
      if (k == kp) {
        out[j] = src;  // already a padded row: read it in place
        continue;
      }
      float* dst = scratch + j * kp;
      std::memcpy(dst, src, k * sizeof(float));
      std::fill(dst + k, dst + kp, 0.0f);
      out[j] = dst;
    }
  }
};

// Widening one row of 16-bit floats to float32: bf16 is float32's upper half, so a shift per lane.
inline void widen_row(const uint16_t* bf16, int64_t k, float* dst) {
  int64_t c = 0;
  for (; c + kLanes <= k; c += kLanes) {
    vhalf h;
    std::memcpy(&h, bf16 + c, sizeof(h));
    vuint bits = __builtin_convertvector(h, vuint) << 16;
    std::memcpy(dst + c, &bits, sizeof(bits));
  }
  for (; c < k; ++c) {
    uint32_t bits = uint32_t(bf16[c]) << 16;
    std::memcpy(dst + c, &bits, sizeof(bits));
  }
}

inline void widen_row(const float16_t* f16, int64_t k, float* dst) {
  int64_t c = 0;
#if defined(__F16C__)
  for (; c + 8 <= k; c += 8) {  // exact in hardware, as the software conversion below is
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(f16 + c));
    _mm256_storeu_ps(dst + c, _mm256_cvtph_ps(h));
  }
#endif
  for (; c < k; ++c) dst[c] = to_float(f16[c]);
}

// bfloat16 (stored as uint16_t) or float16 weights, widened into the scratch rows.
template <typename Half>
struct DenseHalf {
  const Half* w;
  int64_t k;
  Prefetch raw(int64_t row, int64_t count) const {
    return {reinterpret_cast<const char*>(w + row * k), count * k * 2};
  }
  void rows(int64_t row, int count, int64_t kp, float* scratch, const float** out) const {
    for (int j = 0; j < count; ++j) {
      float* dst = scratch + j * kp;
      widen_row(w + (row + j) * k, k, dst);
      std::fill(dst + k, dst + kp, 0.0f);
      out[j] = dst;
    }
  }
};

thread_local std::vector<float> tls_scratch;

// y[m][n] (float) = x_padded[m][kp] @ weights.T over the columns [col_begin, col_end).
template <typename Weights>
void multiply_columns(
    const Weights& weights,
    const float* xp,
    int64_t m,
    int64_t kp,
    int64_t n,
    int64_t col_begin,
    int64_t col_end,
    float* y) {
  if (tls_scratch.size() < size_t(kColBlock * kp)) tls_scratch.resize(kColBlock * kp);
  float* scratch = tls_scratch.data();
  const float* w_rows[kColBlock];
  for (int64_t c = col_begin; c < col_end; c += kColBlock) {
    const int cb = int(std::min<int64_t>(kColBlock, col_end - c));
    weights.rows(c, cb, kp, scratch, w_rows);
    // Spread the next tile's prefetch over this tile's row blocks.
    const Prefetch next = weights.raw(c + cb, std::min<int64_t>(kColBlock, col_end - c - cb));
    const int64_t blocks = (m + kRowBlock - 1) / kRowBlock;
    for (int64_t r = 0, b = 0; r < m; r += kRowBlock, ++b) {
      const int rb = int(std::min<int64_t>(kRowBlock, m - r));
      const Prefetch slice{next.begin + next.bytes * b / blocks, next.bytes / blocks};
      tile_table[rb - 1][cb - 1](xp + r * kp, kp, w_rows, y + r * n + c, n, slice);
    }
  }
}

template <typename Weights>
void multiply(const Weights& weights, const float* xp, int64_t m, int64_t kp, int64_t n, int64_t weight_bytes, float* y) {
  split_columns(n, kColBlock, weight_bytes,
                [&](int64_t begin, int64_t end) { multiply_columns(weights, xp, m, kp, n, begin, end, y); });
}

template <typename T>
void widen_rows(const T* x, int64_t m, int64_t k, int64_t kp, float* xp) {
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < k; ++c) xp[r * kp + c] = static_cast<float>(x[r * k + c]);
    std::fill(xp + r * kp + k, xp + (r + 1) * kp, 0.0f);
  }
}

template <typename T>
void narrow_rows(const float* y, int64_t count, T* out) {
  for (int64_t i = 0; i < count; ++i) out[i] = static_cast<T>(y[i]);
}

struct Problem {
  Dtype x_dtype = float32;
  Dtype w_dtype = float32;  // the dense weights' dtype, or the scales' dtype when quantized
  int64_t m, k, n;
  int group_size, bits;
  bool int8_activations = false;  // quantized weights against int8 activations (matmul_affine_q8.h)
  const char* x;
  const char* w;
  const char* scales;
  const char* biases;
  char* out;
};

template <typename Scale>
void run_affine(const Problem& p, const float* xp, float* y) {
  // Quantized K is a multiple of the group (>= 32), so x needs no padding: the rows are xp as they are.
  const auto* codes = reinterpret_cast<const uint8_t*>(p.w);
  const auto* scales = reinterpret_cast<const Scale*>(p.scales);
  const auto* biases = reinterpret_cast<const Scale*>(p.biases);
  if (p.int8_activations) {
    affine_matmul_q8(xp, p.m, p.k, p.n, codes, scales, biases, p.group_size, p.bits, y);
  } else {
    affine_matmul(xp, p.m, p.k, p.n, codes, scales, biases, p.group_size, p.bits, y);
  }
}

thread_local std::vector<float> tls_x;
thread_local std::vector<float> tls_y;

void run_problem(const Problem& p) {
  const int64_t kp = padded(p.k);
  if (tls_x.size() < size_t(p.m * kp)) tls_x.resize(p.m * kp);
  float* xp = tls_x.data();
  switch (p.x_dtype) {
    case float32: widen_rows(reinterpret_cast<const float*>(p.x), p.m, p.k, kp, xp); break;
    case bfloat16: widen_rows(reinterpret_cast<const bfloat16_t*>(p.x), p.m, p.k, kp, xp); break;
    default: widen_rows(reinterpret_cast<const float16_t*>(p.x), p.m, p.k, kp, xp); break;
  }
  float* y = reinterpret_cast<float*>(p.out);
  if (p.x_dtype != float32) {
    if (tls_y.size() < size_t(p.m * p.n)) tls_y.resize(p.m * p.n);
    y = tls_y.data();
  }
  if (p.bits == 0) {
    const int64_t elements = p.n * p.k;
    switch (p.w_dtype) {
      case float32:
        multiply(DenseFloat32{reinterpret_cast<const float*>(p.w), p.k}, xp, p.m, kp, p.n, elements * 4, y);
        break;
      case bfloat16:
        multiply(DenseHalf<uint16_t>{reinterpret_cast<const uint16_t*>(p.w), p.k}, xp, p.m, kp, p.n, elements * 2, y);
        break;
      default:
        multiply(DenseHalf<float16_t>{reinterpret_cast<const float16_t*>(p.w), p.k}, xp, p.m, kp, p.n, elements * 2, y);
        break;
    }
  } else {
    switch (p.w_dtype) {
      case float32: run_affine<float>(p, xp, y); break;
      case bfloat16: run_affine<bfloat16_t>(p, xp, y); break;
      default: run_affine<float16_t>(p, xp, y); break;
    }
  }
  if (p.x_dtype == bfloat16) narrow_rows(y, p.m * p.n, reinterpret_cast<bfloat16_t*>(p.out));
  if (p.x_dtype == float16) narrow_rows(y, p.m * p.n, reinterpret_cast<float16_t*>(p.out));
}

bool is_float(Dtype d) {
  return d == float32 || d == bfloat16 || d == float16;
}

Shape output_shape(const array& x, int64_t n) {
  Shape shape = x.shape();
  shape.back() = static_cast<int>(n);
  return shape;
}

template <typename Scale>
void reference_of(const array& xf, int64_t m, int64_t k, int64_t n, const uint8_t* codes, const Scale* scales,
                  const Scale* biases, int group_size, int bits, bool int8_activations, float* y) {
  if (int8_activations) {
    affine_matmul_q8_reference(xf.data<float>(), m, k, n, codes, scales, biases, group_size, bits, y);
  } else {
    affine_matmul_reference(xf.data<float>(), m, k, n, codes, scales, biases, group_size, bits, y);
  }
}

}  // namespace

ForkJoinPool& kernel_pool() {
  static ForkJoinPool instance(kernel_threads());
  return instance;
}

int kernel_threads() {
  if (const char* env = std::getenv("MLXSPEC_KERNEL_THREADS")) {
    int t = std::atoi(env);
    if (t > 0) return t;
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : int(hw);
}

array verify_matmul(const array& x, const array& w, StreamOrDevice s) {
  if (w.ndim() != 2 || x.ndim() < 1 || x.shape(-1) != w.shape(1)) {
    throw std::invalid_argument("[verify_matmul] expects x [..., K] and w [N, K].");
  }
  // One float dtype, or float32 rows against 16-bit weights (a bf16 checkpoint kept 16-bit on the CPU): the
  // weights widen exactly, so the product's bits are those of the same weights held as float32.
  if (!is_float(x.dtype()) || !is_float(w.dtype()) || (x.dtype() != w.dtype() && x.dtype() != float32)) {
    throw std::invalid_argument(
        "[verify_matmul] x and w must share one float dtype (float32, bfloat16, float16), or x be float32.");
  }
  auto stream = cpu_stream(s, "verify_matmul");
  return array(
      output_shape(x, w.shape(0)),
      x.dtype(),
      std::make_shared<VerifyMatmul>(stream, 0, 0),
      {contiguous(x, false, stream), contiguous(w, false, stream)});
}

array verify_qmatmul(
    const array& x,
    const array& w,
    const array& scales,
    const array& biases,
    int group_size,
    int bits,
    bool int8_activations,
    StreamOrDevice s) {
  if (bits < 2 || bits > 8 || bits == 7) {
    throw std::invalid_argument("[verify_qmatmul] supports 2, 3, 4, 5, 6 and 8 bits.");
  }
  if (int8_activations && !affine_q8_supported(bits)) {
    throw std::invalid_argument("[verify_qmatmul] int8 activations take 4-, 5- and 8-bit weights.");
  }
  if (group_size != 32 && group_size != 64 && group_size != 128) {
    throw std::invalid_argument("[verify_qmatmul] supports group sizes 32, 64 and 128.");
  }
  if (w.dtype() != uint32 || w.ndim() != 2 || x.ndim() < 1) {
    throw std::invalid_argument("[verify_qmatmul] expects packed uint32 weights [N, K * bits / 32].");
  }
  const int64_t k = int64_t(w.shape(1)) * 32 / bits;
  if (x.shape(-1) != k || k * bits != int64_t(w.shape(1)) * 32 || k % group_size != 0 || scales.shape() != Shape{w.shape(0), int(k / group_size)} ||
      biases.shape() != scales.shape()) {
    throw std::invalid_argument("[verify_qmatmul] x, w, scales and biases disagree in shape.");
  }
  if (!is_float(x.dtype()) || !is_float(scales.dtype()) || biases.dtype() != scales.dtype()) {
    throw std::invalid_argument("[verify_qmatmul] x, scales and biases must be float32, bfloat16 or float16.");
  }
  auto stream = cpu_stream(s, "verify_qmatmul");
  return array(
      output_shape(x, w.shape(0)),
      x.dtype(),
      std::make_shared<VerifyMatmul>(stream, group_size, bits, int8_activations),
      {contiguous(x, false, stream),
       contiguous(w, false, stream),
       contiguous(scales, false, stream),
       contiguous(biases, false, stream)});
}

array affine_reference(
    const array& x,
    const array& w,
    const array& scales,
    const array& biases,
    int group_size,
    int bits,
    bool int8_activations) {
  array xf = astype(x, float32, Device::cpu);
  std::vector<array> inputs{xf, w, scales, biases};
  eval(inputs);
  const int64_t k = xf.shape(-1), m = int64_t(xf.size()) / k, n = w.shape(0);
  std::vector<float> y(m * n);
  const auto* codes = w.data<uint8_t>();
  switch (scales.dtype()) {
    case float32: reference_of(xf, m, k, n, codes, scales.data<float>(), biases.data<float>(), group_size, bits,
                               int8_activations, y.data()); break;
    case bfloat16: reference_of(xf, m, k, n, codes, scales.data<bfloat16_t>(), biases.data<bfloat16_t>(), group_size,
                                bits, int8_activations, y.data()); break;
    default: reference_of(xf, m, k, n, codes, scales.data<float16_t>(), biases.data<float16_t>(), group_size, bits,
                          int8_activations, y.data()); break;
  }
  return array(y.begin(), Shape{int(m), int(n)}, float32);
}

void VerifyMatmul::eval_cpu(const std::vector<array>& inputs, array& out) {
  const array& x = inputs[0];
  const array& w = inputs[1];
  for (const auto& a : inputs) {
    if (!a.flags().row_contiguous) throw std::runtime_error("[verify_matmul] inputs must be row contiguous.");
  }
  out.set_data(allocator::malloc(out.nbytes()));
  auto& encoder = cpu::get_command_encoder(stream());
  for (const auto& a : inputs) encoder.set_input_array(a);
  encoder.set_output_array(out);

  Problem p;
  p.x_dtype = x.dtype();
  p.k = x.shape(-1);
  p.m = p.k == 0 ? 0 : int64_t(x.size()) / p.k;
  p.n = out.shape(-1);
  p.group_size = group_size_;
  p.bits = bits_;
  p.int8_activations = int8_activations_;
  p.x = x.data<char>();
  p.w = w.data<char>();
  p.scales = bits_ ? inputs[2].data<char>() : nullptr;
  p.biases = bits_ ? inputs[3].data<char>() : nullptr;
  p.w_dtype = bits_ ? inputs[2].dtype() : w.dtype();
  p.out = out.data<char>();
  encoder.dispatch([p]() { run_problem(p); });
}

void VerifyMatmul::eval_gpu(const std::vector<array>&, array&) {
  throw std::runtime_error("[verify_matmul] has no GPU implementation in this build; it runs on mx.cpu.");
}

bool VerifyMatmul::is_equivalent(const Primitive& other) const {
  const auto& o = static_cast<const VerifyMatmul&>(other);
  return group_size_ == o.group_size_ && bits_ == o.bits_ && int8_activations_ == o.int8_activations_;
}

std::vector<Shape> VerifyMatmul::output_shapes(const std::vector<array>& inputs) {
  const array& w = inputs[1];
  return {output_shape(inputs[0], w.shape(0))};
}

}  // namespace mlxspec
