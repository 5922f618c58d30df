// Python bindings for the verify kernel (module mlxspec._verify_kernel).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "activation_ops.h"
#include "dequantize_rows.h"
#include "sampling_ops.h"
#include "verify_attention.h"
#include "verify_kquant.h"
#include "verify_matmul.h"

namespace nb = nanobind;
using namespace nb::literals;

#ifndef MLXSPEC_BUILT_WITH_MLX
#define MLXSPEC_BUILT_WITH_MLX "unknown"
#endif

NB_MODULE(_verify_kernel, m) {
  m.doc() = "mlxspec's verify kernel: 1..32-row matmuls reading weights once, row-equivalent attention, and sampling row ops.";
  m.attr("built_with_mlx") = MLXSPEC_BUILT_WITH_MLX;

  m.def("verify_matmul", &mlxspec::verify_matmul, "x"_a, "w"_a, nb::kw_only(), "stream"_a = nb::none(),
        "x @ w.T for float32/bfloat16/float16 x and w [N, K], row results independent of the row count.");
  m.def("verify_qmatmul", &mlxspec::verify_qmatmul, "x"_a, "w"_a, "scales"_a, "biases"_a, "group_size"_a, "bits"_a,
        nb::kw_only(), "int8_activations"_a = false, "stream"_a = nb::none(),
        "x @ dequantize(w).T for mlx-lm's affine weights (transpose=True layout); int8_activations=True quantizes "
        "x per block of 32 to int8 first (lossy, opt-in; 4, 5 and 8 bits).");
  m.def("verify_kquant_matmul", &mlxspec::verify_kquant_matmul, "x"_a, "w"_a, "sub_scales"_a, "sub_mins"_a,
        "super_scales"_a, "super_mins"_a, "bits"_a, nb::kw_only(), "stream"_a = nb::none(),
        "x @ dequantize(w).T for Q4_K/Q5_K super-blocks held factored (d, dmin per 256; sc, m per 32); bitwise "
        "verify_qmatmul's with the products d * sc and -dmin * m as float32 scales and biases.");
  m.def("dequantize_affine", &mlxspec::dequantize_affine, "w"_a, "scales"_a, "biases"_a, "group_size"_a, "bits"_a,
        nb::kw_only(), "stream"_a = nb::none(),
        "dequantize(w) as float32 [N, K], each value the kernel's own weight (scale * q + bias, one FMA).");
  m.def("dequantize_kquant", &mlxspec::dequantize_kquant, "w"_a, "sub_scales"_a, "sub_mins"_a, "super_scales"_a,
        "super_mins"_a, "bits"_a, nb::kw_only(), "stream"_a = nb::none(),
        "A K-quant matrix held factored as float32 [N, K], the values verify_kquant_matmul multiplies by.");
  m.def("verify_attention", &mlxspec::verify_attention, "q"_a, "k"_a, "v"_a, "scale"_a, "mask"_a = nb::none(),
        "causal"_a = false, nb::kw_only(), "stream"_a = nb::none(),
        "Attention for a step's few query rows, each row's output independent of the row count and masked keys.");
  m.def("row_logsumexp", &mlxspec::row_logsumexp, "x"_a, nb::kw_only(), "stream"_a = nb::none(),
        "log(sum(exp(x))) of each float32 row [N, V] -> [N].");
  m.def("mlx_logsumexp", &mlxspec::mlx_logsumexp, "x"_a, nb::kw_only(), "stream"_a = nb::none(),
        "mx.logsumexp of each float32 row [N, V] -> [N], bit for bit as MLX's x86 CPU build computes it.");
  m.def("mlx_swiglu", &mlxspec::mlx_swiglu, "gate"_a, "up"_a, nb::kw_only(), "stream"_a = nb::none(),
        "mlx-lm's swiglu(gate, up) for float32 arrays of one shape, bit for bit, its exps vectorized.");
  m.def("mlx_rms_norm", &mlxspec::mlx_rms_norm, "x"_a, "weight"_a, "eps"_a, nb::kw_only(), "stream"_a = nb::none(),
        "mx.fast.rms_norm(x, weight, eps) for float32 x [..., D] and weight [D], bit for bit MLX's CPU fallback.");
  m.def("top_candidates", &mlxspec::top_candidates, "x"_a, "count"_a, nb::kw_only(), "stream"_a = nb::none(),
        "(values [N, C], indices [N, C] uint32): each row's C largest, best first, ties by lower index.");
  m.def("affine_reference", &mlxspec::affine_reference, "x"_a, "w"_a, "scales"_a, "biases"_a, "group_size"_a,
        "bits"_a, "int8_activations"_a = false,
        "The scalar reference of verify_qmatmul, accumulated in double (for the tests).");
  m.def("threads", &mlxspec::kernel_threads, "Threads the kernel splits its columns over.");
}
