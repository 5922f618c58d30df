// Vector math the extension's CPU kernels share. Every function works lane by lane, so a value's result never
// depends on the lane it sits in or on its neighbours: what keeps a row's result independent of the call's rows.
#pragma once

#include <cstring>

#include "cpu_common.h"

namespace mlxspec {

// exp(x) for x <= 0: 2^n * p(r) with x = n ln2 + r (Cody-Waite split), |r| <= ln2 / 2, degree-6 polynomial.
// Relative error about 2e-7; inputs below -87 give 0.
inline vfloat exp_nonpositive(vfloat x) {
  const vfloat lower = x < -87.0f ? vfloat{} + 1 : vfloat{};  // lanes to flush to zero (as 0/1 masks)
  x = x < -87.0f ? vfloat{} - 87.0f : x;
  vfloat n = x * 1.44269504088896341f;
  vint ni = __builtin_convertvector(n + (n < 0 ? vfloat{} - 0.5f : vfloat{} + 0.5f), vint);  // round half away
  n = __builtin_convertvector(ni, vfloat);
  vfloat r = x - n * 0.693145751953125f;
  r = r - n * 1.428606765330187045e-06f;
  vfloat p = vfloat{} + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  vint bits = (ni + 127) << 23;
  vfloat scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return (p * scale) * (1.0f - lower);
}

}  // namespace mlxspec
