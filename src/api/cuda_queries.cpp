// fattn — what the CUDA backend answers about itself: whether a C++ kernel takes a call
// (fattn::cuda_refusal, the dispatch table's question; fattn/cuda_refusal.hpp), which kernels
// a GPU run verified, the head dims each family is built for, and which decode kernel a
// KV-cache call takes. Without the backend every kernel is refused, saying so, and every list
// is empty: those answers are written once, here (this unit then needs no CUDA header or
// generated table: fattn.jit builds it from the installed sources).
#include <string>
#include <vector>

#include "fattn/attention.hpp"
#include "fattn/cuda_refusal.hpp"
#include "fattn/kv_cache.hpp"

#ifdef FATTN_WITH_CUDA
#include "cuda/backend.hpp"
#include "cuda/decode.hpp"
#include "cuda/refusal.hpp"
#include "cuda/table_choice.hpp"
#include "cuda/verified.hpp"
#endif

namespace fattn {

#ifdef FATTN_WITH_CUDA

std::string cuda_refusal(const std::string& kernel, const CudaCall& call) {
  return cuda::refusal(cuda::table_kernel(kernel), call);
}
std::vector<std::string> cuda_verified_kernels() { return cuda::verified_kernels(); }
void set_cuda_verified_kernels(const std::vector<std::string>& kernel_at_architecture) {
  cuda::set_verified_kernels(kernel_at_architecture);
}
std::vector<int> cuda_tma_head_dims() { return cuda::tma_head_dims(); }
std::vector<int> cuda_backward_head_dims() { return cuda::backward_head_dims(); }
std::vector<int> cuda_decode_head_dims() { return cuda::decode_head_dims(); }
std::string cuda_backward_refusal(const TensorView& q, const TensorView& k, const Options& options) {
  return cuda::backward_refusal(q, k, options);
}
std::string cuda_kvcache_refusal(const TensorView& q, const KvCache& cache,
                                 const TensorView* k_new, const TensorView* v_new,
                                 const Options& options) {
  return cuda::decode_refusal(q, cache, k_new, v_new, options);
}
std::string cuda_kvcache_kernel(const TensorView& q, const KvCache& cache,
                                const TensorView* k_new, const TensorView* v_new,
                                const Options& options) {
  return cuda::kvcache_kernel(q, cache, k_new, v_new, options);
}

#else

namespace {
const char kNoCudaBackend[] = "this build of fattn has no CUDA backend (rebuild with -DFATTN_CUDA=ON)";
}  // namespace

std::string cuda_refusal(const std::string&, const CudaCall&) { return kNoCudaBackend; }
std::vector<std::string> cuda_verified_kernels() { return {}; }
void set_cuda_verified_kernels(const std::vector<std::string>&) {}
std::vector<int> cuda_tma_head_dims() { return {}; }
std::vector<int> cuda_backward_head_dims() { return {}; }
std::vector<int> cuda_decode_head_dims() { return {}; }
std::string cuda_backward_refusal(const TensorView&, const TensorView&, const Options&) {
  return kNoCudaBackend;
}
std::string cuda_kvcache_refusal(const TensorView&, const KvCache&, const TensorView*,
                                 const TensorView*, const Options&) {
  return kNoCudaBackend;
}
std::string cuda_kvcache_kernel(const TensorView&, const KvCache&, const TensorView*,
                                const TensorView*, const Options&) {
  return {};
}

#endif

}  // namespace fattn
