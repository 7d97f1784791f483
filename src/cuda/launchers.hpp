// fattn — the CUDA kernels' launchers: what each takes besides Params, and their one
// signature per kernel family.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/backend.hpp"
#include "cuda/backward_params.hpp"
#include "cuda/params.hpp"

namespace fattn::cuda {

// What a fused launcher takes besides Params: the kernel it runs (the 3xTF32 or TF32
// mode, the serial or pipelined wgmma schedule) and the query rows per block of the
// warp-slice kernels (64, or 128 where the head dim allows it; plan.hpp chooses).
struct FusedLaunch {
  Kernel kernel = Kernel::automatic;
  int tile_rows = 0;
  int stages = 0;  // fused_tma's K/V ring: 0 its tile table's, else tma_alternative_stages (plan.hpp)
  int blocks = 0;  // the persistent TMA kernels' grid: 0 one block per SM, else at most this many
};

// Launchers. Each is explicitly instantiated in exactly one translation unit: the
// fused ones per head dim in the files cmake/cuda.cmake generates from
// FATTN_CUDA_HEAD_DIMS (src/cuda/instantiate.cu.in writes this one signature), the
// others in their own .cu file. They launch on `stream` and check the launch
// (cudaGetLastError), throwing fattn::Error.
// T = __half or __nv_bfloat16.
template <class T, int D>
void launch_fused_mma(const Params& p, const FusedLaunch& launch, cudaStream_t stream);
// wgmma (sm_90a; compiled in their own library for that target, cmake/cuda.cmake): T as
// above, D = 64 or 128 (wgmma_head_dim); run only on compute capability 9.0.
template <class T, int D>
void launch_fused_wgmma(const Params& p, const FusedLaunch& launch, cudaStream_t stream);
// The TMA kernel (fused_tma.cuh; same library, target and device as the wgmma kernels).
template <class T, int D>
void launch_fused_tma(const Params& p, const FusedLaunch& launch, cudaStream_t stream);
// The Hopper backward (backward_tma.cuh; the sm_90a library, compute capability 9.0): the row
// pass, the key blocks and the query blocks. T as above, D = 64 or 128.
template <class T, int D>
void launch_hopper_backward(const BackwardParams& bp, cudaStream_t stream);
template <int D>
void launch_fused_tf32(const Params& p, const FusedLaunch& launch, cudaStream_t stream);
template <int D>
void launch_fused_fma(const Params& p, const FusedLaunch& launch, cudaStream_t stream);

// `scores` holds batch·q_heads·q_len·kv_len floats.
template <class T>
void launch_naive(const Params& p, float* scores, cudaStream_t stream);
long long naive_max_blocks(const Params& p);  // the largest of its 3 grids
template <class T>
void launch_reference(const Params& p, cudaStream_t stream);

// Copies a strided (B, H, S, D) view into contiguous [B][H][S][row] memory, row >= D,
// zero-filling columns [D, row).
template <class T>
void launch_repack(const void* src, Strides3 src_stride, int batch, int heads, int seq,
                   int head_dim, void* dst, int row, cudaStream_t stream);

// Throw fattn::Error naming `what`: if status is not cudaSuccess, or if the last
// launch failed (cudaGetLastError).
void check_cuda(cudaError_t status, const char* what);
void check_launch(const char* what);

}  // namespace fattn::cuda
