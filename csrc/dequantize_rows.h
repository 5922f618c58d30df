// Affine and K-quant weights widened to float32 rows, for a prefill's many rows: there a BLAS GEMM on the widened
// weights (MLX's matmul) does more FMAs a cycle than the verify kernel's tiles, which widen the codes again for
// every 8 rows of x. Each value is the tile's own dequantized weight, scale * q + bias by one FMA, so the widened
// matrix holds exactly the weights the kernel multiplies by; only the GEMM's order of sums differs.
#pragma once

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mlxspec {

using mlx::core::array;
using mlx::core::StreamOrDevice;

// w packed uint32 [N, K * bits / 32], scales and biases [N, K / group_size] (float32, bfloat16, float16) -> [N, K]
// float32.
array dequantize_affine(const array& w, const array& scales, const array& biases, int group_size, int bits,
                        StreamOrDevice s = {});

// A K-quant matrix held factored (verify_kquant.h's operands) -> [N, K] float32.
array dequantize_kquant(const array& w, const array& sub_scales, const array& sub_mins, const array& super_scales,
                        const array& super_mins, int bits, StreamOrDevice s = {});

class DequantizeRows : public mlx::core::UnaryPrimitive {
 public:
  // kquant: the inputs are verify_kquant_matmul's weights (group 32); else the affine ones.
  DequantizeRows(mlx::core::Stream stream, int group_size, int bits, bool kquant)
      : UnaryPrimitive(stream), group_size_(group_size), bits_(bits), kquant_(kquant) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override;
  void eval_gpu(const std::vector<array>& inputs, array& out) override;

  const char* name() const override {
    return "DequantizeRows";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override {
    const auto& o = static_cast<const DequantizeRows&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_ && kquant_ == o.kquant_;
  }
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

 private:
  int group_size_;
  int bits_;
  bool kquant_;
};

}  // namespace mlxspec
