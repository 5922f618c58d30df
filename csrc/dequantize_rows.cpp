// Weights widened to float32 rows (see dequantize_rows.h): per group its scale and bias, per 16 codes one
// StreamCodes read (AVX2) or the bit stream read a value at a time (portable), and scale * q + bias by one FMA,
// as the tiles of matmul_affine.cpp form their weights.
#include "dequantize_rows.h"

#include <cmath>
#include <stdexcept>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/types/bf16.h"
#include "mlx/types/half_types.h"
#include "affine_codes.h"
#include "cpu_common.h"
#include "matmul_affine.h"
#include "thread_pool.h"

namespace mlxspec {

using namespace mlx::core;

namespace {

#if !defined(__AVX2__)
// Code c of a row, read from MLX's little-endian bit stream (any bits 2..8; the portable path).
inline int code_at(const uint8_t* row, const uint8_t* end, int64_t c, int bits) {
  const int64_t bit = c * bits;
  const uint8_t* p = row + bit / 8;
  const unsigned pair = p[0] | (p + 1 < end ? unsigned(p[1]) << 8 : 0u);
  return int((pair >> (bit % 8)) & ((1u << bits) - 1));
}
#endif

template <int Bits, typename Rows>
void widen_row(const Rows& r, int64_t row, float* out) {
  const uint8_t* codes = r.w + row * r.row_bytes;
#if defined(__AVX2__)
  static const StreamCodes<Bits> stream;
#endif
  for (int64_t g = 0; g < r.groups; ++g) {
    float scale, bias;
    r.group_scale(row, g, scale, bias);
    const int64_t begin = g * r.group_size, end = begin + r.group_size;
#if defined(__AVX2__)
    const __m256 s = _mm256_set1_ps(scale), b = _mm256_set1_ps(bias);
    for (int64_t c = begin; c < end; c += 16) {  // group sizes are multiples of 32
      __m256 q0, q1;
      stream(codes + uint64_t(c) * Bits / 8, r.end, q0, q1);
      _mm256_storeu_ps(out + c, _mm256_fmadd_ps(q0, s, b));
      _mm256_storeu_ps(out + c + 8, _mm256_fmadd_ps(q1, s, b));
    }
#else
    for (int64_t c = begin; c < end; ++c) out[c] = std::fma(float(code_at(codes, r.end, c, Bits)), scale, bias);
#endif
  }
}

template <typename Rows>
void widen_rows(const Rows& r, int bits, int64_t n, int64_t k, float* out) {
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      float* dst = out + row * k;
      switch (bits) {
        case 2: widen_row<2>(r, row, dst); break;
        case 3: widen_row<3>(r, row, dst); break;
        case 4: widen_row<4>(r, row, dst); break;
        case 5: widen_row<5>(r, row, dst); break;
        case 6: widen_row<6>(r, row, dst); break;
        default: widen_row<8>(r, row, dst); break;
      }
    }
  };
  run(0, n);  // on the calling thread: the pool would spin beside the GEMM that follows
}

Shape widened_shape(const array& w, int bits) {
  return {w.shape(0), int(int64_t(w.shape(1)) * 32 / bits)};
}

void check_codes(const array& w, int bits, const char* op) {
  if (w.dtype() != uint32 || w.ndim() != 2) {
    throw std::invalid_argument(std::string("[") + op + "] expects packed uint32 weights [N, K * bits / 32].");
  }
  if (bits < 2 || bits > 8 || bits == 7) {
    throw std::invalid_argument(std::string("[") + op + "] supports 2, 3, 4, 5, 6 and 8 bits.");
  }
}

}  // namespace

array dequantize_affine(const array& w, const array& scales, const array& biases, int group_size, int bits,
                        StreamOrDevice s) {
  check_codes(w, bits, "dequantize_affine");
  if (group_size != 32 && group_size != 64 && group_size != 128) {
    throw std::invalid_argument("[dequantize_affine] supports group sizes 32, 64 and 128.");
  }
  const int64_t k = int64_t(w.shape(1)) * 32 / bits;
  if (k * bits != int64_t(w.shape(1)) * 32 || k % group_size != 0 ||
      scales.shape() != Shape{w.shape(0), int(k / group_size)} || biases.shape() != scales.shape()) {
    throw std::invalid_argument("[dequantize_affine] w, scales and biases disagree in shape.");
  }
  const auto dtype = scales.dtype();
  if ((dtype != float32 && dtype != bfloat16 && dtype != float16) || biases.dtype() != dtype) {
    throw std::invalid_argument("[dequantize_affine] scales and biases must be float32, bfloat16 or float16.");
  }
  auto stream = cpu_stream(s, "dequantize_affine");
  return array(widened_shape(w, bits), float32, std::make_shared<DequantizeRows>(stream, group_size, bits, false),
               {contiguous(w, false, stream), contiguous(scales, false, stream), contiguous(biases, false, stream)});
}

array dequantize_kquant(const array& w, const array& sub_scales, const array& sub_mins, const array& super_scales,
                        const array& super_mins, int bits, StreamOrDevice s) {
  check_codes(w, bits, "dequantize_kquant");
  const int64_t k = int64_t(w.shape(1)) * 32 / bits, blocks = k / (32 * kKQuantGroups);
  const Shape groups{w.shape(0), int(k / 32)}, supers{w.shape(0), int(blocks)};
  if ((bits != 4 && bits != 5) || k % (32 * kKQuantGroups) != 0 || sub_scales.shape() != groups ||
      sub_mins.shape() != groups || super_scales.shape() != supers || super_mins.shape() != supers) {
    throw std::invalid_argument("[dequantize_kquant] 4- or 5-bit codes, and scales of their shapes.");
  }
  if (sub_scales.dtype() != uint8 || sub_mins.dtype() != uint8 || super_scales.dtype() != float32 ||
      super_mins.dtype() != float32) {
    throw std::invalid_argument("[dequantize_kquant] sc and m are uint8, d and dmin float32.");
  }
  auto stream = cpu_stream(s, "dequantize_kquant");
  std::vector<array> inputs;
  for (const array* a : {&w, &sub_scales, &sub_mins, &super_scales, &super_mins}) {
    inputs.push_back(contiguous(*a, false, stream));
  }
  return array(widened_shape(w, bits), float32, std::make_shared<DequantizeRows>(stream, 32, bits, true), inputs);
}

void DequantizeRows::eval_cpu(const std::vector<array>& inputs, array& out) {
  for (const auto& a : inputs) {
    if (!a.flags().row_contiguous) throw std::runtime_error("[dequantize_rows] inputs must be row contiguous.");
  }
  out.set_data(allocator::malloc(out.nbytes()));
  auto& encoder = cpu::get_command_encoder(stream());
  for (const auto& a : inputs) encoder.set_input_array(a);
  encoder.set_output_array(out);
  const int64_t n = out.shape(0), k = out.shape(1), row_bytes = k * bits_ / 8;
  const auto* codes = inputs[0].data<uint8_t>();
  float* y = out.data<float>();
  const int bits = bits_;
  if (kquant_) {
    const KQuantWeights r{codes, codes + n * row_bytes, inputs[1].data<uint8_t>(), inputs[2].data<uint8_t>(),
                          inputs[3].data<float>(), inputs[4].data<float>(), row_bytes, k / 32, 32};
    encoder.dispatch([=]() { widen_rows(r, bits, n, k, y); });
    return;
  }
  const int64_t groups = k / group_size_, size = group_size_;
  switch (inputs[1].dtype()) {
    case float32: {
      const AffineWeights<float> r{codes, codes + n * row_bytes, inputs[1].data<float>(), inputs[2].data<float>(),
                                   row_bytes, groups, size};
      encoder.dispatch([=]() { widen_rows(r, bits, n, k, y); });
      break;
    }
    case bfloat16: {
      const AffineWeights<bfloat16_t> r{codes, codes + n * row_bytes, inputs[1].data<bfloat16_t>(),
                                        inputs[2].data<bfloat16_t>(), row_bytes, groups, size};
      encoder.dispatch([=]() { widen_rows(r, bits, n, k, y); });
      break;
    }
    default: {
      const AffineWeights<float16_t> r{codes, codes + n * row_bytes, inputs[1].data<float16_t>(),
                                       inputs[2].data<float16_t>(), row_bytes, groups, size};
      encoder.dispatch([=]() { widen_rows(r, bits, n, k, y); });
      break;
    }
  }
}

void DequantizeRows::eval_gpu(const std::vector<array>&, array&) {
  throw std::runtime_error("[dequantize_rows] has no GPU implementation in this build; it runs on mx.cpu.");
}

std::vector<Shape> DequantizeRows::output_shapes(const std::vector<array>& inputs) {
  return {widened_shape(inputs[0], bits_)};
}

}  // namespace mlxspec
