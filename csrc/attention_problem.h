// One attention call as the kernel sees it (verify_attention.cpp): operands by strides, sizes, mask and output.
#pragma once

#include <cstdint>

namespace mlxspec {

struct Strided {
  const float* data;
  int64_t batch, head, row, col;  // strides in elements
  const float* at(int64_t b, int64_t h, int64_t r) const {
    return data + b * batch + h * head + r * row;
  }
};

struct AttentionProblem {
  int64_t batch, q_heads, kv_heads, rows, keys, dim, value_dim;
  float scale;
  bool causal;
  Strided q, k, v;
  // The mask, row contiguous [mask_batch, mask_heads, rows, keys]; kind 0 none, 1 bool, 2 additive float.
  int mask_kind = 0;
  const void* mask = nullptr;
  int64_t mask_batch = 1, mask_heads = 1;
  float* out;
};

}  // namespace mlxspec
