// CPU implementation of row-equivalent attention (see verify_attention.h).
//
// Work is split by (batch, KV head): each task holds the G * L query rows that share one KV head. Per row:
//   scores:  s_j = dot(q, k_j) * scale (+ mask_j), one FMA chain over d for each key. Keys sit in the vector
//            lanes (16 keys at a time, transposed), so a score never depends on its lane or its neighbours.
//   softmax: m = max over the row's attended keys; p_j = exp(s_j - m) lane by lane; the sum runs over the
//            attended keys in key order, one at a time.
//   output:  sum over the attended keys, in key order, of p_j * v_j (lanes over the value dims), divided by the sum.
// Masked keys are skipped, never added as zeros, so a row gives the same bits whether masked keys (later drafted
// tokens, other tree branches) lie among its keys or not, and whatever the number of rows in the call.
// With AVX2 the scores and the values take their own 8-lane paths (row_scores, row_values: the key's dims in the
// lanes, read in place, 4-5x faster than the portable code GCC makes of the 16-lane vectors there), with the same
// guarantees; the softmax between them is shared.
#include "verify_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/utils.h"
#include "cpu_common.h"
#include "thread_pool.h"
#include "attention_problem.h"
#include "attention_rows_avx2.h"
#include "vector_math.h"

namespace mlxspec {

using namespace mlx::core;

namespace {

// Below this many multiply-adds a fork-join costs more than it saves.
constexpr int64_t kParallelWork = 1 << 16;

Strided strided(const array& a) {
  const auto& s = a.strides();
  return {a.data<float>(), int64_t(s[0]), int64_t(s[1]), int64_t(s[2]), int64_t(s[3])};
}


// What key j adds to a row's score: -inf excludes it. `mask_row` points at the row's mask (or is null).
inline float mask_term(const AttentionProblem& p, const void* mask_row, int64_t j) {
  if (p.mask_kind == 1) return static_cast<const bool*>(mask_row)[j] ? 0.0f : -std::numeric_limits<float>::infinity();
  if (p.mask_kind == 2) return static_cast<const float*>(mask_row)[j];
  return 0.0f;
}

struct Scratch {
  std::vector<float> q;       // [R, D] the task's query rows
  std::vector<float> keys_t;  // [D, 16] a chunk of keys, transposed
  std::vector<float> scores;  // [R, Sp] scores, then probabilities
  std::vector<float> value;   // [Dvp] one value row, zero padded
  std::vector<float> acc;     // [R, Dvp]
  std::vector<float> rows;    // keys or a value row copied contiguous (AVX2, strided inputs)
  std::vector<float> zeros;   // [D] the padding key (AVX2)
};

thread_local Scratch tls;

// 1 / the sum of a row's probabilities over its attended keys (excluded ones are marked -1), in key order.
inline float inverse_total(const float* probabilities, int64_t keys) {
  float total = 0.0f;
  for (int64_t j = 0; j < keys; ++j) {
    if (probabilities[j] >= 0.0f) total += probabilities[j];
  }
  return total > 0.0f ? 1.0f / total : 0.0f;
}

// Where task row r (query row i of head kv_head * group + g, r = g * rows + i) writes its output.
inline float* output_row(const AttentionProblem& p, int64_t b, int64_t kv_head, int64_t r) {
  const int64_t group = p.q_heads / p.kv_heads, g = r / p.rows, i = r % p.rows, h = kv_head * group + g;
  return p.out + ((b * p.q_heads + h) * p.rows + i) * p.value_dim;
}

// One (batch, KV head) task: every query row of the heads sharing that KV head.
void attend_group(const AttentionProblem& p, int64_t b, int64_t kv_head) {
  const int64_t group = p.q_heads / p.kv_heads;
  const int64_t R = group * p.rows, S = p.keys, D = p.dim;
  const int64_t Sp = (S + kLanes - 1) / kLanes * kLanes;
  Scratch& t = tls;
  t.q.resize(R * D);
  t.scores.resize(R * Sp);
#if !defined(__AVX2__)
  const int64_t Dv = p.value_dim;
  const int64_t Dvp = (Dv + kLanes - 1) / kLanes * kLanes;
  const int64_t vecs = Dvp / kLanes;
  t.keys_t.resize(D * kLanes);
  t.value.resize(Dvp);
  t.acc.resize(R * Dvp);
#endif
  const float minus_inf = -std::numeric_limits<float>::infinity();

  // Row r is query row i of head kv_head * group + g, with r = g * rows + i.
  std::vector<const void*> mask_rows(R, nullptr);
  std::vector<int64_t> row_end(R);  // keys at or past this index are excluded (causal)
  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = kv_head * group + g;
    for (int64_t i = 0; i < p.rows; ++i) {
      const int64_t r = g * p.rows + i;
      const float* src = p.q.at(b, h, i);
      for (int64_t d = 0; d < D; ++d) t.q[r * D + d] = src[d * p.q.col];
      row_end[r] = p.causal ? S - p.rows + i + 1 : S;
      if (p.mask_kind) {
        const int64_t mb = p.mask_batch == 1 ? 0 : b, mh = p.mask_heads == 1 ? 0 : h;
        const int64_t offset = ((mb * p.mask_heads + mh) * p.rows + i) * S;
        mask_rows[r] = p.mask_kind == 1 ? static_cast<const void*>(static_cast<const bool*>(p.mask) + offset)
                                        : static_cast<const void*>(static_cast<const float*>(p.mask) + offset);
      }
    }
  }

#if defined(__AVX2__)
  t.zeros.resize(D);  // zero, the padding key of a short last group of eight
  for (int64_t r = 0; r < R; ++r) row_scores(p, b, kv_head, t.q.data() + r * D, t.scores.data() + r * Sp, t.rows, t.zeros);
#else
  // Scores, 16 keys at a time: each lane is one key's FMA chain over d.
  for (int64_t j0 = 0; j0 < S; j0 += kLanes) {
    const int64_t width = std::min<int64_t>(kLanes, S - j0);
    for (int64_t lane = 0; lane < kLanes; ++lane) {
      const float* key = lane < width ? p.k.at(b, kv_head, j0 + lane) : nullptr;
      for (int64_t d = 0; d < D; ++d) t.keys_t[d * kLanes + lane] = key ? key[d * p.k.col] : 0.0f;
    }
    for (int64_t r = 0; r < R; ++r) {
      vfloat acc = {};
      const float* qr = t.q.data() + r * D;
      for (int64_t d = 0; d < D; ++d) {
        vfloat kd;
        std::memcpy(&kd, t.keys_t.data() + d * kLanes, sizeof(kd));
        acc += qr[d] * kd;
      }
      acc = acc * p.scale;
      std::memcpy(t.scores.data() + r * Sp + j0, &acc, sizeof(acc));
    }
  }

#endif

  for (int64_t r = 0; r < R; ++r) {
    float* s = t.scores.data() + r * Sp;
    const int64_t end = row_end[r];
    float m = minus_inf;
    for (int64_t j = 0; j < Sp; ++j) {
      s[j] = j < end ? s[j] + mask_term(p, mask_rows[r], j) : minus_inf;
      m = std::max(m, s[j]);
    }
    if (m == minus_inf) m = 0.0f;  // nothing attended: every p_j is 0 and the row's output is 0
    for (int64_t j = 0; j < Sp; j += kLanes) {
      vfloat chunk;
      std::memcpy(&chunk, s + j, sizeof(chunk));
      const vfloat excluded = chunk == minus_inf ? vfloat{} + 1 : vfloat{};
      chunk = exp_nonpositive(chunk - m) * (1.0f - excluded);
      // An excluded key is marked -1 (a probability is never negative) so the sums below can skip it.
      chunk = chunk - excluded;
      std::memcpy(s + j, &chunk, sizeof(chunk));
    }
  }

#if defined(__AVX2__)
  for (int64_t r = 0; r < R; ++r) {
    const float* s = t.scores.data() + r * Sp;
    row_values(p, b, kv_head, s, inverse_total(s, S), output_row(p, b, kv_head, r), t.rows);
  }
#else
  // Values: key by key, in order, into every row that attends that key.
  std::fill(t.acc.begin(), t.acc.end(), 0.0f);
  std::fill(t.value.begin(), t.value.end(), 0.0f);
  for (int64_t j = 0; j < S; ++j) {
    const float* src = p.v.at(b, kv_head, j);
    for (int64_t d = 0; d < Dv; ++d) t.value[d] = src[d * p.v.col];
    for (int64_t r = 0; r < R; ++r) {
      const float pj = t.scores[r * Sp + j];
      if (pj < 0.0f) continue;
      float* acc = t.acc.data() + r * Dvp;
      for (int64_t c = 0; c < vecs; ++c) {
        vfloat a, vv;
        std::memcpy(&a, acc + c * kLanes, sizeof(a));
        std::memcpy(&vv, t.value.data() + c * kLanes, sizeof(vv));
        a += pj * vv;
        std::memcpy(acc + c * kLanes, &a, sizeof(a));
      }
    }
  }

  for (int64_t r = 0; r < R; ++r) {
    const float inv = inverse_total(t.scores.data() + r * Sp, S);
    float* dst = output_row(p, b, kv_head, r);
    const float* acc = t.acc.data() + r * Dvp;
    for (int64_t d = 0; d < Dv; ++d) dst[d] = acc[d] * inv;
  }
#endif
}

void run_problem(const AttentionProblem& p) {
  const int64_t tasks = p.batch * p.kv_heads;
  const int64_t work = p.batch * p.q_heads * p.rows * p.keys * (p.dim + p.value_dim);
  const int parts = work < kParallelWork ? 1 : int(std::min<int64_t>(kernel_pool().threads(), tasks));
  if (parts == 1) {
    for (int64_t task = 0; task < tasks; ++task) attend_group(p, task / p.kv_heads, task % p.kv_heads);
    return;
  }
  kernel_pool().run([&](int part) {
    for (int64_t task = part; task < tasks; task += parts) attend_group(p, task / p.kv_heads, task % p.kv_heads);
  });
}

}  // namespace

array verify_attention(
    const array& q,
    const array& k,
    const array& v,
    float scale,
    const std::optional<array>& mask,
    bool causal,
    StreamOrDevice s) {
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4) {
    throw std::invalid_argument("[verify_attention] expects q, k and v of 4 dimensions [B, H, L, D].");
  }
  if (q.dtype() != float32 || k.dtype() != float32 || v.dtype() != float32) {
    throw std::invalid_argument("[verify_attention] q, k and v must be float32.");
  }
  const int B = q.shape(0), Hq = q.shape(1), L = q.shape(2), D = q.shape(3);
  const int Hkv = k.shape(1), S = k.shape(2);
  if (k.shape(0) != B || v.shape(0) != B || v.shape(1) != Hkv || v.shape(2) != S || k.shape(3) != D ||
      Hkv == 0 || Hq % Hkv != 0) {
    throw std::invalid_argument("[verify_attention] q [B, Hq, L, D], k [B, Hkv, S, D] and v [B, Hkv, S, Dv] disagree.");
  }
  if (causal && L > S) throw std::invalid_argument("[verify_attention] causal attention needs L <= S.");
  auto stream = cpu_stream(s, "verify_attention");
  std::vector<array> inputs = {q, k, v};
  if (mask) {
    const array& m = *mask;
    if (m.ndim() != 4 || (m.shape(0) != 1 && m.shape(0) != B) || (m.shape(1) != 1 && m.shape(1) != Hq) ||
        m.shape(2) != L || m.shape(3) != S || (m.dtype() != bool_ && m.dtype() != float32)) {
      throw std::invalid_argument("[verify_attention] mask must be bool or float32 [B|1, Hq|1, L, S].");
    }
    inputs.push_back(contiguous(m, false, stream));
  }
  return array(
      {B, Hq, L, v.shape(3)},
      float32,
      std::make_shared<VerifyAttention>(stream, scale, causal, mask.has_value()),
      std::move(inputs));
}

void VerifyAttention::eval_cpu(const std::vector<array>& inputs, array& out) {
  const array &q = inputs[0], &k = inputs[1], &v = inputs[2];
  out.set_data(allocator::malloc(out.nbytes()));
  auto& encoder = cpu::get_command_encoder(stream());
  for (const auto& a : inputs) encoder.set_input_array(a);
  encoder.set_output_array(out);

  AttentionProblem p;
  p.batch = q.shape(0);
  p.q_heads = q.shape(1);
  p.rows = q.shape(2);
  p.dim = q.shape(3);
  p.kv_heads = k.shape(1);
  p.keys = k.shape(2);
  p.value_dim = v.shape(3);
  p.scale = scale_;
  p.causal = causal_;
  p.q = strided(q);
  p.k = strided(k);
  p.v = strided(v);
  if (has_mask_) {
    const array& m = inputs[3];
    if (!m.flags().row_contiguous) throw std::runtime_error("[verify_attention] the mask must be row contiguous.");
    p.mask_kind = m.dtype() == bool_ ? 1 : 2;
    p.mask = m.dtype() == bool_ ? static_cast<const void*>(m.data<bool>()) : static_cast<const void*>(m.data<float>());
    p.mask_batch = m.shape(0);
    p.mask_heads = m.shape(1);
  }
  p.out = out.data<float>();
  encoder.dispatch([p]() { run_problem(p); });
}

void VerifyAttention::eval_gpu(const std::vector<array>&, array&) {
  throw std::runtime_error("[verify_attention] has no GPU implementation in this build; it runs on mx.cpu.");
}

bool VerifyAttention::is_equivalent(const Primitive& other) const {
  const auto& o = static_cast<const VerifyAttention&>(other);
  return scale_ == o.scale_ && causal_ == o.causal_ && has_mask_ == o.has_mask_;
}

std::vector<Shape> VerifyAttention::output_shapes(const std::vector<array>& inputs) {
  const array &q = inputs[0], &v = inputs[2];
  return {{q.shape(0), q.shape(1), q.shape(2), v.shape(3)}};
}

}  // namespace mlxspec
