// fattn — the KV-cache and variable-length entry points (fattn/kv_cache.hpp).
#include <algorithm>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/checks.hpp"
#include "core/dispatch.hpp"
#include "core/kv_cache_problem.hpp"
#include "core/workspace_cache.hpp"
#include "fattn/kv_cache.hpp"

namespace fattn {
namespace {

// The KV cache runs the decode kernel (any Sq) or the reference.
Impl kvcache_impl(Impl impl) {
  if (impl == Impl::automatic || impl == Impl::decode || impl == Impl::reference) return impl;
  throw Error(std::string("fattn: attention_kvcache runs impl auto, decode or reference, got ") +
              to_string(impl) + " (the prefill kernels do not read a KV cache)");
}

}  // namespace

void attention_kvcache(const TensorView& q, const KvCache& cache, const TensorView* k_new,
                       const TensorView* v_new, const TensorView& out, const TensorView* lse,
                       const Options& options) {
  const Impl impl = kvcache_impl(options.impl);
  const detail::KvCacheProblem call(q, cache, k_new, v_new, &out, lse, options);
  const detail::Exec exec = detail::make_exec(options);
  if (impl == Impl::reference) {
    call.append();
    return cpu::reference_forward(call.p, exec);
  }
  const cpu::Kernels& kernels = detail::forward_kernels(options, call.p);
  // Leased before the append: a failed allocation leaves the cache as it was.
  const detail::WorkspaceLease workspace(
      detail::decode_workspace_floats(kernels, call.p, exec, options), to_string(Impl::decode));
  call.append();
  kernels.decode(call.p, exec, workspace.get(), options.kv_splits);
}

std::int64_t kvcache_extra_bytes(const TensorView& q, const KvCache& cache,
                                 const TensorView* k_new, const Options& options) {
  const Impl impl = kvcache_impl(options.impl);
  const detail::KvCacheProblem call(q, cache, k_new, k_new, nullptr, nullptr, options);
  const detail::Exec exec = detail::make_exec(options);
  if (impl == Impl::reference)  // per worker: Sk scores and D outputs in float64
    return exec.workers * (call.p.kv_len + call.p.head_dim) *
           static_cast<std::int64_t>(sizeof(double));
  return detail::decode_workspace_floats(detail::forward_kernels(options, call.p), call.p, exec,
                                         options) *
         static_cast<std::int64_t>(sizeof(float));
}

namespace {

// Offsets of the packed sequences: (B + 1) int32, from 0, non-decreasing, to `total`.
void check_offsets(const char* name, const TensorView& cu, const char* total_name,
                   std::int64_t total) {
  detail::check_view(name, cu, 1, DType::int32, Device::cpu);
  if (cu.size(0) < 2) {
    std::ostringstream m;
    m << name << " must hold B + 1 >= 2 offsets, got " << cu.size(0);
    detail::fail(m.str());
  }
  const auto* c = static_cast<const std::int32_t*>(cu.data);
  const std::int64_t n = cu.size(0), s = cu.stride(0);
  for (std::int64_t b = 0; b < n; ++b) {
    const std::int64_t least = b == 0 ? 0 : c[(b - 1) * s];
    if (b == 0 ? c[0] == 0 : c[b * s] >= least) continue;
    std::ostringstream m;
    m << name << "[" << b << "] must be " << (b == 0 ? "0" : ">= the offset before it, ")
      << (b == 0 ? "" : std::to_string(least)) << ", got " << c[b * s];
    detail::fail(m.str());
  }
  if (c[(n - 1) * s] != total) {
    std::ostringstream m;
    m << name << "[" << n - 1 << "] (the last offset) must equal " << total_name << " = " << total
      << ", got " << c[(n - 1) * s];
    detail::fail(m.str());
  }
}

// Rows [begin, end) of a (1, H, S, D) or (1, H, S) view.
TensorView rows(const TensorView& t, std::int64_t begin, std::int64_t end) {
  TensorView r = t;
  r.data = static_cast<char*>(t.data) + begin * t.stride(2) * element_size(t.dtype);
  r.sizes[2] = end - begin;
  return r;
}

struct Packed {
  const std::int32_t *q, *k;
  std::int64_t q_stride, k_stride, batch;
};

// Sequence b's options: (B, Hq) ALiBi slopes become its own row, (Hq).
struct SequenceOptions {
  Options options;
  TensorView slopes;
  SequenceOptions(const Options& all, std::int64_t b) : options(all) {
    const TensorView* a = all.alibi_slopes;
    if (!a || a->rank != 2) return;
    slopes = *a;
    slopes.rank = 1;
    slopes.data = static_cast<char*>(a->data) + b * a->stride(0) * element_size(a->dtype);
    slopes.sizes = {a->size(1), 0, 0, 0};
    slopes.strides = {a->stride(1), 0, 0, 0};
    options.alibi_slopes = &slopes;
  }
};

// Checks the packed tensors as one problem and the offsets against them.
Packed check_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& cu_q, const TensorView& cu_k, const TensorView* out,
                    const TensorView* lse, const Options& options) {
  if (options.attn_mask)
    detail::fail("attention_varlen takes no attn_mask (its sequences have their own lengths); "
                 "window, softcap, alibi_slopes and sinks it takes");
  const SequenceOptions first(options, 0);  // (B, Hq) slopes: checked as row 0, and B below
  detail::make_problem(q, k, v, out, lse, first.options);
  if (q.size(0) != 1) {
    std::ostringstream m;
    m << "q.size(0) must be 1 for packed sequences (total_q, Hq, D) viewed as (1, Hq, total_q, "
         "D), got "
      << q.size(0);
    detail::fail(m.str());
  }
  check_offsets("cu_seqlens_q", cu_q, "q's total rows", q.size(2));
  check_offsets("cu_seqlens_k", cu_k, "k's total rows", k.size(2));
  if (cu_k.size(0) != cu_q.size(0)) {
    std::ostringstream m;
    m << "cu_seqlens_k.size(0) must equal cu_seqlens_q.size(0) = " << cu_q.size(0) << ", got "
      << cu_k.size(0);
    detail::fail(m.str());
  }
  if (options.alibi_slopes && options.alibi_slopes->rank == 2)
    detail::expect_size("alibi_slopes", *options.alibi_slopes, 0, "sequences",
                        "cu_seqlens_q.size(0) - 1", cu_q.size(0) - 1);
  return {static_cast<const std::int32_t*>(cu_q.data), static_cast<const std::int32_t*>(cu_k.data),
          cu_q.stride(0), cu_k.stride(0), cu_q.size(0) - 1};
}

// A sequence with queries but no key: its rows are 0 and their logsumexp −inf, or with
// sinks the head's sink (also the zero gradients of a sequence without (query, key)
// pairs). T: a type of the size of the views' element (zero is all zero bits in every
// dtype); L: the logsumexp's (and the sinks').
template <class T, class L>
void write_empty_rows_as(const TensorView& out, const TensorView* lse, const TensorView* sinks) {
  for (std::int64_t h = 0; h < out.size(1); ++h)
    for (std::int64_t i = 0; i < out.size(2); ++i) {
      auto* o = static_cast<T*>(out.data) + h * out.stride(1) + i * out.stride(2);
      for (std::int64_t d = 0; d < out.size(3); ++d) o[d * out.stride(3)] = T(0);
      if (lse)
        static_cast<L*>(lse->data)[h * lse->stride(1) + i * lse->stride(2)] =
            sinks ? static_cast<const L*>(sinks->data)[h] : -std::numeric_limits<L>::infinity();
    }
}

void write_empty_rows(const TensorView& out, const TensorView* lse,
                      const TensorView* sinks = nullptr) {
  if (out.dtype == DType::float64) return write_empty_rows_as<double, double>(out, lse, sinks);
  if (element_size(out.dtype) == 2)
    return write_empty_rows_as<std::uint16_t, float>(out, lse, sinks);
  write_empty_rows_as<float, float>(out, lse, sinks);
}

}  // namespace

void attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                      const TensorView& out, const TensorView* lse, const Options& options) {
  const Packed s = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, &out, lse, options);
  for (std::int64_t b = 0; b < s.batch; ++b) {
    const std::int64_t q0 = s.q[b * s.q_stride], q1 = s.q[(b + 1) * s.q_stride];
    const std::int64_t k0 = s.k[b * s.k_stride], k1 = s.k[(b + 1) * s.k_stride];
    if (q1 == q0) continue;
    const TensorView out_b = rows(out, q0, q1);
    const TensorView lse_b = lse ? rows(*lse, q0, q1) : TensorView{};
    if (k1 == k0) {
      write_empty_rows(out_b, lse ? &lse_b : nullptr, options.sinks);
      continue;
    }
    attention_forward(rows(q, q0, q1), rows(k, k0, k1), rows(v, k0, k1), out_b,
                      lse ? &lse_b : nullptr, SequenceOptions(options, b).options);
  }
}

void attention_varlen_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& dout,
                               const TensorView& lse, const TensorView& cu_seqlens_q,
                               const TensorView& cu_seqlens_k, const TensorView& dq,
                               const TensorView& dk, const TensorView& dv,
                               const Options& options, const TensorView* dsinks) {
  const Packed s = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, nullptr, nullptr, options);
  detail::make_backward_problem(q, k, v, out, dout, lse, nullptr, dq, dk, dv,
                                SequenceOptions(options, 0).options, dsinks);
  // With sinks: each sequence's dsinks into `part` (dsinks' dtype, float32 or float64),
  // summed in float64 in sequence order.
  const std::size_t heads = dsinks ? static_cast<std::size_t>(dsinks->size(0)) : 0;
  const bool wide = dsinks && dsinks->dtype == DType::float64;
  std::vector<double> part(heads), total(heads);
  TensorView part_view = dsinks ? *dsinks : TensorView{};
  part_view.data = part.data();
  part_view.strides = {1, 0, 0, 0};
  auto part_at = [&](std::size_t h) {
    return wide ? part[h] : static_cast<double>(reinterpret_cast<const float*>(part.data())[h]);
  };
  for (std::int64_t b = 0; b < s.batch; ++b) {
    const std::int64_t q0 = s.q[b * s.q_stride], q1 = s.q[(b + 1) * s.q_stride];
    const std::int64_t k0 = s.k[b * s.k_stride], k1 = s.k[(b + 1) * s.k_stride];
    if (q1 == q0 || k1 == k0) {  // no (query, key) pair: the gradients are 0
      for (const auto& [t, first, last] :
           {std::tuple{&dq, q0, q1}, std::tuple{&dk, k0, k1}, std::tuple{&dv, k0, k1}})
        if (last > first) write_empty_rows(rows(*t, first, last), nullptr);
      continue;
    }
    attention_backward(rows(q, q0, q1), rows(k, k0, k1), rows(v, k0, k1), rows(out, q0, q1),
                       rows(dout, q0, q1), rows(lse, q0, q1), nullptr, rows(dq, q0, q1),
                       rows(dk, k0, k1), rows(dv, k0, k1), SequenceOptions(options, b).options,
                       dsinks ? &part_view : nullptr);
    for (std::size_t h = 0; h < heads; ++h) total[h] += part_at(h);
  }
  for (std::size_t h = 0; h < heads; ++h) {
    const auto at = static_cast<std::int64_t>(h) * dsinks->stride(0);
    if (wide)
      static_cast<double*>(dsinks->data)[at] = total[h];
    else
      static_cast<float*>(dsinks->data)[at] = static_cast<float>(total[h]);
  }
}

}  // namespace fattn
