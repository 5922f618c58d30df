// The K-quant verification matmul's MLX primitive (see verify_kquant.h); the arithmetic is matmul_affine.cpp's tile.
#include "verify_kquant.h"

#include <stdexcept>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "cpu_common.h"
#include "matmul_affine.h"

namespace mlxspec {

using namespace mlx::core;

namespace {

constexpr int kSuperBlock = 32 * kKQuantGroups;

Shape output_shape(const array& x, int64_t n) {
  Shape shape = x.shape();
  shape.back() = static_cast<int>(n);
  return shape;
}

}  // namespace

array verify_kquant_matmul(
    const array& x,
    const array& w,
    const array& sub_scales,
    const array& sub_mins,
    const array& super_scales,
    const array& super_mins,
    int bits,
    StreamOrDevice s) {
  if (bits != 4 && bits != 5) {
    throw std::invalid_argument("[verify_kquant_matmul] K-quant codes are 4 or 5 bits.");
  }
  if (w.dtype() != uint32 || w.ndim() != 2 || x.ndim() < 1 || x.dtype() != float32) {
    throw std::invalid_argument("[verify_kquant_matmul] expects float32 x [..., K] and packed uint32 w [N, K * bits / 32].");
  }
  const int64_t k = int64_t(w.shape(1)) * 32 / bits;
  const Shape groups{w.shape(0), int(k / 32)}, blocks{w.shape(0), int(k / kSuperBlock)};
  if (x.shape(-1) != k || k * bits != int64_t(w.shape(1)) * 32 || k % kSuperBlock != 0 ||
      sub_scales.shape() != groups || sub_mins.shape() != groups || super_scales.shape() != blocks ||
      super_mins.shape() != blocks) {
    throw std::invalid_argument("[verify_kquant_matmul] x, w and the scales disagree in shape.");
  }
  if (sub_scales.dtype() != uint8 || sub_mins.dtype() != uint8 || super_scales.dtype() != float32 ||
      super_mins.dtype() != float32) {
    throw std::invalid_argument("[verify_kquant_matmul] sc and m are uint8, d and dmin float32.");
  }
  auto stream = cpu_stream(s, "verify_kquant_matmul");
  std::vector<array> inputs;
  for (const array* a : {&x, &w, &sub_scales, &sub_mins, &super_scales, &super_mins}) {
    inputs.push_back(contiguous(*a, false, stream));
  }
  return array(output_shape(x, w.shape(0)), float32, std::make_shared<VerifyKQuantMatmul>(stream, bits), inputs);
}

void VerifyKQuantMatmul::eval_cpu(const std::vector<array>& inputs, array& out) {
  for (const auto& a : inputs) {
    if (!a.flags().row_contiguous) throw std::runtime_error("[verify_kquant_matmul] inputs must be row contiguous.");
  }
  out.set_data(allocator::malloc(out.nbytes()));
  auto& encoder = cpu::get_command_encoder(stream());
  for (const auto& a : inputs) encoder.set_input_array(a);
  encoder.set_output_array(out);
  const int64_t k = inputs[0].shape(-1), m = k == 0 ? 0 : int64_t(inputs[0].size()) / k, n = out.shape(-1);
  const auto* codes = inputs[1].data<uint8_t>();
  const int64_t row_bytes = k * bits_ / 8;
  const KQuantWeights w{codes,
                        codes + n * row_bytes,
                        inputs[2].data<uint8_t>(),
                        inputs[3].data<uint8_t>(),
                        inputs[4].data<float>(),
                        inputs[5].data<float>(),
                        row_bytes,
                        k / 32,
                        32};
  const float* x = inputs[0].data<float>();
  float* y = out.data<float>();
  const int bits = bits_;
  encoder.dispatch([=]() { kquant_matmul(x, m, k, n, w, bits, y); });
}

void VerifyKQuantMatmul::eval_gpu(const std::vector<array>&, array&) {
  throw std::runtime_error("[verify_kquant_matmul] has no GPU implementation in this build; it runs on mx.cpu.");
}

std::vector<Shape> VerifyKQuantMatmul::output_shapes(const std::vector<array>& inputs) {
  return {output_shape(inputs[0], inputs[1].shape(0))};
}

}  // namespace mlxspec
