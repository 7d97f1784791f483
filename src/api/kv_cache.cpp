// fattn — the KV-cache and variable-length entry points (fattn/kv_cache.hpp).
#include <string>

#include "api/dispatch.hpp"
#include "model/kv_cache_problem.hpp"
#include "model/varlen_problem.hpp"
#include "api/workspace_cache.hpp"
#include "fattn/kv_cache.hpp"

#ifdef FATTN_WITH_CUDA
#include "cuda/decode.hpp"
#endif

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
  detail::expect_cuda_backend(q);
#ifdef FATTN_WITH_CUDA
  if (q.device == Device::cuda)
    return cuda::attention_kvcache(q, cache, k_new, v_new, out, lse, options);
#endif
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
  kernels.decode(call.p, exec, workspace.get(), cpu::DecodeRequest::of(options));
}

std::int64_t kvcache_extra_bytes(const TensorView& q, const KvCache& cache,
                                 const TensorView* k_new, const Options& options) {
  const Impl impl = kvcache_impl(options.impl);
  detail::expect_cuda_backend(q);
#ifdef FATTN_WITH_CUDA
  if (q.device == Device::cuda) return cuda::kvcache_extra_bytes(q, cache, k_new, options);
#endif
  const detail::KvCacheProblem call(q, cache, k_new, k_new, nullptr, nullptr, options);
  const detail::Exec exec = detail::make_exec(options);
  if (impl == Impl::reference)  // per worker: Sk scores and D outputs in float64
    return exec.workers * (call.p.kv_len + call.p.head_dim) *
           static_cast<std::int64_t>(sizeof(double));
  return detail::decode_workspace_floats(detail::forward_kernels(options, call.p), call.p, exec,
                                         options) *
         static_cast<std::int64_t>(sizeof(float));
}

ForwardPlan kvcache_plan(const TensorView& q, const KvCache& cache, const TensorView* k_new,
                         const Options& options) {
  const Impl impl = kvcache_impl(options.impl);
  if (q.device == Device::cuda)
    throw Error("fattn: kvcache_plan describes the CPU kernels; q is on cuda");
  const detail::KvCacheProblem call(q, cache, k_new, k_new, nullptr, nullptr, options);
  if (impl == Impl::reference) return {impl, Isa::portable, Products::float64, {}, {}};
  return detail::cpu_forward_plan(detail::forward_kernels(options, call.p), call.p, Impl::decode,
                                  options);
}

namespace {

// The packed sequences run on the CPU kernels (python/fattn routes cuda tensors to Triton).
void require_cpu_varlen(const TensorView& q) {
  if (q.device != Device::cpu)
    throw Error(std::string("fattn: attention_varlen runs on the CPU; q is on ") +
                to_string(q.device) + " (fattn.triton.attention_varlen runs on the GPU)");
}

}  // namespace

void attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                      const TensorView& out, const TensorView* lse, const Options& options) {
  require_cpu_varlen(q);
  const detail::VarlenProblem call(q, k, v, cu_seqlens_q, cu_seqlens_k, &out, lse, options);
  detail::ragged_forward(call.p, detail::make_exec(options), options);
}

void attention_varlen(const TensorView& q, const KvCache& cache, const TensorView& cu_seqlens_q,
                      const TensorView* cu_seqlens_k, const TensorView& out,
                      const TensorView* lse, const Options& options) {
  require_cpu_varlen(q);
  const detail::VarlenProblem call(q, cache, cu_seqlens_q, cu_seqlens_k, &out, lse, options);
  detail::ragged_forward(call.p, detail::make_exec(options), options);
}

void attention_varlen_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& dout,
                               const TensorView& lse, const TensorView& cu_seqlens_q,
                               const TensorView& cu_seqlens_k, const TensorView& dq,
                               const TensorView& dk, const TensorView& dv,
                               const Options& options, const TensorView* dsinks) {
  require_cpu_varlen(q);
  const detail::VarlenProblem call(q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k, dq, dk,
                                   dv, options, dsinks);
  detail::ragged_backward(call.p, detail::make_exec(options), options);
}

}  // namespace fattn
