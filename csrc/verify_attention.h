// Attention for the few query rows of a decode or verify step, row-equivalent: a query row's output is bitwise the
// same whatever the number of rows in the call, and whatever masked keys lie among its keys. So a token verified
// with K drafted tokens (or inside a tree) gets the attention output it gets when decoded alone.
//
// BLAS attention has no such guarantee: OpenBLAS picks its kernel by the row count, so a verified row can differ
// from the same row decoded alone in the last bits, and greedy output then holds only up to near-ties.
#pragma once

#include <optional>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mlxspec {

using mlx::core::array;
using mlx::core::StreamOrDevice;

// q [B, Hq, L, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv], all float32 (any strides), Hq a multiple of Hkv.
// mask: none, or [B|1, Hq|1, L, S], bool (true attends) or float32 (added to the scaled scores).
// causal: query i attends keys j <= S - L + i (as MLX's "causal"); combined with mask when both are given.
// Returns [B, Hq, L, Dv] float32.
array verify_attention(
    const array& q,
    const array& k,
    const array& v,
    float scale,
    const std::optional<array>& mask,
    bool causal,
    StreamOrDevice s = {});

class VerifyAttention : public mlx::core::UnaryPrimitive {
 public:
  VerifyAttention(mlx::core::Stream stream, float scale, bool causal, bool has_mask)
      : UnaryPrimitive(stream), scale_(scale), causal_(causal), has_mask_(has_mask) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override;
  void eval_gpu(const std::vector<array>& inputs, array& out) override;

  const char* name() const override {
    return "VerifyAttention";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(const std::vector<array>& inputs) override;

 private:
  float scale_;
  bool causal_;
  bool has_mask_;
};

}  // namespace mlxspec
