// One 16-bit float widened to float32 in hardware where the CPU has it. MLX's float16_t converts in software
// (about 20 integer operations), which cost more than decoding a group's codes: per group of 32 values the
// affine kernel widens a scale and a bias per weight row. F16C's conversion is exact, as the software one is,
// so the bits are the same either way.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "mlx/types/bf16.h"
#include "mlx/types/half_types.h"

namespace mlxspec {

inline float to_float(float value) { return value; }

inline float to_float(mlx::core::bfloat16_t value) {  // bfloat16 is float32's upper half
  uint16_t half;
  std::memcpy(&half, &value, sizeof(half));
  const uint32_t bits = uint32_t(half) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

inline float to_float(mlx::core::float16_t value) {
#if defined(__F16C__)
  uint16_t half;
  std::memcpy(&half, &value, sizeof(half));
  return _cvtsh_ss(half);
#else
  return static_cast<float>(value);
#endif
}

}  // namespace mlxspec
