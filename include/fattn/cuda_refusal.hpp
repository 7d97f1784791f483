// fattn — which CUDA C++ kernel of the GPU dispatch table takes a call, asked without a
// device or tensors. The table (python/fattn/dispatch/table.json) lists per call the
// candidate kernels in order of preference; the Python operators and the C++ library's
// Impl::automatic ask these functions about each C++ ("cuda_cpp") candidate.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fattn/kv_cache.hpp"
#include "fattn/tensor.hpp"

namespace fattn {

// A call as the dispatch table sees it: what decides which kernel may run it.
//   entry:     the table's entry: "forward", "varlen", "kvcache", "backward" or
//              "varlen_backward"
//   dtype:     of q (float16, bfloat16 or float32 on CUDA)
//   head_dim:  q.size(3)
//   major, minor: the compute capability of the device it would run on
//   window_left, window_right: the sliding window's sides (-1: unbounded)
//   softcap, alibi, sinks, attn_mask: whether the call has them
//   allow_tf32: float32 may run in TF32 mode (Options::allow_tf32)
struct CudaCall {
  std::string entry = "forward";
  DType dtype = DType::float16;
  std::int64_t head_dim = 0;
  int major = 0, minor = 0;
  std::int64_t window_left = -1, window_right = -1;
  bool softcap = false, alibi = false, sinks = false, attn_mask = false;
  bool allow_tf32 = false;
};

// Why the CUDA C++ kernel `kernel` (a "cuda_cpp" kernel of table.json: fused_tma,
// fused_tma_variants, fused_mma, fused_tf32x3, fused_tf32, decode, backward_tma) does not
// take `call` in this build: "" where it does, else a sentence naming the argument, what the
// kernel takes and what the call has. A pure function of the build and the call: nothing on
// a device is read. Without the CUDA backend every kernel is refused, saying so; with it, an
// unknown kernel or entry name (a Triton kernel's included) is an Error.
std::string cuda_refusal(const std::string& kernel, const CudaCall& call);

// The C++ kernels Impl::automatic treats as verified on an architecture, as
// "kernel@architecture" (e.g. "fused_mma@sm_90"): by default the build's list (this build's
// SASS against python/fattn/dispatch/verified.json); Impl::automatic runs the first verified
// candidate of the dispatch table's row, else the first that takes the call with a warning on
// stderr once per kernel (an Error under FATTN_REQUIRE_VERIFIED=1). Setting the list replaces
// it and leaves the warning to the caller (the Python package passes its records, the user's
// own from python -m fattn.selftest included). Empty, and setting it is a no-op, without the
// CUDA backend.
std::vector<std::string> cuda_verified_kernels();
void set_cuda_verified_kernels(const std::vector<std::string>& kernel_at_architecture);

// The kernel the torch operator runs for an attention_kvcache call on CUDA views with
// impl auto: the first candidate of table.json's "kvcache" row for the call that takes it,
// on the current device — "decode" (the C++ decode kernel, where cuda_kvcache_refusal is
// empty too) or a Triton kernel's name, which the caller runs; "" where no candidate does
// (and without the CUDA backend).
std::string cuda_kvcache_kernel(const TensorView& q, const KvCache& cache,
                                const TensorView* k_new, const TensorView* v_new,
                                const Options& options = {});

}  // namespace fattn
