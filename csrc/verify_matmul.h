// The verification matmul: y = x @ W.T for 1..32 rows of x (any M works; mlxspec routes up to 32), reading each weight once for all rows.
//
// Row i of the result is computed by the same sequence of operations whatever the number of rows,
// so a token's logits are bitwise the same when it is verified alone or with K drafted tokens.
#pragma once

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mlxspec {

using mlx::core::array;
using mlx::core::StreamOrDevice;

// x: [..., K] (float32/bfloat16/float16); w: [N, K] of x's dtype, or 16-bit under float32 x. Returns [..., N] of x's dtype.
array verify_matmul(const array& x, const array& w, StreamOrDevice s = {});

// mlx-lm's affine quantization: w packed uint32 [N, K * bits / 32], scales and biases [N, K / group_size].
array verify_qmatmul(
    const array& x,
    const array& w,
    const array& scales,
    const array& biases,
    int group_size,
    int bits,
    bool int8_activations = false,
    StreamOrDevice s = {});

// The scalar reference of verify_qmatmul (double accumulation, on the host): x [M, K] -> [M, N] float32.
array affine_reference(
    const array& x,
    const array& w,
    const array& scales,
    const array& biases,
    int group_size,
    int bits,
    bool int8_activations = false);

// The number of threads the kernel splits the output columns over.
int kernel_threads();

class VerifyMatmul : public mlx::core::UnaryPrimitive {
 public:
  // bits == 0: dense weights; 2..8: affine-quantized with the given group size, against int8 activations when
  // int8_activations (matmul_affine_q8.h).
  VerifyMatmul(mlx::core::Stream stream, int group_size, int bits, bool int8_activations = false)
      : UnaryPrimitive(stream), group_size_(group_size), bits_(bits), int8_activations_(int8_activations) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override;
  void eval_gpu(const std::vector<array>& inputs, array& out) override;

  const char* name() const override {
    return "VerifyMatmul";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

 private:
  int group_size_;
  int bits_;
  bool int8_activations_;
};

}  // namespace mlxspec
