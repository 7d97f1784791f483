// fattn — fattn::cuda_refusal (fattn/cuda_refusal.hpp): the dispatch table's question to the
// CUDA backend. Without the backend every C++ kernel is refused, saying so (this unit then
// needs no CUDA header or generated table: fattn.jit builds it from the installed sources).
// (cuda_kvcache_kernel: kv_cache.cpp, with the KV cache.)
#include "fattn/cuda_refusal.hpp"

#include <string>
#include <vector>

#ifdef FATTN_WITH_CUDA
#include "cuda/refusal.hpp"
#include "cuda/verified.hpp"
#endif

namespace fattn {

std::string cuda_refusal(const std::string& kernel, const CudaCall& call) {
#ifdef FATTN_WITH_CUDA
  return cuda::refusal(cuda::table_kernel(kernel), call);
#else
  (void)kernel, (void)call;
  return "this build of fattn has no CUDA backend (rebuild with -DFATTN_CUDA=ON)";
#endif
}

std::vector<std::string> cuda_verified_kernels() {
#ifdef FATTN_WITH_CUDA
  return cuda::verified_kernels();
#else
  return {};
#endif
}

void set_cuda_verified_kernels(const std::vector<std::string>& kernel_at_architecture) {
#ifdef FATTN_WITH_CUDA
  cuda::set_verified_kernels(kernel_at_architecture);
#else
  (void)kernel_at_architecture;
#endif
}

}  // namespace fattn
