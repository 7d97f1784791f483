// fattn — the CUDA backend's plan for one call: which kernel at which compiled head
// dim, which inputs are repacked, how much working memory, and the kernels' Params.
// Everything here runs before any launch and fails with an Error naming the argument.
#pragma once

#include <cstdint>

#include "model/problem.hpp"
#include "cuda/backend.hpp"
#include "cuda/launchers.hpp"
#include "cuda/work_memory.hpp"

namespace fattn::cuda {

struct Plan {
  Kernel kernel = Kernel::automatic;
  int kernel_dim = 0;             // fused: the compiled head dim (>= the problem's)
  int tile_rows = 0;              // warp-slice kernels: rows per block (0: chosen at launch)
  int stages = 0;                 // fused_tma: K/V ring stages (0: tile_config.hpp's tma_tiles)
  int blocks = 0;                 // the persistent TMA kernels: grid cap (0: one block per SM)
  bool repack[3] = {};            // q, k, v copied to contiguous padded memory first
  int row = 0;                    // elements per repacked row
  std::int64_t repack_bytes[3] = {};
  std::int64_t scores_bytes = 0;  // naive: the Sq×Sk buffers

  std::int64_t total_bytes() const {
    std::int64_t total = round_up(scores_bytes, kWorkAlignment);
    for (std::int64_t b : repack_bytes) total += round_up(b, kWorkAlignment);
    return total;
  }
};

// The shared validation (detail::make_problem) and what only the CUDA path needs.
detail::Problem validate(const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView* out, const TensorView* lse, const Options& options);

Plan make_plan(const detail::Problem& p, const TensorView& q, const TensorView& k,
               const TensorView& v, Kernel kernel);

// A tile height asked for by forward_with (0: chosen per problem); an Error when the
// plan's kernel has no such tile at this head dim.
void force_tile_rows(Plan& plan, int tile_rows, std::int64_t head_dim);

// fused_tma's ring depth asked for by forward_with (0: tma_tiles'); an Error for another
// kernel, a depth it is not built with at this head dim, or a problem with variants (their
// instantiation has the table's depth only).
void force_stages(Plan& plan, int stages, const detail::Problem& p);

// The persistent TMA kernels' grid asked for by forward_with (0: one block per SM); an Error
// for another kernel or a negative count.
void force_blocks(Plan& plan, int blocks);

// Query rows per block of a warp-slice kernel at compiled head dim `dim`: the forced
// height, else 128 when that grid still fills the device, else 64.
int tile_rows_for(const Plan& plan, const Params& p, int dim, int device);

Params make_params(const detail::Problem& pr, const TensorView& q, const TensorView& k,
                   const TensorView& v, const TensorView& out, const TensorView* lse);

Strides3 strides3(const TensorView& t);

// An Error unless t's rows of head_dim elements are contiguous (stride(3) == 1), naming it.
void expect_contiguous_rows(const char* name, const TensorView& t);
// Whether the kernels can read t in 16-byte chunks (cp.async, the copy engine) as it is:
// 16-byte aligned data and rows, and strides of whole chunks.
bool cp_async_ready(const TensorView& t);
// Whether t takes 2-element vector stores (Params::out_pairs).
bool pair_stores_ok(const TensorView& t);

// Bytes of t copied into contiguous rows of `row` elements (an input the kernels cannot read
// as it is), and the copy itself: launch_repack into dst, returning the copy's strides.
std::int64_t repacked_bytes(const TensorView& t, int row);
template <class T>
Strides3 repack(const TensorView& t, void* dst, int row, cudaStream_t stream) {
  launch_repack<T>(t.data, strides3(t), static_cast<int>(t.size(0)), static_cast<int>(t.size(1)),
                   static_cast<int>(t.size(2)), static_cast<int>(t.size(3)), dst, row, stream);
  const std::int64_t seq = row, head = seq * t.size(2), batch = head * t.size(1);
  return {batch, head, seq};
}

}  // namespace fattn::cuda
