// CPU implementations of the sampling row ops (see sampling_ops.h). Rows are independent: a row's
// result never depends on the other rows, and rows are split over the kernel pool's threads.
#include "sampling_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/utils.h"
#include "cpu_common.h"
#include "thread_pool.h"
#include "mlx_math.h"
#include "vector_math.h"

namespace mlxspec {

using namespace mlx::core;

namespace {

float row_max(const float* x, int64_t v) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < v; ++i) m = std::max(m, x[i]);
  return m;
}

float logsumexp(const float* x, int64_t v) {
  const float m = row_max(x, v);
  if (!std::isfinite(m)) return m;  // all -inf (or a +inf/NaN present): nothing to normalize
  vfloat acc = {};
  int64_t i = 0;
  for (; i + kLanes <= v; i += kLanes) {
    vfloat chunk;
    std::memcpy(&chunk, x + i, sizeof(chunk));
    acc += exp_nonpositive(chunk - m);
  }
  float lanes[kLanes];
  std::memcpy(lanes, &acc, sizeof(acc));
  double total = 0;
  for (float lane : lanes) total += lane;
  for (; i < v; ++i) total += std::exp(double(x[i]) - m);
  return m + float(std::log(total));
}

// mx.logsumexp of one row as MLX's x86 CPU build computes it (mlx/backend/cpu/logsumexp.cpp, one SIMD lane), bit
// for bit: the max, then the sum of exp(x - max) one term at a time in index order, then log(sum) + max. Only the
// exps run vectorized, a block at a time into `scratch`; the sum keeps MLX's order.
MLXSPEC_NO_CONTRACT float mlx_row_logsumexp(const float* x, int64_t v) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  constexpr int64_t kBlock = 512;
  alignas(64) float scratch[kBlock];
  const float m = row_max(x, v);
  float normalizer = 0.0f;
  for (int64_t start = 0; start < v; start += kBlock) {
    const int64_t len = std::min(kBlock, v - start);
    for (int64_t i = 0; i < len; ++i) scratch[i] = mlx_exp(x[start + i] - m);
    for (int64_t i = 0; i < len; ++i) normalizer = normalizer + scratch[i];
  }
  return std::isinf(m) ? m : std::log(normalizer) + m;
}

// The row's `count` largest entries, best first (ties: lower index first). Two passes instead of a heap or a
// partition over all V: the count-th largest of the 64-wide block maxima is a value at least `count` entries
// reach, so only entries at or above it (a few times `count`, typically) are collected and sorted.
void top_row(const float* x, int64_t v, int count, float* values, uint32_t* indices) {
  constexpr int64_t kBlock = 64;
  thread_local std::vector<float> block_max;
  thread_local std::vector<std::pair<float, uint32_t>> kept;
  const int64_t blocks = (v + kBlock - 1) / kBlock;
  block_max.resize(blocks);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* start = x + b * kBlock;
    const int64_t len = std::min(kBlock, v - b * kBlock);
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < len; ++i) m = std::max(m, start[i]);
    block_max[b] = m;
  }
  float threshold = -std::numeric_limits<float>::infinity();
  if (count <= blocks) {
    std::nth_element(block_max.begin(), block_max.begin() + (count - 1), block_max.end(), std::greater<float>());
    threshold = block_max[count - 1];
  }
  kept.clear();
  for (int64_t i = 0; i < v; ++i) {
    if (x[i] >= threshold || (count > blocks)) kept.emplace_back(x[i], uint32_t(i));
  }
  auto better = [](const std::pair<float, uint32_t>& a, const std::pair<float, uint32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::partial_sort(kept.begin(), kept.begin() + count, kept.end(), better);
  for (int j = 0; j < count; ++j) {
    values[j] = kept[j].first;
    indices[j] = kept[j].second;
  }
}

template <typename F>
void for_each_row(int64_t rows, F&& body) {
  if (rows < 2) {
    for (int64_t r = 0; r < rows; ++r) body(r);
    return;
  }
  ForkJoinPool& pool = kernel_pool();
  const int parts = pool.threads();
  pool.run([&](int part) {
    for (int64_t r = part; r < rows; r += parts) body(r);
  });
}

void check_rows(const array& x, const char* op) {
  if (x.ndim() != 2 || x.dtype() != float32) {
    throw std::invalid_argument(std::string("[") + op + "] expects float32 rows [N, V].");
  }
}

}  // namespace

static array logsumexp_rows(const array& x, bool as_mlx, const char* op, StreamOrDevice s) {
  check_rows(x, op);
  auto stream = cpu_stream(s, op);
  return array(
      {x.shape(0)}, float32, std::make_shared<RowLogSumExp>(stream, as_mlx), {contiguous(x, false, stream)});
}

array row_logsumexp(const array& x, StreamOrDevice s) {
  return logsumexp_rows(x, false, "row_logsumexp", s);
}

array mlx_logsumexp(const array& x, StreamOrDevice s) {
  return logsumexp_rows(x, true, "mlx_logsumexp", s);
}

std::vector<array> top_candidates(const array& x, int count, StreamOrDevice s) {
  check_rows(x, "top_candidates");
  if (count < 1 || count > x.shape(1)) {
    throw std::invalid_argument("[top_candidates] count must be in 1..V.");
  }
  auto stream = cpu_stream(s, "top_candidates");
  Shape shape{x.shape(0), count};
  return array::make_arrays(
      {shape, shape}, {float32, uint32}, std::make_shared<TopCandidates>(stream, count), {contiguous(x, false, stream)});
}

void RowLogSumExp::eval_cpu(const std::vector<array>& inputs, array& out) {
  const array& x = inputs[0];
  out.set_data(allocator::malloc(out.nbytes()));
  auto& encoder = cpu::get_command_encoder(stream());
  encoder.set_input_array(x);
  encoder.set_output_array(out);
  const float* src = x.data<float>();
  float* dst = out.data<float>();
  const int64_t rows = x.shape(0), v = x.shape(1);
  const auto row = as_mlx_ ? &mlx_row_logsumexp : &logsumexp;
  encoder.dispatch([=]() { for_each_row(rows, [&](int64_t r) { dst[r] = row(src + r * v, v); }); });
}

void TopCandidates::eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) {
  const array& x = inputs[0];
  for (auto& o : outputs) o.set_data(allocator::malloc(o.nbytes()));
  auto& encoder = cpu::get_command_encoder(stream());
  encoder.set_input_array(x);
  for (auto& o : outputs) encoder.set_output_array(o);
  const float* src = x.data<float>();
  float* values = outputs[0].data<float>();
  uint32_t* indices = outputs[1].data<uint32_t>();
  const int64_t rows = x.shape(0), v = x.shape(1);
  const int count = count_;
  encoder.dispatch([=]() {
    for_each_row(rows, [&](int64_t r) { top_row(src + r * v, v, count, values + r * count, indices + r * count); });
  });
}

void RowLogSumExp::eval_gpu(const std::vector<array>&, array&) {
  throw std::runtime_error(std::string("[") + name() + "] runs on mx.cpu only.");
}

void TopCandidates::eval_gpu(const std::vector<array>&, std::vector<array>&) {
  throw std::runtime_error("[top_candidates] runs on mx.cpu only.");
}

}  // namespace mlxspec
