// fattn — the PyTorch operators torch.ops.<ns>.* (their schemas are all defined here; the
// KV-cache and varlen kernels are in kv_ops.cpp), and a few helpers in <module>.
//
// One source, two builds:
//   * python/CMakeLists.txt builds it as fattn/_C (pip install .), ns = fattn;
//   * fattn.jit.load() builds it with torch.utils.cpp_extension.load, ns = fattn_jit
//     (FATTN_OP_NAMESPACE), so both can live in one process without one operator
//     being registered twice.
// The C++ library stays free of torch: a tensor reaches it as a fattn::TensorView (its
// data pointer, sizes and strides — no copy, whatever the strides), and fattn's
// parallel loop runs on ATen's thread pool (at::parallel_for) through
// fattn::ParallelRunner, so fattn and torch share one OpenMP team.
//
// Errors: every problem is reported as a RuntimeError whose message starts "fattn: "
// (the library's fattn::Error messages pass through unchanged).
#include <torch/extension.h>
#include <pybind11/stl.h>  // std::vector <-> list

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "fattn/attention.hpp"
#include "fattn/cuda_refusal.hpp"
#include "fattn/kv_cache.hpp"
#include "torch_views.hpp"
#include "variants.hpp"

#include "cuda_seam.hpp"
#include "kvcache_planner.hpp"

#include "op_namespace.hpp"

namespace {

using namespace fattn_torch;


fattn::Causal causal_of(bool is_causal, bool causal_bottom_right) {
  TORCH_CHECK(is_causal || !causal_bottom_right,
              "fattn: causal_bottom_right=True needs is_causal=True (it picks the alignment "
              "of the causal mask)");
  if (!is_causal) return fattn::Causal::none;
  return causal_bottom_right ? fattn::Causal::bottom_right : fattn::Causal::top_left;
}

// What the library cannot see for itself: that the operands are tensors of the right
// rank on one device with one dtype. (Sizes, strides and dtypes are checked again, with
// the expected values in the message, by fattn's own validation.)
void check_operands(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const std::pair<const at::Tensor*, const char*> operands[] = {{&q, "q"}, {&k, "k"}, {&v, "v"}};
  for (const auto& [t, name] : operands) {
    TORCH_CHECK(t->defined(), "fattn: ", name, " is an undefined tensor");
    TORCH_CHECK(t->dim() == 4, "fattn: ", name,
                " must have 4 dimensions (batch, heads, seq, head_dim), got ", t->dim(),
                " with shape ", t->sizes());
  }
  for (const auto& [t, name] : {operands[1], operands[2]}) {
    TORCH_CHECK(t->device() == q.device(), "fattn: ", name, " is on ", t->device(),
                " but q is on ", q.device(), "; q, k and v must be on one device");
    TORCH_CHECK(t->scalar_type() == q.scalar_type(), "fattn: ", name, ".dtype is ",
                t->scalar_type(), " but q.dtype is ", q.scalar_type(),
                "; q, k and v must have one dtype");
  }
}

// Shapes checked here only for the empty problems the library does not take (it wants
// every size positive): the same relations its validation enforces.
void check_empty_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0),
              "fattn: q, k and v must have one batch size, got ", q.size(0), ", ", k.size(0),
              ", ", v.size(0));
  TORCH_CHECK(v.size(1) == k.size(1) && v.size(2) == k.size(2),
              "fattn: v's (heads, seq) must equal k's, got ", v.sizes(), " and ", k.sizes());
  TORCH_CHECK(k.size(3) == q.size(3) && v.size(3) == q.size(3),
              "fattn: q, k and v must have one head dim, got ", q.size(3), ", ", k.size(3), ", ",
              v.size(3));
  TORCH_CHECK(k.size(1) > 0 ? q.size(1) % k.size(1) == 0 : q.size(1) == 0,
              "fattn: q.size(1) (query heads) must be a multiple of k.size(1) (kv heads) = ",
              k.size(1), ", got ", q.size(1));
}

fattn::Options options_for(const at::Tensor& q, bool is_causal, bool causal_bottom_right,
                           std::optional<double> scale, c10::string_view impl) {
  return base_options(q, causal_of(is_causal, causal_bottom_right), scale, impl);
}

// What both dense operators begin with: the operands checked, and the options the call
// asks for, the variants' views among them (they live as long as the call).
struct DenseCall {
  fattn::Options options;
  Variants variants;
  DenseCall(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool is_causal,
            bool causal_bottom_right, std::optional<double> scale, c10::string_view impl,
            const std::optional<at::Tensor>& attn_mask, std::int64_t window_left,
            std::int64_t window_right, double softcap,
            const std::optional<at::Tensor>& alibi_slopes, const std::optional<at::Tensor>& sinks,
            double dropout_p, const std::optional<at::Tensor>& dropout_seed,
            std::int64_t dropout_offset)
      : options((check_operands(q, k, v),
                 options_for(q, is_causal, causal_bottom_right, scale, impl))),
        variants(q.scalar_type(), attn_mask, window_left, window_right, softcap, alibi_slopes,
                 sinks, &options) {
    set_dropout(dropout_p, dropout_seed, dropout_offset, &options);
  }
  DenseCall(const DenseCall&) = delete;
  DenseCall& operator=(const DenseCall&) = delete;
};

// --- the operator -----------------------------------------------------------------------
// attention(q, k, v, is_causal, causal_bottom_right, scale, impl) -> (out, lse)
//   q: (B, Hq, Sq, D)  k, v: (B, Hkv, Sk, D), any strides; Hq a multiple of Hkv
//   out: (B, Hq, Sq, D), laid out as empty_output says
//   lse: (B, Hq, Sq) float32, the natural-log logsumexp of each row's scaled scores
std::tuple<at::Tensor, at::Tensor> attention(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool is_causal,
    bool causal_bottom_right, std::optional<double> scale, c10::string_view impl,
    const std::optional<at::Tensor>& attn_mask, std::int64_t window_left,
    std::int64_t window_right, double softcap, const std::optional<at::Tensor>& alibi_slopes,
    const std::optional<at::Tensor>& sinks, double dropout_p,
    const std::optional<at::Tensor>& dropout_seed, std::int64_t dropout_offset) {
  const DenseCall call(q, k, v, is_causal, causal_bottom_right, scale, impl, attn_mask,
                       window_left, window_right, softcap, alibi_slopes, sinks, dropout_p,
                       dropout_seed, dropout_offset);
  const fattn::Options& options = call.options;
  at::Tensor out = empty_output(q);
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(lse_dtype(q)));

  if (q.numel() == 0 || k.size(2) == 0 || k.size(1) == 0) {
    check_empty_shapes(q, k, v);
    out.zero_();  // no key at all: a row that sees none is 0, its logsumexp -inf (or its sink)
    lse.fill_(-std::numeric_limits<float>::infinity());
    if (sinks && lse.numel() > 0)
      lse.copy_(sinks->to(lse.scalar_type()).view({1, -1, 1}).expand_as(lse));
    return {out, lse};
  }

  const OnDevice on_device(q, options);
  const fattn::Options& run_options = on_device.options;

  const fattn::TensorView qv = view_of(q, "q"), kv = view_of(k, "k"), vv = view_of(v, "v");
  const fattn::TensorView ov = view_of(out, "out"), lv = view_of(lse, "lse");
  try {
    fattn::attention_forward(qv, kv, vv, ov, &lv, run_options);
  } catch (const fattn::Error& e) {
    TORCH_CHECK(false, e.what());
  }
  return {out, lse};
}

// attention_backward(dout, q, k, v, out, lse, dlse, is_causal, causal_bottom_right, scale,
//                    impl) -> (dq, dk, dv)
//   the gradients of attention(q, k, v, ...) -> (out, lse) given dout (and dlse, the
//   gradient of lse, or None); the options must be the forward's. dq is laid out as q's
//   output would be (empty_output), dk and dv as k and v.
//   dsinks: the sinks' gradient (lse's dtype, shape of sinks); empty without sinks.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const std::optional<at::Tensor>& dlse,
    bool is_causal, bool causal_bottom_right, std::optional<double> scale,
    c10::string_view impl, const std::optional<at::Tensor>& attn_mask, std::int64_t window_left,
    std::int64_t window_right, double softcap, const std::optional<at::Tensor>& alibi_slopes,
    const std::optional<at::Tensor>& sinks, double dropout_p,
    const std::optional<at::Tensor>& dropout_seed, std::int64_t dropout_offset) {
  const DenseCall call(q, k, v, is_causal, causal_bottom_right, scale, impl, attn_mask,
                       window_left, window_right, softcap, alibi_slopes, sinks, dropout_p,
                       dropout_seed, dropout_offset);
  const fattn::Options& options = call.options;
  at::Tensor dq = empty_output(q), dk = empty_output(k), dv = empty_output(v);
  at::Tensor dsinks = at::empty({sinks ? sinks->numel() : 0}, q.options().dtype(lse_dtype(q)));
  if (q.numel() == 0 || k.numel() == 0) {
    check_empty_shapes(q, k, v);
    dq.zero_();  // no (query, key) pair: every gradient is 0
    dk.zero_();
    dv.zero_();
    dsinks.zero_();
    return {dq, dk, dv, dsinks};
  }
  const fattn::TensorView dlse_view = dlse ? view_of(*dlse, "dlse") : fattn::TensorView{};
  const fattn::TensorView dsinks_view = sinks ? view_of(dsinks, "dsinks") : fattn::TensorView{};
  const OnDevice on_device(q, options);
  try {
    fattn::attention_backward(view_of(q, "q"), view_of(k, "k"), view_of(v, "v"),
                              view_of(out, "out"), view_of(dout, "dout"), view_of(lse, "lse"),
                              dlse ? &dlse_view : nullptr, view_of(dq, "dq"), view_of(dk, "dk"),
                              view_of(dv, "dv"), on_device.options, sinks ? &dsinks_view : nullptr);
  } catch (const fattn::Error& e) {
    TORCH_CHECK(false, e.what());
  }
  return {dq, dk, dv, dsinks};
}

// Working memory the operator would allocate for this call (fattn::extra_bytes), with
// the thread count it would use.
std::int64_t extra_bytes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         bool is_causal, bool causal_bottom_right, const std::string& impl) {
  check_operands(q, k, v);
  const fattn::Options options = options_for(q, is_causal, causal_bottom_right, std::nullopt, impl);
  try {
    return fattn::extra_bytes(view_of(q, "q"), view_of(k, "k"), view_of(v, "v"), options);
  } catch (const fattn::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

// What the CPU operator runs for this call (fattn::forward_plan) as a dict: impl, isa,
// products and why, and the decode kernel's plan where it runs (None otherwise).
pybind11::dict forward_plan(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            bool is_causal, bool causal_bottom_right, const std::string& impl,
                            std::int64_t kv_splits) {
  check_operands(q, k, v);
  fattn::Options options = options_for(q, is_causal, causal_bottom_right, std::nullopt, impl);
  options.kv_splits = static_cast<int>(kv_splits);
  fattn::ForwardPlan plan;
  try {
    plan = fattn::forward_plan(view_of(q, "q"), view_of(k, "k"), view_of(v, "v"), options);
  } catch (const fattn::Error& e) {
    TORCH_CHECK(false, e.what());
  }
  pybind11::dict d;
  d["impl"] = std::string(fattn::to_string(plan.impl));
  d["isa"] = std::string(fattn::to_string(plan.isa));
  d["products"] = std::string(fattn::to_string(plan.products));
  d["products_reason"] = plan.products_reason;
  if (plan.decode.scores.empty()) {
    d["decode"] = pybind11::none();
  } else {
    pybind11::dict decode;
    decode["scores"] = plan.decode.scores;
    decode["reads_in_place"] = plan.decode.reads_in_place;
    decode["key_tile"] = plan.decode.key_tile;
    decode["rows"] = plan.decode.rows;
    decode["heads_per_item"] = plan.decode.heads_per_item;
    decode["splits"] = plan.decode.splits;
    decode["prefetch_tiles"] = plan.decode.prefetch_tiles;
    decode["prefetch_level"] = plan.decode.prefetch_level;
    decode["items"] = plan.decode.items;
    decode["reason"] = plan.decode.reason;
    d["decode"] = decode;
  }
  return d;
}

std::int64_t backward_extra_bytes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  bool is_causal, bool causal_bottom_right,
                                  const std::string& impl) {
  check_operands(q, k, v);
  const fattn::Options options = options_for(q, is_causal, causal_bottom_right, std::nullopt, impl);
  try {
    return fattn::backward_extra_bytes(view_of(q, "q"), view_of(k, "k"), view_of(v, "v"),
                                       options);
  } catch (const fattn::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

}  // namespace

// The variants' arguments: every one but attn_mask (the KV-cache and varlen operators,
// whose sequences have their own lengths), and all (attention and its backward).
#define SEQUENCE_VARIANT_ARGS                                                              \
  "int window_left=-1, int window_right=-1, float softcap=0.0, Tensor? alibi_slopes=None, " \
  "Tensor? sinks=None"
#define VARIANT_ARGS "Tensor? attn_mask=None, " SEQUENCE_VARIANT_ARGS
// Attention dropout (training): the probability and the Philox stream (seed, offset) that
// the forward and its backward share.
#define DROPOUT_ARGS ", float dropout_p=0.0, Tensor? dropout_seed=None, int dropout_offset=0"

TORCH_LIBRARY(FATTN_OP_NAMESPACE, m) {
#ifdef FATTN_PYTHON_MODULE
  // Where the fake (meta) kernels live: torch asks for this module to be imported when
  // the operator is traced without them.
  m.set_python_module(FATTN_PYTHON_MODULE);
#endif
  m.def(
      "attention(Tensor q, Tensor k, Tensor v, bool is_causal=False, "
      "bool causal_bottom_right=False, float? scale=None, str impl=\"auto\", "
      VARIANT_ARGS DROPOUT_ARGS ") -> (Tensor out, Tensor lse)",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
      "Tensor? dlse=None, bool is_causal=False, bool causal_bottom_right=False, "
      "float? scale=None, str impl=\"auto\", " VARIANT_ARGS DROPOUT_ARGS
      ") -> (Tensor dq, Tensor dk, Tensor dv, Tensor dsinks)",
      {at::Tag::pt2_compliant_tag});
  // KV cache and packed variable-length sequences: CPU kernels in kv_ops.cpp (layouts and
  // semantics there). attention_kvcache writes k_new and v_new into the caches in place,
  // hence the (a!) and (b!) annotations; it is inference-only.
  m.def(
      "attention_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k_new=None, "
      "Tensor? v_new=None, Tensor? cache_seqlens=None, Tensor? block_table=None, "
      "bool causal=False, float? scale=None, int kv_splits=0, str impl=\"auto\", "
      SEQUENCE_VARIANT_ARGS ") -> (Tensor out, Tensor lse)",
      {at::Tag::pt2_compliant_tag});
  // The Triton kernels' attention_kvcache (registered for CUDA from Python,
  // fattn/cuda_dispatch.py): the CUDA kernel of attention_kvcache calls it for what the C++
  // decode kernel does not take, and for impl="triton".
  m.def(
      "triton_attention_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, "
      "Tensor? k_new=None, Tensor? v_new=None, Tensor? cache_seqlens=None, "
      "Tensor? block_table=None, bool causal=False, float? scale=None, int kv_splits=0, "
      "str impl=\"auto\", " SEQUENCE_VARIANT_ARGS ") -> (Tensor out, Tensor lse)");
  m.def(
      "attention_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
      "bool causal=False, float? scale=None, str impl=\"auto\", " SEQUENCE_VARIANT_ARGS
      DROPOUT_ARGS ") -> (Tensor out, Tensor lse)",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "attention_varlen_kvcache(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, "
      "Tensor? cu_seqlens_k=None, Tensor? seqused_k=None, Tensor? block_table=None, "
      "bool causal=False, float? scale=None, str impl=\"auto\", " SEQUENCE_VARIANT_ARGS
      ") -> (Tensor out, Tensor lse)",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "attention_varlen_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, "
      "Tensor lse, Tensor cu_seqlens_q, Tensor cu_seqlens_k, bool causal=False, "
      "float? scale=None, str impl=\"auto\", " SEQUENCE_VARIANT_ARGS DROPOUT_ARGS
      ") -> (Tensor dq, Tensor dk, Tensor dv, Tensor dsinks)",
      {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(FATTN_OP_NAMESPACE, CPU, m) {
  m.impl("attention", &attention);
  m.impl("attention_backward", &attention_backward);
}

// ---- CUDA -------------------------------------------------------------------------------
// The operators' CUDA kernels are registered from Python (fattn/cuda_dispatch.py, the one
// dispatch table: the Triton kernels, or these C++ ones). The library's CUDA kernels are
// reached through their own operator, cuda_attention (attention's schema without the
// attn_mask, which they do not take), which the table calls where they run the call.
// fattn::attention_forward dispatches on TensorView::device (Device::cuda) and runs on
// torch's current stream (set in attention above). Defined only when the library is built
// with its CUDA backend (FATTN_WITH_CUDA, python/CMakeLists.txt).
#ifdef FATTN_WITH_CUDA
namespace {
std::tuple<at::Tensor, at::Tensor> cuda_attention(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool is_causal,
    bool causal_bottom_right, std::optional<double> scale, c10::string_view impl,
    std::int64_t window_left, std::int64_t window_right, double softcap,
    const std::optional<at::Tensor>& alibi_slopes, const std::optional<at::Tensor>& sinks) {
  return attention(q, k, v, is_causal, causal_bottom_right, scale, impl, std::nullopt,
                   window_left, window_right, softcap, alibi_slopes, sinks, 0.0, std::nullopt, 0);
}
// The Hopper backward (fattn::cuda_backward_refusal says what it takes; the table asks
// cuda_dispatch.plan): attention_backward's schema without what it does not take.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> cuda_attention_backward(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const std::optional<at::Tensor>& dlse,
    bool is_causal, bool causal_bottom_right, std::optional<double> scale,
    std::int64_t window_left, std::int64_t window_right, double softcap,
    const std::optional<at::Tensor>& alibi_slopes, const std::optional<at::Tensor>& sinks) {
  // The kernels read rows of head_dim contiguous elements; autograd may hand over an expanded
  // dout (the gradient of a sum: every stride 0), or saved inputs with other rows.
  auto rows = [](const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); };
  return attention_backward(rows(dout), rows(q), rows(k), rows(v), rows(out), lse, dlse, is_causal,
                            causal_bottom_right, scale, "auto", std::nullopt, window_left,
                            window_right, softcap, alibi_slopes, sinks, 0.0, std::nullopt, 0);
}
}  // namespace

TORCH_LIBRARY_FRAGMENT(FATTN_OP_NAMESPACE, m) {
  m.def(
      "cuda_attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, "
      "Tensor lse, Tensor? dlse=None, bool is_causal=False, bool causal_bottom_right=False, "
      "float? scale=None, int window_left=-1, int window_right=-1, float softcap=0.0, "
      "Tensor? alibi_slopes=None, Tensor? sinks=None) "
      "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dsinks)");
  m.def(
      "cuda_attention(Tensor q, Tensor k, Tensor v, bool is_causal=False, "
      "bool causal_bottom_right=False, float? scale=None, str impl=\"auto\", "
      "int window_left=-1, int window_right=-1, float softcap=0.0, Tensor? alibi_slopes=None, "
      "Tensor? sinks=None) -> (Tensor out, Tensor lse)");
}

TORCH_LIBRARY_IMPL(FATTN_OP_NAMESPACE, CUDA, m) {
  m.impl("cuda_attention", &cuda_attention);
  m.impl("cuda_attention_backward", &cuda_attention_backward);
}
#endif

namespace {

// The dispatch table's dtype names (table.json) as the library's.
fattn::DType dtype_named(const std::string& name) {
  if (name == "float16") return fattn::DType::float16;
  if (name == "bfloat16") return fattn::DType::bfloat16;
  if (name == "float32") return fattn::DType::float32;
  TORCH_CHECK(false, "fattn: dtype must be float16, bfloat16 or float32, got '", name, "'");
}

// fattn::cuda_refusal with the call's fields as arguments (fattn/cuda_refusal.hpp).
std::string cuda_refusal(const std::string& kernel, const std::string& entry,
                         const std::string& dtype, std::int64_t head_dim, int major, int minor,
                         std::int64_t window_left, std::int64_t window_right, bool softcap,
                         bool alibi, bool sinks, bool attn_mask, bool allow_tf32) {
  fattn::CudaCall call;
  call.entry = entry;
  call.dtype = dtype_named(dtype);
  call.head_dim = head_dim;
  call.major = major;
  call.minor = minor;
  call.window_left = window_left;
  call.window_right = window_right;
  call.softcap = softcap;
  call.alibi = alibi;
  call.sinks = sinks;
  call.attn_mask = attn_mask;
  call.allow_tf32 = allow_tf32;
  try {
    return fattn::cuda_refusal(kernel, call);
  } catch (const fattn::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "fattn's PyTorch extension: registers torch.ops." FATTN_STRINGIFY(
      FATTN_OP_NAMESPACE) ".attention, .attention_kvcache, .attention_varlen (and their "
                          "backwards); helpers for the Python package";
  fattn_torch::bind_kvcache_planner(m);
  m.attr("op_namespace") = FATTN_STRINGIFY(FATTN_OP_NAMESPACE);
#ifdef FATTN_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
  m.def("version", [] { return std::string(fattn::version()); }, "fattn's C++ library version");
  m.def(
      "dropout_mask",
      [](std::int64_t batch, std::int64_t heads, std::int64_t q_len, std::int64_t kv_len,
         double p, std::int64_t seed, std::int64_t offset) {
        fattn::Options options;
        fattn_torch::set_dropout(p, at::scalar_tensor(seed, at::kLong), offset, &options);
        at::Tensor keep = at::empty({batch, heads, q_len, kv_len}, at::kBool);
        try {
          fattn::dropout_mask(options, batch, heads, q_len, kv_len,
                              reinterpret_cast<std::uint8_t*>(keep.data_ptr<bool>()));
        } catch (const fattn::Error& e) {
          TORCH_CHECK(false, e.what());
        }
        return keep;
      },
      "the dropout mask (batch, heads, q_len, kv_len) bool of (dropout_p, seed, offset): True "
      "where a probability survives (src/model/dropout.hpp)");
  m.def("cuda_tma_head_dims", &fattn::cuda_tma_head_dims,
        "the head dims this build's Hopper TMA kernel (fused_tma) is compiled for (empty without "
        "the CUDA backend or its sm_90a kernels)");
  m.def("cuda_decode_head_dims", &fattn::cuda_decode_head_dims,
        "the head dims this build's CUDA decode kernel is compiled for (empty without the CUDA "
        "backend); multiples of 8 up to the largest run on it");
  m.def("cuda_backward_head_dims", &fattn::cuda_backward_head_dims,
        "the head dims this build's Hopper backward is compiled for (empty without the CUDA "
        "backend or its sm_90a kernels); smaller ones run on the next one");
  m.def("cuda_refusal", &cuda_refusal, pybind11::arg("kernel"), pybind11::arg("entry"),
        pybind11::arg("dtype"), pybind11::arg("head_dim"), pybind11::arg("major"),
        pybind11::arg("minor"), pybind11::arg("window_left"), pybind11::arg("window_right"),
        pybind11::arg("softcap"), pybind11::arg("alibi"), pybind11::arg("sinks"),
        pybind11::arg("attn_mask"), pybind11::arg("allow_tf32"),
        "why the CUDA C++ kernel `kernel` of the dispatch table (table.json's cuda_cpp kernels) "
        "does not take a call of this entry, dtype (float16, bfloat16, float32), head dim, "
        "compute capability (major, minor) and variants in this build: '' where it does; "
        "without the CUDA backend every kernel is refused, saying so; with it, an unknown kernel "
        "or entry is a RuntimeError");
  m.def("cuda_verified_kernels", &fattn::cuda_verified_kernels,
        "the C++ kernels Impl::automatic treats as verified, as kernel@architecture (the "
        "build's list until set_cuda_verified_kernels)");
  m.def(
      "set_cuda_verified_kernels",
      [](const std::vector<std::string>& kernels) {
        try {
          fattn::set_cuda_verified_kernels(kernels);
        } catch (const fattn::Error& e) {
          TORCH_CHECK(false, e.what());
        }
      },
      pybind11::arg("kernels"),
      "replaces the C++ kernels Impl::automatic treats as verified (kernel@architecture); the "
      "Python dispatch then warns itself");
  m.def("best_cpu_isa", [] { return std::string(fattn::to_string(fattn::best_cpu_isa())); },
        "the widest instruction set of this CPU that fattn has kernels for");
  m.def(
      "bf16_products",
      [] {
        try {
          const fattn::Bf16ProductsChoice& choice = fattn::bf16_products_choice();
          return std::make_pair(std::string(fattn::to_string(choice.products)), choice.reason);
        } catch (const fattn::Error& e) {
          TORCH_CHECK(false, e.what());
        }
      },
      "(products, reason): what bfloat16 inputs on avx512 multiply on in this process "
      "(bf16_dot: vdpbf16ps, fma: widened to float32 FMAs) and why");
  m.def(
      "cpu_supports",
      [](const std::string& isa) {
        try {
          return fattn::cpu_supports(fattn::parse_isa(isa));
        } catch (const fattn::Error& e) {
          TORCH_CHECK(false, e.what());
        }
      },
      pybind11::arg("isa"));
  m.def(
      "set_cpu_isa",
      [](const std::string& isa) {
        fattn::Isa wanted;
        try {
          wanted = fattn::parse_isa(isa);
        } catch (const fattn::Error& e) {
          TORCH_CHECK(false, e.what());
        }
        TORCH_CHECK(fattn::cpu_supports(wanted), "fattn: isa ", isa,
                    " is not supported by this CPU", fattn::cpu_unsupported_reason());
        return std::string(fattn::to_string(cpu_isa.exchange(wanted)));
      },
      pybind11::arg("isa"),
      "the instruction set of every later CPU call of this process (auto: the library's "
      "choice per problem, the default); returns the one before. For tests: the AVX2 "
      "kernels on an AVX-512 machine");
  m.def(
      "set_cuda_decode_stages",
      [](int stages) {
        TORCH_CHECK(stages >= 0, "fattn: the CUDA decode kernel's stages must be >= 0 (0: "
                    "chosen per call), got ", stages);
        return cuda_decode_stages.exchange(stages);
      },
      pybind11::arg("stages"),
      "the CUDA decode kernel's cp.async ring depth for every later KV-cache call of this "
      "process (0: chosen per call, the default; 2 to 4 where shared memory allows); returns "
      "the one before. For the benchmark that measures the choice");
  m.def("num_threads", [] { return at::get_num_threads(); },
        "threads the CPU operator uses: torch.get_num_threads()");
  m.def("extra_bytes", &extra_bytes, pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"),
        pybind11::arg("is_causal") = false, pybind11::arg("causal_bottom_right") = false,
        pybind11::arg("impl") = "auto",
        "bytes of working memory the operator allocates for this call");
  m.def("forward_plan", &forward_plan, pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"),
        pybind11::arg("is_causal") = false, pybind11::arg("causal_bottom_right") = false,
        pybind11::arg("impl") = "auto", pybind11::arg("kv_splits") = 0,
        "what the CPU operator runs for this call: impl, isa, products (and why), and the "
        "decode kernel's plan where it runs");
  m.def("release_cached_memory", &fattn::release_cached_memory,
        "frees the working memory fattn's CPU kernels keep between calls");
  m.def("backward_extra_bytes", &backward_extra_bytes, pybind11::arg("q"), pybind11::arg("k"),
        pybind11::arg("v"), pybind11::arg("is_causal") = false,
        pybind11::arg("causal_bottom_right") = false, pybind11::arg("impl") = "auto",
        "bytes of working memory the backward operator allocates for this call");
}
