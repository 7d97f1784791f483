// fattn — the decode kernels' launches (decode.cuh), one instance per element type and
// compiled head dim (decode_tiles.hpp's DecodeHeadDims).
#include <string>

#include "cuda/decode.cuh"
#include "cuda/host_checks.hpp"
#include "cuda/launchers.hpp"

namespace fattn::cuda {

std::int64_t decode_smem_bytes(int kernel_dim, int stages) {
  const DecodeTiles tiles = DecodeTiles::at(kernel_dim);
  const std::int64_t merge =
      static_cast<std::int64_t>(DecodeTiles::kRows) * tiles.pitch * 2 + tiles.merge_bytes();
  const std::int64_t ring = tiles.smem_bytes(stages);
  return ring > merge ? ring : merge;
}

namespace {

// The combine kernel's rows per block: one warp each.
constexpr int kCombineWarps = 4;

template <class T, int D>
void launch_instance(const DecodeParams& p, int stages, cudaStream_t stream) {
  if (p.new_len > 0) {
    decode::check_cache<<<p.batch, DecodeTiles::kThreads, 0, stream>>>(p);
    check_launch("check_cache (decode)");
  }
  const int smem = static_cast<int>(decode_smem_bytes(D, stages));
  // Every launch, as launch_per_query_tile: the attribute belongs to the current device's
  // context, and a process may launch on several.
  check_cuda(cudaFuncSetAttribute(decode::split_decode<T, D>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "cudaFuncSetAttribute(split_decode, max dynamic shared memory)");
  const int row_tiles = (p.q_len * p.group + DecodeTiles::kRows - 1) / DecodeTiles::kRows;
  const dim3 grid(static_cast<unsigned>(p.splits), static_cast<unsigned>(p.kv_heads * row_tiles),
                  static_cast<unsigned>(p.batch));
  decode::split_decode<T, D><<<grid, DecodeTiles::kThreads, smem, stream>>>(p, stages);
  check_launch("split_decode");
  if (p.splits > 1) {
    const long long rows = static_cast<long long>(p.batch) * p.q_heads * p.q_len;
    decode::combine_splits<T><<<static_cast<unsigned>((rows + kCombineWarps - 1) / kCombineWarps),
                                32 * kCombineWarps, 0, stream>>>(p);
    check_launch("combine_splits (decode)");
  }
}

template <class T, int... Dims>
void launch_dim(std::integer_sequence<int, Dims...>, const DecodeParams& p, int kernel_dim,
                int stages, cudaStream_t stream) {
  const bool found =
      ((kernel_dim == Dims && (launch_instance<T, Dims>(p, stages, stream), true)) || ...);
  if (!found) fail("internal error: no decode kernel for head dim " + std::to_string(kernel_dim));
}

}  // namespace

void launch_decode(const DecodeParams& p, DType dtype, int kernel_dim, int stages,
                   cudaStream_t stream) {
  if (dtype == DType::float16)
    return launch_dim<__half>(DecodeHeadDims{}, p, kernel_dim, stages, stream);
  if (dtype == DType::bfloat16)
    return launch_dim<__nv_bfloat16>(DecodeHeadDims{}, p, kernel_dim, stages, stream);
  fail(std::string("internal error: no decode kernel for ") + to_string(dtype));
}

}  // namespace fattn::cuda
