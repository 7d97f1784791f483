// fattn — which keys a query row sees: the one place every CUDA kernel asks.
//
// The fused kernels (mma.sync 16-bit, 3xTF32/TF32, FMA, wgmma), the naive kernels and
// the float64 reference all decide visibility here, as FlashAttention-2's Mask and
// BlockInfo do for its kernels. Today a key j is visible to query row i when
//   j < kv_len                              (the sequence end), and
//   j <= i + causal_offset                  (causal problems: either alignment, as
//                                            an offset; model/problem.hpp's band)
// A sliding window, per-sequence lengths and masks plug in here.
//
// Three questions, asked at three grains:
//   hidden(row, key)                        one score
//   tile_hides_keys(k0, keys, first_row)    a key tile against rows first_row.. : whether
//                                           any score of it must be masked
//   crosses_limit(k0, keys, first_row)      whether the causal limit of some row from
//                                           first_row on falls inside the tile (the tiles
//                                           whose hidden values the kernels must keep out
//                                           of P·V, see fused_mma.cuh)
//   kv_end(q_end)                           one past the last key rows [.., q_end) see:
//                                           how many key tiles a block loads
// A view over the kernel's Params (a reference, not a copy).
//
// Who asks what today: every kernel takes kv_end from here (FusedBlock's tile count,
// the naive and reference kernels' rows); fused_wgmma asks all of it. The kernels that
// have run on an H100 (fused_mma, fused_tf32, fused_fma, naive; warp_softmax.cuh's
// scale_and_mask and pv_visible_keys) still write the boolean tests inline: moving a
// short-circuit test into these functions changes their SASS (cuobjdump, sm_80 and sm_90:
// NVVM turns the inlined branch into selects and ptxas schedules the loop differently),
// so they move here when an H100 can run their tests and benchmark again.
#pragma once

#include "cuda/params.hpp"

namespace fattn::cuda {

struct Visibility {
  const Params& p;

  // One past the last key that query rows [.., q_end) may see, clamped to [0, kv_len].
  __host__ __device__ __forceinline__ int kv_end(int q_end) const {
    if (!p.causal) return p.kv_len;
    const long long last = static_cast<long long>(q_end) - 1 + p.causal_offset;
    if (last < 0) return 0;
    return last + 1 < p.kv_len ? static_cast<int>(last + 1) : p.kv_len;
  }

  // Whether query row `row` does not see key `key`.
  __device__ __forceinline__ bool hidden(int row, int key) const {
    return key >= p.kv_len || (p.causal && key > row + p.causal_offset);
  }

  // Whether keys [k0, k0 + keys) pass the causal limit of a row from first_row on.
  __device__ __forceinline__ bool crosses_limit(int k0, int keys, int first_row) const {
    return p.causal && k0 + keys - 1 > first_row + p.causal_offset;
  }

  // Whether some key of [k0, k0 + keys) is hidden from a row from first_row on.
  __device__ __forceinline__ bool tile_hides_keys(int k0, int keys, int first_row) const {
    return k0 + keys > p.kv_len || crosses_limit(k0, keys, first_row);
  }
};

__host__ __device__ __forceinline__ Visibility visibility(const Params& p) { return Visibility{p}; }

}  // namespace fattn::cuda
