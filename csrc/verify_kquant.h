// The verification matmul for K-quant weights held at the file's own size (ggml's Q4_K and Q5_K): the super-blocks'
// scales stay factored, d and dmin per 256 values and 6-bit sc and m per 32, and each group's scale d * sc and bias
// -dmin * m are formed in registers. Those products are exact in float32, so a row's bits equal verify_qmatmul's
// given them as float32 scales and biases, whatever the number of rows.
#pragma once

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mlxspec {

using mlx::core::array;
using mlx::core::StreamOrDevice;

// x: [..., K] float32, K a multiple of 256; w packed uint32 [N, K * bits / 32] (MLX's layout), bits 4 or 5;
// sub_scales, sub_mins uint8 [N, K / 32]; super_scales, super_mins float32 [N, K / 256]. Returns [..., N] float32.
array verify_kquant_matmul(
    const array& x,
    const array& w,
    const array& sub_scales,
    const array& sub_mins,
    const array& super_scales,
    const array& super_mins,
    int bits,
    StreamOrDevice s = {});

class VerifyKQuantMatmul : public mlx::core::UnaryPrimitive {
 public:
  VerifyKQuantMatmul(mlx::core::Stream stream, int bits) : UnaryPrimitive(stream), bits_(bits) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override;
  void eval_gpu(const std::vector<array>& inputs, array& out) override;

  const char* name() const override {
    return "VerifyKQuantMatmul";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override {
    return bits_ == static_cast<const VerifyKQuantMatmul&>(other).bits_;
  }
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

 private:
  int bits_;
};

}  // namespace mlxspec
