// CPU implementations of the layer ops MLX computes slowly on the CPU (see activation_ops.h).
#include "activation_ops.h"

#include <stdexcept>
#include <string>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "cpu_common.h"
#include "mlx_math.h"

namespace mlxspec {

using namespace mlx::core;

namespace {

// One value at a time in MLX's order; GCC vectorizes the loop (the lanes never mix).
MLXSPEC_NO_CONTRACT void swiglu_values(const float* gate, const float* up, float* out, int64_t n) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = mlx_swiglu(gate[i], up[i]);
}

// Both ops' preamble: out allocated, inputs and out registered with the stream's encoder, then body(out's floats)
// dispatched on it.
template <typename Body>
void dispatch_float_output(Stream stream, const std::vector<array>& inputs, array& out, Body body) {
  out.set_data(allocator::malloc(out.nbytes()));
  auto& encoder = cpu::get_command_encoder(stream);
  for (const auto& input : inputs) encoder.set_input_array(input);
  encoder.set_output_array(out);
  float* dst = out.data<float>();
  encoder.dispatch([=]() { body(dst); });
}

}  // namespace

array mlx_swiglu(const array& gate, const array& up, StreamOrDevice s) {
  if (gate.dtype() != float32 || up.dtype() != float32 || gate.shape() != up.shape()) {
    throw std::invalid_argument("[mlx_swiglu] expects float32 gate and up of one shape.");
  }
  auto stream = cpu_stream(s, "mlx_swiglu");
  return array(gate.shape(), float32, std::make_shared<Swiglu>(stream),
               {contiguous(gate, false, stream), contiguous(up, false, stream)});
}

void Swiglu::eval_cpu(const std::vector<array>& inputs, array& out) {
  const float* gate = inputs[0].data<float>();
  const float* up = inputs[1].data<float>();
  const int64_t n = out.size();
  dispatch_float_output(stream(), inputs, out, [=](float* dst) { swiglu_values(gate, up, dst, n); });
}

array mlx_rms_norm(const array& x, const array& weight, float eps, StreamOrDevice s) {
  if (x.dtype() != float32 || weight.dtype() != float32 || x.ndim() < 1 || weight.ndim() != 1 ||
      weight.shape(0) != x.shape(-1)) {
    throw std::invalid_argument("[mlx_rms_norm] expects float32 x [..., D] and weight [D].");
  }
  auto stream = cpu_stream(s, "mlx_rms_norm");
  return array(x.shape(), float32, std::make_shared<RmsNorm>(stream, eps),
               {contiguous(x, false, stream), contiguous(weight, false, stream)});
}

void RmsNorm::eval_cpu(const std::vector<array>& inputs, array& out) {
  const float* x = inputs[0].data<float>();
  const float* weight = inputs[1].data<float>();
  const int64_t d = inputs[1].size(), rows = d == 0 ? 0 : out.size() / d;
  const float eps = eps_;
  dispatch_float_output(stream(), inputs, out, [=](float* dst) {
    for (int64_t r = 0; r < rows; ++r) mlx_rms_norm_row(x + r * d, weight, eps, d, dst + r * d);
  });
}

void RmsNorm::eval_gpu(const std::vector<array>&, array&) {
  throw std::runtime_error("[mlx_rms_norm] runs on mx.cpu only.");
}

void Swiglu::eval_gpu(const std::vector<array>&, array&) {
  throw std::runtime_error("[mlx_swiglu] runs on mx.cpu only.");
}

}  // namespace mlxspec
