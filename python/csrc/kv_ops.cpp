// fattn — the CPU kernels of torch.ops.<ns>.attention_kvcache, .attention_varlen and
// .attention_varlen_backward (their schemas are defined with the others in ops.cpp), on
// fattn/kv_cache.hpp. Tensors reach the library as views, never copied.
//
// attention_kvcache(q, k_cache!, v_cache!, k_new, v_new, cache_seqlens, block_table, causal,
//                   scale, kv_splits, impl, window_left, window_right, softcap, alibi_slopes,
//                   sinks) -> (out, lse)
//   the variants as in attention (fattn/attention.hpp), each sequence's keys its own Sk
//   q: (B, Hq, Sq, D) float32, any strides (FlashAttention's (B, Sq, Hq, D) memory arrives
//      transposed); Hq a multiple of Hkv.
//   k_cache, v_cache: (B, Hkv, S_cache, D), or with a block_table the pages
//      (num_blocks, Hkv, block_size, D), block_size a multiple of 16; any strides
//      (FlashAttention's (…, S, Hkv, D) memory transposed).
//   k_new, v_new: (B, Hkv, S_new, D) or None: written into the caches in place at
//      positions [cache_seqlens[b], cache_seqlens[b] + S_new) before attending.
//   cache_seqlens: (B) int32, keys in use before the append, or None (every key of the
//      cache; an append needs it). block_table: (B, max_blocks) int32 or None.
//   causal: bottom-right, relative to each sequence's length after the append.
//   kv_splits: the decode kernel's key splits (0: chosen by fattn). impl: auto, decode or
//      reference (float64 reference, for tests).
//   out: (B, Hq, Sq, D), laid out as empty_output says; lse: (B, Hq, Sq) float32.
//   Every argument is checked before the append: a call that raises leaves the caches as
//   they were. Inference only: its Autograd kernel refuses to differentiate.
//
// attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, impl, window_left,
//                  window_right, softcap, alibi_slopes, sinks, dropout_p, dropout_seed,
//                  dropout_offset) -> (out, lse)
//   the variants per sequence, as attention_kvcache's (alibi_slopes (Hq) or (B, Hq))
//   FlashAttention's packed layout: q (total_q, Hq, D), k and v (total_k, Hkv, D), any
//   strides; cu_seqlens_q, cu_seqlens_k (B + 1) int32 offsets. causal: bottom-right per
//   sequence. out: contiguous (total_q, Hq, D); lse: contiguous (Hq, total_q) (float64 for
//   float64 inputs, which run the float64 reference).
// attention_varlen_kvcache(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
//                          block_table, causal, scale, impl, <variants>) -> (out, lse)
//   attention_varlen whose keys are in a cache: with block_table (B, max_blocks) int32 the
//   pages (num_blocks, Hkv, block_size, D) as attention_kvcache's, else packed rows
//   (total_k, Hkv, D); seqused_k (B) int32 (FlashAttention's): the keys each sequence uses,
//   else the cu_seqlens_k differences (cu_seqlens_k may be None with seqused_k and pages).
//   Inference only, as attention_kvcache.
// attention_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, causal,
//                           scale, impl, <variants>) -> (dq, dk, dv, dsinks), dq, dk and dv
//   contiguous like q, k and v; dsinks empty without sinks.
//
// Errors are RuntimeErrors starting "fattn: ". The library's messages count dimensions of
// its views: (B, H, S, D) above, and (1, H, total, D) for the packed tensors.
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/extension.h>

#include <cctype>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <tuple>

#include "fattn/cuda_refusal.hpp"
#include "fattn/kv_cache.hpp"
#include "cuda_seam.hpp"
#include "kvcache_planner.hpp"
#include "torch_views.hpp"
#include "variants.hpp"

#ifdef FATTN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>  // the device's compute capability
#endif

#include "op_namespace.hpp"

namespace {

using namespace fattn_torch;

void check_rank(const at::Tensor& t, const char* name, int rank, const char* dims) {
  TORCH_CHECK(t.defined(), "fattn: ", name, " is an undefined tensor");
  TORCH_CHECK(t.dim() == rank, "fattn: ", name, " must have ", rank, " dimensions ", dims,
              ", got ", t.dim(), " with shape ", t.sizes());
}

// --- KV cache -----------------------------------------------------------------------------

// The library calls the operator's cache_seqlens "seqlens": its messages are given the
// operator's name.
std::string with_op_names(std::string message) {
  const std::string word = "seqlens";
  for (std::size_t at = message.find(word); at != std::string::npos;
       at = message.find(word, at + word.size())) {
    const bool part_of_a_name =
        at > 0 && (std::isalnum(static_cast<unsigned char>(message[at - 1])) ||
                   message[at - 1] == '_');
    if (!part_of_a_name) {
      message.insert(at, "cache_");
      at += 6;
    }
  }
  return message;
}

// The views of one attention_kvcache call (they live as long as the call).
struct KvCacheCall {
  fattn::TensorView seqlens, table, k_new, v_new;
  bool has_k_new, has_v_new;  // given (an empty tensor's data pointer may be null)
  fattn::KvCache cache;
  KvCacheCall(at::Tensor& k_cache, at::Tensor& v_cache, const std::optional<at::Tensor>& kn,
              const std::optional<at::Tensor>& vn, const std::optional<at::Tensor>& cache_seqlens,
              const std::optional<at::Tensor>& block_table)
      : seqlens(cache_seqlens ? int32_view_of(*cache_seqlens, "cache_seqlens") : fattn::TensorView{}),
        table(block_table ? int32_view_of(*block_table, "block_table") : fattn::TensorView{}),
        k_new(kn ? view_of(*kn, "k_new") : fattn::TensorView{}),
        v_new(vn ? view_of(*vn, "v_new") : fattn::TensorView{}),
        has_k_new(kn.has_value()),
        has_v_new(vn.has_value()),
        cache{view_of(k_cache, "k_cache"), view_of(v_cache, "v_cache"),
              cache_seqlens ? &seqlens : nullptr, block_table ? &table : nullptr} {}
  KvCacheCall(const KvCacheCall&) = delete;
  KvCacheCall& operator=(const KvCacheCall&) = delete;
  const fattn::TensorView* kn() const { return has_k_new ? &k_new : nullptr; }
  const fattn::TensorView* vn() const { return has_v_new ? &v_new : nullptr; }
};

void check_kvcache_ranks(const at::Tensor& q, const at::Tensor& k_cache,
                         const at::Tensor& v_cache, const std::optional<at::Tensor>& k_new,
                         const std::optional<at::Tensor>& v_new, std::int64_t kv_splits) {
  check_rank(q, "q", 4, "(batch, heads, seq, head_dim)");
  check_rank(k_cache, "k_cache", 4, "(batch or pages, kv heads, seq, head_dim)");
  check_rank(v_cache, "v_cache", 4, "(batch or pages, kv heads, seq, head_dim)");
  if (k_new) check_rank(*k_new, "k_new", 4, "(batch, kv heads, new keys, head_dim)");
  if (v_new) check_rank(*v_new, "v_new", 4, "(batch, kv heads, new keys, head_dim)");
  TORCH_CHECK(kv_splits <= std::numeric_limits<int>::max(), "fattn: kv_splits must be at most ",
              std::numeric_limits<int>::max(), ", got ", kv_splits);
}

fattn::Options kvcache_options(const at::Tensor& q, bool causal, std::optional<double> scale,
                               c10::string_view impl, std::int64_t kv_splits) {
  fattn::Options options =
      base_options(q, causal ? fattn::Causal::bottom_right : fattn::Causal::none, scale, impl);
  options.kv_splits = static_cast<int>(kv_splits);
  options.decode_stages = cuda_decode_stages.load(std::memory_order_relaxed);
  return options;
}

// The library's attention_kvcache on the call's views, after the operator's checks.
std::tuple<at::Tensor, at::Tensor> run_kvcache(
    const at::Tensor& q, const KvCacheCall& call, fattn::Options options,
    std::int64_t window_left, std::int64_t window_right, double softcap,
    const std::optional<at::Tensor>& alibi_slopes, const std::optional<at::Tensor>& sinks) {
  const Variants variants(q.scalar_type(), std::nullopt, window_left, window_right, softcap,
                          alibi_slopes, sinks, &options);
  at::Tensor out = empty_output(q);
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  const fattn::TensorView lse_view = view_of(lse, "lse");
  const OnDevice on_device(q, options);
  try {
    fattn::attention_kvcache(view_of(q, "q"), call.cache, call.kn(), call.vn(),
                             view_of(out, "out"), &lse_view, on_device.options);
  } catch (const fattn::Error& e) {
    TORCH_CHECK(false, with_op_names(e.what()));
  }
  return {out, lse};
}

#ifdef FATTN_WITH_CUDA
// The dispatch table's kernel for a KV-cache call on CUDA tensors (impl auto), asked on q's
// device with the call's variants.
std::string kvcache_table_kernel(const at::Tensor& q, const KvCacheCall& call,
                                 fattn::Options options, std::int64_t window_left,
                                 std::int64_t window_right, double softcap,
                                 const std::optional<at::Tensor>& alibi_slopes,
                                 const std::optional<at::Tensor>& sinks) {
  const Variants variants(q.scalar_type(), std::nullopt, window_left, window_right, softcap,
                          alibi_slopes, sinks, &options);
  const c10::cuda::CUDAGuard on_q_device(q.device());
  return fattn::cuda_kvcache_kernel(view_of(q, "q"), call.cache, call.kn(), call.vn(), options);
}

// Whether a KV-cache call (impl auto) runs the C++ decode kernel: the first candidate of the
// table that takes it is decode, and the Python dispatch, which reads the verification
// records, keeps it as the default (it may prefer a verified Triton kernel).
bool runs_decode(const at::Tensor& q, const KvCacheCall& call, const fattn::Options& options,
                 std::int64_t window_left, std::int64_t window_right, double softcap,
                 const std::optional<at::Tensor>& alibi_slopes,
                 const std::optional<at::Tensor>& sinks) {
  if (kvcache_table_kernel(q, call, options, window_left, window_right, softcap, alibi_slopes,
                           sinks) != "decode")
    return false;
  const cudaDeviceProp* device = at::cuda::getDeviceProperties(q.device().index());
  fattn_torch::KvcacheKind kind;
  kind.major = device->major;
  kind.minor = device->minor;
  kind.dtype = q.scalar_type() == at::kHalf ? "float16"
               : q.scalar_type() == at::kBFloat16 ? "bfloat16" : "float32";
  kind.head_dim = q.size(-1);
  kind.left_window = window_left >= 0;
  kind.right_window = window_right >= 0;
  kind.softcap = softcap != 0.0;
  kind.alibi = alibi_slopes.has_value();
  kind.sinks = sinks.has_value();
  const std::string planned = fattn_torch::planned_kvcache_kernel(kind);
  return planned.empty() || planned == "decode";
}
#else
// A build without CUDA has no Triton kernels to choose: fattn's kernels run every call.
bool runs_decode(const at::Tensor&, const KvCacheCall&, const fattn::Options&, std::int64_t,
                 std::int64_t, double, const std::optional<at::Tensor>&,
                 const std::optional<at::Tensor>&) {
  return true;
}
#endif

std::tuple<at::Tensor, at::Tensor> attention_kvcache(
    const at::Tensor& q, at::Tensor& k_cache, at::Tensor& v_cache,
    const std::optional<at::Tensor>& k_new, const std::optional<at::Tensor>& v_new,
    const std::optional<at::Tensor>& cache_seqlens, const std::optional<at::Tensor>& block_table,
    bool causal, std::optional<double> scale, std::int64_t kv_splits, c10::string_view impl,
    std::int64_t window_left, std::int64_t window_right, double softcap,
    const std::optional<at::Tensor>& alibi_slopes, const std::optional<at::Tensor>& sinks) {
  // On CUDA, impl auto takes the GPU dispatch table's choice (fattn::cuda_kvcache_kernel: the
  // first candidate of table.json's "kvcache" row for the call that takes it). Its C++ decode
  // kernel (src/cuda/decode.cuh; what it takes: fattn::cuda_kvcache_refusal) is launched from
  // here, so that a decode step costs the host a few microseconds and never waits for the
  // GPU; impl="decode" asks for it (an error where it does not take the call); the Triton
  // kernels run the rest and impl="triton" (triton_attention_kvcache, registered from Python).
  if (!(q.is_cuda() && impl == "triton")) {
    check_kvcache_ranks(q, k_cache, v_cache, k_new, v_new, kv_splits);
    const fattn::Options options = kvcache_options(q, causal, scale, impl, kv_splits);
    const KvCacheCall call(k_cache, v_cache, k_new, v_new, cache_seqlens, block_table);
    if (!q.is_cuda() || impl != "auto" ||
        runs_decode(q, call, options, window_left, window_right, softcap, alibi_slopes, sinks))
      return run_kvcache(q, call, options, window_left, window_right, softcap, alibi_slopes,
                         sinks);
  }
  static const auto triton =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow(FATTN_STRINGIFY(FATTN_OP_NAMESPACE) "::triton_attention_kvcache", "")
          .typed<decltype(attention_kvcache)>();
  return triton.call(q, k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, causal,
                     scale, kv_splits, c10::string_view("auto"), window_left, window_right,
                     softcap, alibi_slopes, sinks);
}

// --- packed variable-length sequences -------------------------------------------------------

// (total, H, D) as the library's (1, H, total, D).
fattn::TensorView packed_view(const at::Tensor& t, const char* name) {
  fattn::TensorView v = view_of(t, name);
  v.rank = 4;
  v.sizes = {1, t.size(1), t.size(0), t.size(2)};
  v.strides = {0, t.stride(1), t.stride(0), t.stride(2)};
  return v;
}

// (H, total) as (1, H, total).
fattn::TensorView packed_lse_view(const at::Tensor& t, const char* name) {
  fattn::TensorView v = view_of(t, name);
  v.rank = 3;
  v.sizes = {1, t.size(0), t.size(1), 0};
  v.strides = {0, t.stride(0), t.stride(1), 0};
  return v;
}

void check_packed(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  check_rank(q, "q", 3, "(total_q, heads, head_dim)");
  check_rank(k, "k", 3, "(total_k, kv heads, head_dim)");
  check_rank(v, "v", 3, "(total_k, kv heads, head_dim)");
}

fattn::Options varlen_options(const at::Tensor& q, bool causal, std::optional<double> scale,
                              c10::string_view impl) {
  return base_options(q, causal ? fattn::Causal::bottom_right : fattn::Causal::none, scale, impl);
}

// A packed (varlen) call's operands checked and its options built, as the forward and the
// backward both take them: ranks, then the score variants (Variants keeps the views the
// options point at), then the dropout stream.
struct VarlenCall {
  fattn::Options options;
  Variants variants;
  VarlenCall(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
             std::optional<double> scale, c10::string_view impl, std::int64_t window_left,
             std::int64_t window_right, double softcap,
             const std::optional<at::Tensor>& alibi_slopes,
             const std::optional<at::Tensor>& sinks, double dropout_p,
             const std::optional<at::Tensor>& dropout_seed, std::int64_t dropout_offset)
      : options((check_packed(q, k, v), varlen_options(q, causal, scale, impl))),
        variants(q.scalar_type(), std::nullopt, window_left, window_right, softcap,
                 alibi_slopes, sinks, &options) {
    set_dropout(dropout_p, dropout_seed, dropout_offset, &options);
  }
  VarlenCall(const VarlenCall&) = delete;
  VarlenCall& operator=(const VarlenCall&) = delete;
};

std::tuple<at::Tensor, at::Tensor> attention_varlen(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_k, bool causal, std::optional<double> scale,
    c10::string_view impl, std::int64_t window_left, std::int64_t window_right, double softcap,
    const std::optional<at::Tensor>& alibi_slopes, const std::optional<at::Tensor>& sinks,
    double dropout_p, const std::optional<at::Tensor>& dropout_seed,
    std::int64_t dropout_offset) {
  const VarlenCall call(q, k, v, causal, scale, impl, window_left, window_right, softcap,
                        alibi_slopes, sinks, dropout_p, dropout_seed, dropout_offset);
  const fattn::Options& options = call.options;
  at::Tensor out = at::empty(q.sizes(), q.options());
  at::Tensor lse = at::empty({q.size(1), q.size(0)}, q.options().dtype(lse_dtype(q)));
  if (q.numel() == 0) return {out, lse};  // no query row
  if (k.size(0) == 0) {  // no key at all: every row is 0, its lse -inf (or its head's sink)
    out.zero_();
    lse.fill_(-std::numeric_limits<double>::infinity());
    if (sinks) lse.copy_(sinks->to(lse.scalar_type()).view({-1, 1}).expand_as(lse));
    return {out, lse};
  }
  const fattn::TensorView lse_view = packed_lse_view(lse, "lse");
  call_fattn([&] {
    fattn::attention_varlen(packed_view(q, "q"), packed_view(k, "k"), packed_view(v, "v"),
                            int32_view_of(cu_seqlens_q, "cu_seqlens_q"),
                            int32_view_of(cu_seqlens_k, "cu_seqlens_k"), packed_view(out, "out"),
                            &lse_view, options);
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor> attention_varlen_kvcache(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k,
    const std::optional<at::Tensor>& seqused_k, const std::optional<at::Tensor>& block_table,
    bool causal, std::optional<double> scale, c10::string_view impl, std::int64_t window_left,
    std::int64_t window_right, double softcap, const std::optional<at::Tensor>& alibi_slopes,
    const std::optional<at::Tensor>& sinks) {
  check_rank(q, "q", 3, "(total_q, heads, head_dim)");
  const bool paged = block_table.has_value();
  const char* layout = paged ? "(pages, kv heads, block_size, head_dim)" : "(total_k, kv heads, head_dim)";
  check_rank(k, "k", paged ? 4 : 3, layout);
  check_rank(v, "v", paged ? 4 : 3, layout);
  fattn::Options options = varlen_options(q, causal, scale, impl);
  const Variants variants(q.scalar_type(), std::nullopt, window_left, window_right, softcap,
                          alibi_slopes, sinks, &options);
  at::Tensor out = at::empty(q.sizes(), q.options());
  at::Tensor lse = at::empty({q.size(1), q.size(0)}, q.options().dtype(lse_dtype(q)));
  if (q.numel() == 0) return {out, lse};  // no query row (as attention_varlen)
  const fattn::TensorView lse_view = packed_lse_view(lse, "lse");
  const fattn::TensorView used = seqused_k ? int32_view_of(*seqused_k, "seqused_k") : fattn::TensorView{};
  const fattn::TensorView table = paged ? int32_view_of(*block_table, "block_table") : fattn::TensorView{};
  const fattn::TensorView cu_k = cu_seqlens_k ? int32_view_of(*cu_seqlens_k, "cu_seqlens_k") : fattn::TensorView{};
  const fattn::KvCache cache{paged ? view_of(k, "k") : packed_view(k, "k"),
                             paged ? view_of(v, "v") : packed_view(v, "v"),
                             seqused_k ? &used : nullptr, paged ? &table : nullptr};
  call_fattn([&] {
    fattn::attention_varlen(packed_view(q, "q"), cache, int32_view_of(cu_seqlens_q, "cu_seqlens_q"),
                            cu_seqlens_k ? &cu_k : nullptr, packed_view(out, "out"), &lse_view,
                            options);
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_varlen_backward(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_k, bool causal, std::optional<double> scale,
    c10::string_view impl, std::int64_t window_left, std::int64_t window_right, double softcap,
    const std::optional<at::Tensor>& alibi_slopes, const std::optional<at::Tensor>& sinks,
    double dropout_p, const std::optional<at::Tensor>& dropout_seed,
    std::int64_t dropout_offset) {
  const VarlenCall call(q, k, v, causal, scale, impl, window_left, window_right, softcap,
                        alibi_slopes, sinks, dropout_p, dropout_seed, dropout_offset);
  const fattn::Options& options = call.options;
  check_rank(dout, "dout", 3, "(total_q, heads, head_dim)");
  check_rank(out, "out", 3, "(total_q, heads, head_dim)");
  check_rank(lse, "lse", 2, "(heads, total_q)");
  at::Tensor dq = at::empty(q.sizes(), q.options());
  at::Tensor dk = at::empty(k.sizes(), k.options());
  at::Tensor dv = at::empty(v.sizes(), v.options());
  at::Tensor dsinks = at::empty({sinks ? sinks->numel() : 0}, q.options().dtype(lse_dtype(q)));
  if (q.numel() == 0 || k.numel() == 0) {  // no (query, key) pair: every gradient is 0
    dq.zero_();
    dk.zero_();
    dv.zero_();
    dsinks.zero_();
    return {dq, dk, dv, dsinks};
  }
  const fattn::TensorView dsinks_view = sinks ? view_of(dsinks, "dsinks") : fattn::TensorView{};
  call_fattn([&] {
    fattn::attention_varlen_backward(
        packed_view(q, "q"), packed_view(k, "k"), packed_view(v, "v"), packed_view(out, "out"),
        packed_view(dout, "dout"), packed_lse_view(lse, "lse"),
        int32_view_of(cu_seqlens_q, "cu_seqlens_q"), int32_view_of(cu_seqlens_k, "cu_seqlens_k"),
        packed_view(dq, "dq"), packed_view(dk, "dk"), packed_view(dv, "dv"), options,
        sinks ? &dsinks_view : nullptr);
  });
  return {dq, dk, dv, dsinks};
}

}  // namespace

TORCH_LIBRARY_IMPL(FATTN_OP_NAMESPACE, CPU, m) {
  m.impl("attention_kvcache", &attention_kvcache);
  m.impl("attention_varlen", &attention_varlen);
  m.impl("attention_varlen_kvcache", &attention_varlen_kvcache);
  m.impl("attention_varlen_backward", &attention_varlen_backward);
}

#ifdef FATTN_WITH_CUDA
TORCH_LIBRARY_IMPL(FATTN_OP_NAMESPACE, CUDA, m) {
  m.impl("attention_kvcache", &attention_kvcache);
}
#endif

// attention_kvcache and attention_varlen_kvcache have no derivative: an output of a call whose inputs require grad
// raises "derivative ... is not implemented" when differentiated; the in-place append bumps
// the caches' version counters, so autograd notices tensors it saved being overwritten.
// (attention_varlen's autograd formula is registered from Python, fattn/_registry.py.)
TORCH_LIBRARY_IMPL(FATTN_OP_NAMESPACE, Autograd, m) {
  m.impl("attention_kvcache", torch::autograd::autogradNotImplementedFallback());
  m.impl("attention_varlen_kvcache", torch::autograd::autogradNotImplementedFallback());
}
TORCH_LIBRARY_IMPL(FATTN_OP_NAMESPACE, ADInplaceOrView, m) {
  m.impl("attention_kvcache", torch::autograd::autogradNotImplementedInplaceOrViewFallback());
}
