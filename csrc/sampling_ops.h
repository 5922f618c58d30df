// Row reductions that sampling needs at real vocabularies (128k-262k tokens), where MLX's CPU exp and
// argpartition cost more than a small target's forward pass.
#pragma once

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mlxspec {

using mlx::core::array;
using mlx::core::StreamOrDevice;

// x: [N, V] float32. Returns [N] float32: log(sum(exp(x))) per row (max-shifted, vectorized exp).
array row_logsumexp(const array& x, StreamOrDevice s = {});

// x: [N, V] float32. Returns [N] float32: mx.logsumexp(x, axis=-1) bit for bit as MLX's x86 CPU build computes it
// (its exps vectorized, its sum still one term at a time in index order).
array mlx_logsumexp(const array& x, StreamOrDevice s = {});

// x: [N, V] float32. Returns (values [N, C] float32, indices [N, C] uint32): each row's C largest entries,
// sorted by value (descending), ties by index (ascending).
std::vector<array> top_candidates(const array& x, int count, StreamOrDevice s = {});

// as_mlx: MLX's own loop (mlx_logsumexp), else the faster lane-summed one (row_logsumexp).
class RowLogSumExp : public mlx::core::UnaryPrimitive {
 public:
  RowLogSumExp(mlx::core::Stream stream, bool as_mlx) : UnaryPrimitive(stream), as_mlx_(as_mlx) {}
  void eval_cpu(const std::vector<array>& inputs, array& out) override;
  void eval_gpu(const std::vector<array>& inputs, array& out) override;
  const char* name() const override {
    return as_mlx_ ? "MlxLogSumExp" : "RowLogSumExp";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override {
    return as_mlx_ == static_cast<const RowLogSumExp&>(other).as_mlx_;
  }

 private:
  bool as_mlx_;
};

class TopCandidates : public mlx::core::Primitive {
 public:
  TopCandidates(mlx::core::Stream stream, int count) : Primitive(stream), count_(count) {}
  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override;
  void eval_gpu(const std::vector<array>& inputs, std::vector<array>& outputs) override;
  const char* name() const override {
    return "TopCandidates";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override {
    return count_ == static_cast<const TopCandidates&>(other).count_;
  }

 private:
  int count_;
};

}  // namespace mlxspec
