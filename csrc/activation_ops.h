// A decoder layer's small ops, bit for bit as MLX's CPU build computes them (mlx_math.h), in one op each: the MLP's
// swiglu with its exps vectorized (MLX's x86 build runs them one lane at a time, about 30 ns a value, 0.3 ms for
// the 1.5B's 8,960-wide MLP), and the RMS norm that MLX's CPU runs as seven ops (its fallback).
#pragma once

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mlxspec {

using mlx::core::array;
using mlx::core::StreamOrDevice;

// mlx-lm's swiglu(gate, up) = silu(gate) * up for float32 arrays of one shape, bitwise.
array mlx_swiglu(const array& gate, const array& up, StreamOrDevice s = {});

// mx.fast.rms_norm(x, weight, eps) for float32 x [..., D] and weight [D], bitwise MLX's CPU fallback: per row the
// squares summed one at a time in index order, times float(1 / D), plus eps, 1 / sqrt, times x, times weight.
array mlx_rms_norm(const array& x, const array& weight, float eps, StreamOrDevice s = {});

class RmsNorm : public mlx::core::UnaryPrimitive {
 public:
  RmsNorm(mlx::core::Stream stream, float eps) : UnaryPrimitive(stream), eps_(eps) {}
  void eval_cpu(const std::vector<array>& inputs, array& out) override;
  void eval_gpu(const std::vector<array>& inputs, array& out) override;
  const char* name() const override {
    return "MlxRmsNorm";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override {
    return eps_ == static_cast<const RmsNorm&>(other).eps_;
  }

 private:
  float eps_;
};

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
