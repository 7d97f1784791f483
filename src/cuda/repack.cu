// fattn — copies an input the fused kernels cannot read with 16-byte cp.async
// (misaligned pointer or strides, or a head dim that is not a whole number of
// 16-byte chunks) into contiguous [B][H][S][row] memory, zero-padded from head_dim to
// row. One thread per destination element, grid-stride; a plain copy kernel.
#include "cuda/common.cuh"
#include "cuda/launchers.hpp"

namespace fattn::cuda {
namespace {

template <class T>
__global__ void __launch_bounds__(256)
    repack_kernel(const T* src, Strides3 s, int heads, int seq, int head_dim, T* dst, int row,
                  std::int64_t total) {
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       e < total; e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int d = static_cast<int>(e % row);
    std::int64_t r = e / row;
    const int i = static_cast<int>(r % seq);
    r /= seq;
    const int h = static_cast<int>(r % heads);
    const std::int64_t b = r / heads;
    dst[e] = d < head_dim ? src[b * s.batch + h * s.head + i * s.seq + d] : from_float<T>(0.0f);
  }
}

}  // namespace

template <class T>
void launch_repack(const void* src, Strides3 src_stride, int batch, int heads, int seq,
                   int head_dim, void* dst, int row, cudaStream_t stream) {
  const std::int64_t total = static_cast<std::int64_t>(batch) * heads * seq * row;
  std::int64_t blocks = (total + 255) / 256;
  if (blocks > 65536) blocks = 65536;  // grid-stride beyond: plenty of blocks for a copy
  repack_kernel<T><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      static_cast<const T*>(src), src_stride, heads, seq, head_dim, static_cast<T*>(dst), row,
      total);
  check_launch("repack_kernel");
}

template void launch_repack<float>(const void*, Strides3, int, int, int, int, void*, int,
                                   cudaStream_t);
template void launch_repack<__half>(const void*, Strides3, int, int, int, int, void*, int,
                                    cudaStream_t);
template void launch_repack<__nv_bfloat16>(const void*, Strides3, int, int, int, int, void*, int,
                                           cudaStream_t);

}  // namespace fattn::cuda
