// What the extension's CPU kernels share: the 16-lane vector types and the CPU-stream check.
#pragma once

#include <stdexcept>
#include <string>

#include "mlx/utils.h"

namespace mlxspec {

constexpr int kLanes = 16;
typedef float vfloat __attribute__((vector_size(64)));
typedef int32_t vint __attribute__((vector_size(64)));
typedef uint32_t vuint __attribute__((vector_size(64)));
typedef uint16_t vhalf __attribute__((vector_size(32)));
typedef uint8_t vbyte __attribute__((vector_size(16)));

// The stream `s` names, refused unless it is a CPU stream (these kernels have no GPU implementation).
inline mlx::core::Stream cpu_stream(mlx::core::StreamOrDevice s, const char* op) {
  auto stream = mlx::core::to_stream(s);
  if (stream.device != mlx::core::Device::cpu) {
    throw std::invalid_argument(std::string("[") + op + "] runs on the CPU; pass stream=mx.cpu.");
  }
  return stream;
}

}  // namespace mlxspec
