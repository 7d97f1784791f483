// fattn — the CUDA backend's entry points, as seen from plain C++ (no CUDA headers).
//
// src/api/attention.cpp calls attention_forward / extra_bytes here when q.device is cuda
// and the library was built with FATTN_WITH_CUDA. Tests and the GPU benchmark may
// also call forward_with() to reach a kernel that no Impl value names (the exact
// FMA fp32 kernel).
//
// Which kernel each Impl runs on the GPU:
//   Impl::reference  float64 kernel, one warp per query row (for same-device tests)
//   Impl::naive      3 launches: scores = Q·Kᵀ·scale·log2(e) to a B·Hq·Sq·Sk float32
//                    buffer, row softmax in place (+ logsumexp), O = P·V
//   Impl::fused      float16/bfloat16: FlashAttention-2 on mma.sync (Kernel::fused_mma,
//                    which picks 64- or 128-row query tiles per problem). The Hopper
//                    wgmma kernels (Kernel::fused_wgmma and fused_wgmma_pipelined, compute
//                    capability 9.0, head dims up to 128; 0.92-0.95x fused_mma on an H100)
//                    are reached through forward_with only; Kernel::fused_tma (the same on
//                    TMA loads and warp specialization) through forward_with and
//                    Impl::automatic (docs/cuda.md).
//   Impl::automatic  float16/bfloat16: Kernel::fused_tma on a device of compute capability
//                    9.0 with a build that has it, at the head dims it was measured at
//                    (automatic_kernel), else as Impl::fused. float32: 3xTF32 on mma.sync
//                    m16n8k8 (Kernel::fused_tf32x3), which keeps float32 accuracy, or the
//                    TF32 mode (Kernel::fused_tf32) when Options::allow_tf32 is set;
//                    Kernel::fused_fma (plain FMA, exact float32 arithmetic) is reachable
//                    through forward_with only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fattn/attention.hpp"

namespace fattn::cuda {

enum class Kernel : std::uint8_t {
  automatic,     // what Options::impl selects (see above)
  reference,     // float64, any dtype
  naive,         // 3 kernels, any dtype
  fused_mma,        // float16 / bfloat16 only
  fused_wgmma,      // float16 / bfloat16, head dim <= 128, compute capability 9.0 (sm_90a)
  fused_wgmma_pipelined,  // the same with FlashAttention-3's overlapped schedule
  fused_tma,        // the pipelined schedule fed by TMA loads from a producer warpgroup (sm_90a)
  fused_tf32x3,     // float32 only
  fused_tf32,       // float32 only, TF32 mode: Q·Kᵀ plain TF32, P·V with V split (fused_tf32.cuh)
  fused_fma,        // float32 only
  fused_tma_persistent,  // fused_tma's schedule, one block per SM walking the tiles (sm_90a, plain forward)
  fused_tma_pingpong,    // the same, its two consumer warpgroups taking turns at the tensor cores
};

const char* to_string(Kernel kernel);

// The kernel attention_forward runs for this impl and dtype (allow_tf32: Options's) on
// any device.
Kernel kernel_for(Impl impl, DType dtype, bool allow_tf32 = false);

// What attention_forward runs on the current device: kernel_for, except that Impl::automatic
// with 16-bit inputs runs Kernel::fused_tma where runs_on_current_device says it can and
// head_dim is one it is built and measured for (64, 128). On an H200 (results/h200/gpu/
// 2026-11-28/tma_bench.json, B·H·S² fixed): fused_tma 464-510 TFLOP/s at D = 128, S 8192-16384
// against fused_mma's 246-256 (1.9-2.0x), 296-308 at D = 64 against 222-224 (1.35x).
Kernel automatic_kernel(const Options& options, DType dtype, std::int64_t head_dim);
// The head dims automatic_kernel sends to fused_tma (where this build has them).
bool tma_measured_head_dim(std::int64_t head_dim);

// The largest head dim with 128-row query tiles (two 16-row slices per warp).
int max_tall_head_dim();

// Same contract as fattn::attention_forward for Device::cuda views: validation
// (fattn::Error), then the launches are enqueued on options.cuda_stream (nullptr:
// the legacy default stream) and the call returns without synchronising.
void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const TensorView* lse, const Options& options);
// tile_rows: query rows per block of the fused tensor-core kernels (fused_mma,
// fused_tf32x3, fused_tf32): 0 chooses per problem (plan.cpp, tall_tiles_pay);
// 64 or 128 force one (128: head dims up to max_tall_head_dim()), for tests and
// the benchmark that sets the choice. stages: fused_tma's K/V ring depth, 0 its tile
// table's (tile_config.hpp, tma_tiles), else tma_alternative_stages (the plain forward),
// for the benchmark that measures the choice. persistent_blocks: the persistent TMA kernels'
// grid, 0 one block per SM (at most one per query tile), n > 0 at most n blocks (tests make
// one block walk many tiles).
void forward_with(const TensorView& q, const TensorView& k, const TensorView& v,
                  const TensorView& out, const TensorView* lse, const Options& options,
                  Kernel kernel, int tile_rows = 0, int stages = 0, int persistent_blocks = 0);

// Device bytes the call allocates (stream-ordered, freed before it returns to the
// stream): the naive Sq×Sk buffer, and for the fused kernels the repacked copies of
// inputs whose alignment or head dim the kernels cannot read directly.
std::int64_t extra_bytes(const TensorView& q, const TensorView& k, const TensorView& v,
                         const Options& options);
std::int64_t extra_bytes_with(const TensorView& q, const TensorView& k, const TensorView& v,
                              const Options& options, Kernel kernel);

// Kernel launches of one naive call (scores, softmax, P·V): 3.
int naive_launch_count();

// Head dims the fused kernels are compiled for (ascending). Other dims in [16, 256]
// run on the next larger one with zero padding; above the largest is an Error.
std::vector<int> supported_head_dims();
std::string supported_head_dims_text();  // e.g. "32, 64, 96, 128, 256"

// Head dims the Hopper kernels are compiled for, where they are in FATTN_CUDA_HEAD_DIMS
// (empty when they are not built): fused_wgmma and fused_wgmma_pipelined 64 and 128, fused_tma
// also 256 (hopper_head_dims: a kernel's own). Smaller dims run on the next one.
std::vector<int> wgmma_head_dims();
std::vector<int> tma_head_dims();
std::vector<int> hopper_head_dims(Kernel kernel);

// Same contract as fattn::attention_backward for Device::cuda views: the Hopper backward
// (backward_tma.cuh: float16/bfloat16, head dims up to 128, causal both alignments,
// windows, softcap, ALiBi, sinks with dsinks, GQA, dlse; compute capability 9.0), enqueued on
// options.cuda_stream without synchronising; deterministic (no atomics). What it does not
// take is an Error saying so (backward_refusal).
void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const TensorView& dout, const TensorView& lse,
                        const TensorView* dlse, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, const Options& options, const TensorView* dsinks);
// Why the Hopper backward does not take a call of these views and options ("" where it does):
// dtype, head dim, attn_mask, grid limits, the device's compute capability, the build.
std::string backward_refusal(const TensorView& q, const TensorView& k, const Options& options);
// The head dims the Hopper backward is compiled for (empty when it is not built).
std::vector<int> backward_head_dims();

// Whether `kernel` can run on the current CUDA device: compute capability 8.0 or newer,
// and for the Hopper kernels (fused_wgmma*, fused_tma) exactly 9.0 and a build that has them. False without a device.
bool runs_on_current_device(Kernel kernel);

}  // namespace fattn::cuda
