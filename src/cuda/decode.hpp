// fattn — the CUDA backend's KV-cache attention (fattn::attention_kvcache on cuda views):
// the decode kernels of decode.cuh, planned and launched from the host without reading any
// device tensor, so a call never waits for the GPU and can be captured in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "cuda/decode_params.hpp"
#include "fattn/kv_cache.hpp"

namespace fattn::cuda {

// What the decode kernels take, or why not (empty: they take the call): float16 or
// bfloat16; a head dim that is a multiple of 8 up to the largest of decode_head_dims();
// q, the caches, k_new and v_new 16-byte aligned with strides in whole 16-byte rows (the
// kernels copy 16-byte chunks); impl auto or decode. Only the arguments' views are read.
std::string decode_refusal(const TensorView& q, const KvCache& cache, const TensorView* k_new,
                           const TensorView* v_new, const Options& options);

// The head dims the decode kernels are compiled for (ascending); smaller dims run on the
// next one, the columns past the head dim never read.
std::vector<int> decode_head_dims();

// fattn::attention_kvcache for Device::cuda views: validated (model/kv_cache_problem.hpp,
// without reading seqlens or block_table), then check_cache (with an append), split_decode
// and, with several key splits, combine_splits are enqueued on options.cuda_stream; the
// call returns without synchronising. A wrong cache_seqlens or block_table entry stops the
// stream with a device-side assertion naming the argument, before anything is written.
// options.kv_splits and options.decode_stages force the split count and ring depth.
void attention_kvcache(const TensorView& q, const KvCache& cache, const TensorView* k_new,
                       const TensorView* v_new, const TensorView& out, const TensorView* lse,
                       const Options& options);

// Device bytes attention_kvcache allocates for this call: the splits' partial rows.
std::int64_t kvcache_extra_bytes(const TensorView& q, const KvCache& cache,
                                 const TensorView* k_new, const Options& options);

// The launches of one planned call (decode.cu): T and the compiled head dim from the
// dtype and plan; splits and stages in p / the argument.
void launch_decode(const DecodeParams& p, DType dtype, int kernel_dim, int stages,
                   cudaStream_t stream);

// Dynamic shared memory of split_decode at a compiled head dim and ring depth.
std::int64_t decode_smem_bytes(int kernel_dim, int stages);

}  // namespace fattn::cuda
