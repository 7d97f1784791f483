// fattn — the Hopper backward's launches (backward_tma.cuh): the tensor maps, the three grids
// and their shared memory. Compiled for sm_90a only (cmake/cuda.cmake's fattn_cuda_sm90a);
// backward.cpp runs it on compute capability 9.0.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/backward_tma.cuh"
#include "cuda/launchers.hpp"
#include "cuda/tma_host.hpp"

namespace fattn::cuda {
namespace {

constexpr const char* kName = "hopper_backward";

// The maps of one gradient kernel: Q and dO in boxes of query_rows rows, K and V of key_rows.
template <class T>
BackwardMaps backward_maps(const BackwardParams& bp, std::uint32_t query_rows, std::uint32_t key_rows) {
  const Params& p = bp.p;
  constexpr CUtensorMapDataType type = tma_data_type<T>();
  BackwardMaps maps;
  encode_or_fail(&maps.q, type, head_geometry(p.q, p.q_stride, p.batch, p.q_heads, p.q_len, p.head_dim),
                 query_rows, "q", kName);
  encode_or_fail(&maps.dout, type,
                 head_geometry(bp.dout, bp.dout_stride, p.batch, p.q_heads, p.q_len, p.head_dim),
                 query_rows, "dout", kName);
  encode_or_fail(&maps.k, type, head_geometry(p.k, p.k_stride, p.batch, p.kv_heads, p.kv_len, p.head_dim),
                 key_rows, "k", kName);
  encode_or_fail(&maps.v, type, head_geometry(p.v, p.v_stride, p.batch, p.kv_heads, p.kv_len, p.head_dim),
                 key_rows, "v", kName);
  return maps;
}

template <class Kernel>
void launch_with_smem(Kernel kernel, unsigned blocks, int smem_bytes, const BackwardParams& bp,
                      const BackwardMaps& maps, cudaStream_t stream, const char* what) {
  if (blocks == 0) return;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes), what);
  kernel<<<blocks, kBackwardThreads, smem_bytes, stream>>>(bp, maps);
  check_launch(what);
}

}  // namespace

template <class T, int D>
void launch_hopper_backward(const BackwardParams& bp, cudaStream_t stream) {
  const Params& p = bp.p;
  const long long rows = static_cast<long long>(p.batch) * p.q_heads * bp.rows_pad;
  const auto row_blocks = static_cast<unsigned>((rows + kRowPassWarps - 1) / kRowPassWarps);
  if (row_blocks > 0) {
    backward_rows_kernel<T><<<row_blocks, 32 * kRowPassWarps, 0, stream>>>(bp);
    check_launch("backward_rows_kernel");
  }
  if (p.sinks) {
    backward_sinks_kernel<<<static_cast<unsigned>(p.q_heads), kSinkSumThreads, 0, stream>>>(bp);
    check_launch("backward_sinks_kernel");
  }
  using Keys = KeyBlockShape<D>;
  using Queries = QueryBlockShape<D>;
  // One dimension each (backward.cpp checked they fit in int): (batch, head) fastest.
  const auto key_grid = static_cast<unsigned>((p.kv_len + Keys::kKeys - 1) / Keys::kKeys * p.kv_heads * p.batch);
  const auto query_grid = static_cast<unsigned>((p.q_len + Queries::kRows - 1) / Queries::kRows * p.q_heads * p.batch);
  const BackwardMaps key_maps = backward_maps<T>(bp, Keys::kRows, Keys::kKeys);
  const BackwardMaps query_maps = backward_maps<T>(bp, Queries::kRows, Queries::kKeys);
  // Softcap or ALiBi: the instantiation that takes them (sinks change only the row pass).
  const bool score_mods = p.softcap != 0.0f || p.alibi;
  launch_with_smem(score_mods ? backward_key_blocks_kernel<T, D, true> : backward_key_blocks_kernel<T, D, false>,
                   key_grid, Keys::Ring::kSmemBytes, bp, key_maps, stream, "backward_key_blocks_kernel");
  launch_with_smem(score_mods ? backward_query_blocks_kernel<T, D, true> : backward_query_blocks_kernel<T, D, false>,
                   query_grid, Queries::Ring::kSmemBytes, bp, query_maps, stream, "backward_query_blocks_kernel");
}

template void launch_hopper_backward<__half, 64>(const BackwardParams&, cudaStream_t);
template void launch_hopper_backward<__half, 128>(const BackwardParams&, cudaStream_t);
template void launch_hopper_backward<__nv_bfloat16, 64>(const BackwardParams&, cudaStream_t);
template void launch_hopper_backward<__nv_bfloat16, 128>(const BackwardParams&, cudaStream_t);

}  // namespace fattn::cuda
