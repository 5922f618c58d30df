// Python bindings for the verify kernel (module mlxspec._verify_kernel).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>

#include "verify_matmul.h"

namespace nb = nanobind;
using namespace nb::literals;

#ifndef MLXSPEC_BUILT_WITH_MLX
#define MLXSPEC_BUILT_WITH_MLX "unknown"
#endif

NB_MODULE(_verify_kernel, m) {
  m.doc() = "mlxspec's verification matmul: 1..16 rows of x against weights read once.";
  m.attr("built_with_mlx") = MLXSPEC_BUILT_WITH_MLX;

  m.def("verify_matmul", &mlxspec::verify_matmul, "x"_a, "w"_a, nb::kw_only(), "stream"_a = nb::none(),
        "x @ w.T for float32/bfloat16/float16 x and w [N, K], row results independent of the row count.");
  m.def("verify_qmatmul", &mlxspec::verify_qmatmul, "x"_a, "w"_a, "scales"_a, "biases"_a, "group_size"_a, "bits"_a,
        nb::kw_only(), "stream"_a = nb::none(),
        "x @ dequantize(w).T for mlx-lm's affine 4- and 8-bit weights (transpose=True layout).");
  m.def("threads", &mlxspec::kernel_threads, "Threads the kernel splits its columns over.");
}
