// MLX's own CPU math, one lane, bit for bit as its x86 build computes it: what lets a kernel op stand in for an MLX op
// without changing a single output bit. Written lane by lane so that GCC vectorizes the loops calling it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace mlxspec {

// No contraction in MLX's exp and sum: a product fused into the next add rounds once where MLX rounds twice (GCC:
// this attribute; clang: the pragma in each body). The files using these are compiled without trapping math
// (CMakeLists.txt): that changes no value, but with it GCC keeps the selects as branches and vectorizes no loop.
#if defined(__clang__)
#define MLXSPEC_NO_CONTRACT
#else
#define MLXSPEC_NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#endif
// MLX's Cephes exp (mlx/backend/cpu/simd/math.h) as its x86 build runs it, one lane: x * log2(e) in float, the
// integer part by a floor in double, the fraction's polynomial by correctly rounded fmas, and the power of two by
// bits. ipart is clamped before the int conversion only where the result is overridden anyway.
MLXSPEC_NO_CONTRACT inline float mlx_exp(float x_init) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  const float x = x_init * 1.442695f;
  const float ipart = float(std::floor(double(x) + 0.5));
  const float fpart = x - ipart;
  float p = 1.535336188319500e-4f;
  p = std::fma(p, fpart, 1.339887440266574e-3f);
  p = std::fma(p, fpart, 9.618437357674640e-3f);
  p = std::fma(p, fpart, 5.550332471162809e-2f);
  p = std::fma(p, fpart, 2.402264791363012e-1f);
  p = std::fma(p, fpart, 6.931472028550421e-1f);
  p = std::fma(p, fpart, 1.000000000000000f);
  const int32_t bits = (int32_t(std::clamp(ipart, -200.0f, 200.0f)) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  float result = std::isnan(x_init) ? x_init : scale * p;
  result = x_init > 88.0f ? std::numeric_limits<float>::infinity() : result;
  return x_init < -88.0f ? 0.0f : result;
}

// MLX's Sigmoid (mlx/backend/cpu/unary_ops.h): y = 1 / (1 + exp(|x|)), then y below zero and 1 - y above.
MLXSPEC_NO_CONTRACT inline float mlx_sigmoid(float x) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  const float y = 1.0f / (1.0f + mlx_exp(std::fabs(x)));
  const float complement = 1.0f - y;  // formed whatever x is: a select, not a branch, so the loops vectorize
  return x < 0.0f ? y : complement;
}

// mlx-lm's swiglu, silu(gate) * up = (gate * sigmoid(gate)) * up, in its order of roundings.
MLXSPEC_NO_CONTRACT inline float mlx_swiglu(float gate, float up) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  return (gate * mlx_sigmoid(gate)) * up;
}

// One row of MLX's CPU rms_norm fallback (mlx/fast.cpp): square, mean (a sum one term at a time, MLX's x86 reduce
// having one lane, then times float(1 / D)), plus eps, rsqrt as 1 / sqrt, then x times it, then times the weight.
MLXSPEC_NO_CONTRACT inline void mlx_rms_norm_row(const float* x, const float* weight, float eps, int64_t d, float* out) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  float sum = 0.0f;
  for (int64_t i = 0; i < d; ++i) {
    const float square = x[i] * x[i];
    sum = sum + square;
  }
  const float mean = (0.0f + sum) * float(1.0 / double(d));
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < d; ++i) out[i] = (x[i] * scale) * weight[i];
}

}  // namespace mlxspec
