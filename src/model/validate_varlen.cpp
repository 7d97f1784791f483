// fattn — validation of attention_varlen's arguments, and its ragged Problem.
#include <algorithm>
#include <sstream>
#include <string>

#include "model/checks.hpp"
#include "model/varlen_problem.hpp"

namespace fattn::detail {
namespace {

// Offsets of the packed sequences: (B + 1) int32, from 0, non-decreasing, to `total`.
std::vector<std::int64_t> check_offsets(const char* name, const TensorView& cu,
                                        const char* total_name, std::int64_t total) {
  check_view(name, cu, 1, DType::int32, Device::cpu);
  if (cu.size(0) < 2) {
    std::ostringstream m;
    m << name << " must hold B + 1 >= 2 offsets, got " << cu.size(0);
    fail(m.str());
  }
  const auto* c = static_cast<const std::int32_t*>(cu.data);
  const std::int64_t n = cu.size(0), s = cu.stride(0);
  std::vector<std::int64_t> starts(static_cast<std::size_t>(n));
  for (std::int64_t b = 0; b < n; ++b) {
    starts[static_cast<std::size_t>(b)] = c[b * s];
    const std::int64_t least = b == 0 ? 0 : c[(b - 1) * s];
    if (b == 0 ? c[0] == 0 : c[b * s] >= least) continue;
    std::ostringstream m;
    m << name << "[" << b << "] must be " << (b == 0 ? "0" : ">= the offset before it, ")
      << (b == 0 ? "" : std::to_string(least)) << ", got " << c[b * s];
    fail(m.str());
  }
  if (c[(n - 1) * s] != total) {
    std::ostringstream m;
    m << name << "[" << n - 1 << "] (the last offset) must equal " << total_name << " = " << total
      << ", got " << c[(n - 1) * s];
    fail(m.str());
  }
  return starts;
}

// The options with (B, Hq) ALiBi slopes' first row as (Hq): the packed tensors are checked
// as one batch-1 problem, and the slopes' batch against the offsets afterwards.
struct FirstRowOptions {
  Options options;
  TensorView slopes;
  explicit FirstRowOptions(const Options& all) : options(all) {
    const TensorView* a = all.alibi_slopes;
    if (!a || a->rank != 2) return;
    slopes = *a;
    slopes.rank = 1;
    slopes.sizes = {a->size(1), 0, 0, 0};
    slopes.strides = {a->stride(1), 0, 0, 0};
    options.alibi_slopes = &slopes;
  }
};

void reject_mask(const Options& options) {
  if (options.attn_mask)
    fail("attention_varlen takes no attn_mask (its sequences have their own lengths); "
         "window, softcap, alibi_slopes and sinks it takes");
}

// The packed view's checks that make_problem does not do, then the offsets; fills the
// ragged description of `call` (its Problem already made from the packed views).
void make_ragged(const TensorView& q, const TensorView& k, const TensorView& cu_q,
                 const TensorView& cu_k, const Options& options, VarlenProblem* call) {
  if (q.size(0) != 1) {
    std::ostringstream m;
    m << "q.size(0) must be 1 for packed sequences (total_q, Hq, D) viewed as (1, Hq, total_q, "
         "D), got "
      << q.size(0);
    fail(m.str());
  }
  call->q_starts = check_offsets("cu_seqlens_q", cu_q, "q's total rows", q.size(2));
  call->k_starts = check_offsets("cu_seqlens_k", cu_k, "k's total rows", k.size(2));
  if (cu_k.size(0) != cu_q.size(0)) {
    std::ostringstream m;
    m << "cu_seqlens_k.size(0) must equal cu_seqlens_q.size(0) = " << cu_q.size(0) << ", got "
      << cu_k.size(0);
    fail(m.str());
  }
  const std::int64_t batch = cu_q.size(0) - 1;
  if (options.alibi_slopes && options.alibi_slopes->rank == 2)
    expect_size("alibi_slopes", *options.alibi_slopes, 0, "sequences",
                "cu_seqlens_q.size(0) - 1", batch);
  Problem& p = call->p;
  p.ragged = {call->q_starts.data(), call->k_starts.data()};
  p.batch = batch;
  p.q_len = p.kv_len = 0;
  for (std::int64_t b = 0; b < batch; ++b) {
    p.q_len = std::max(p.q_len, p.queries_of(b));
    p.kv_len = std::max(p.kv_len, p.keys_of(b));
  }
  if (options.alibi_slopes && options.alibi_slopes->rank == 2)
    p.mods.alibi_batch = options.alibi_slopes->stride(0);
  // Each sequence has its own band (Problem::sequence); the whole problem's spans them all.
  p.band_lo = -kUnboundedBand;
  p.band_hi = kUnboundedBand;
}

}  // namespace

VarlenProblem::VarlenProblem(const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& cu_q, const TensorView& cu_k,
                             const TensorView* out, const TensorView* lse,
                             const Options& options) {
  reject_mask(options);
  expect_no_q8_0_cache("attention_varlen", "q8_0 caches: attention_forward", q, k, v);
  p = make_problem(q, k, v, out, lse, FirstRowOptions(options).options);
  make_ragged(q, k, cu_q, cu_k, options, this);
}

VarlenProblem::VarlenProblem(const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& out, const TensorView& dout, const TensorView& lse,
                             const TensorView& cu_q, const TensorView& cu_k, const TensorView& dq,
                             const TensorView& dk, const TensorView& dv, const Options& options,
                             const TensorView* dsinks) {
  reject_mask(options);
  p = make_backward_problem(q, k, v, out, dout, lse, nullptr, dq, dk, dv,
                            FirstRowOptions(options).options, dsinks);
  make_ragged(q, k, cu_q, cu_k, options, this);
}

}  // namespace fattn::detail
