// Element-wise activations of a decoder's MLP, bit for bit as MLX's CPU build computes them (mlx_math.h), but with
// the exps vectorized: MLX's x86 build runs them one lane at a time (about 30 ns a value, 0.3 ms for the 1.5B's
// 8,960-wide MLP, every layer, every step).
#pragma once

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mlxspec {

using mlx::core::array;
using mlx::core::StreamOrDevice;

// mlx-lm's swiglu(gate, up) = silu(gate) * up for float32 arrays of one shape, bitwise.
array mlx_swiglu(const array& gate, const array& up, StreamOrDevice s = {});

class Swiglu : public mlx::core::UnaryPrimitive {
 public:
  explicit Swiglu(mlx::core::Stream stream) : UnaryPrimitive(stream) {}
  void eval_cpu(const std::vector<array>& inputs, array& out) override;
  void eval_gpu(const std::vector<array>& inputs, array& out) override;
  const char* name() const override {
    return "MlxSwiglu";
  }
  bool is_equivalent(const mlx::core::Primitive&) const override {
    return true;
  }
};

}  // namespace mlxspec
