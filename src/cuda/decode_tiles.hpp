// fattn — the CUDA decode kernel's tile shape (decode.cuh) and the host's split choice.
// Plain C++: the host tests check the choice (tests/test_cuda_decode_plan.cpp).
//
// A block takes the 16 query rows (queries × the query heads of one kv head: GQA packed into
// the rows, FlashAttention 3's and FlashInfer's decode layout) of one sequence against one
// chunk of its keys; its 4 warps take the chunk's key tiles in turn, each through its own
// ring of cp.async stages, and merge their rows at the end. Decode reads each K/V byte once
// and does 2·rows multiply-adds per byte pair: memory-bound, so the shape is chosen for
// bytes in flight, not for tensor-core rate:
//   keys per warp tile: 32 (one key per lane computes its row's address, paged or not) at
//   D <= 128; 16 at D = 256, so that a warp's stage (K and V) stays 16.5 KB.
//   stages: as many as the device's shared memory per block takes (3 on an H100/H200 at
//   D = 128: 8 tiles, 128 KB in flight per SM; 2 on an A100), or the benchmark's choice.
// Little's law on an H200 (4.8 TB/s, ~1 µs to DRAM and back) wants ~36 KB in flight per SM:
// even two stages give more; the GPU command sweeps the depth (fattn_gpu_bench --suite decode).
#pragma once

#include <cstdint>
#include <utility>

namespace fattn::cuda {

// The head dims the decode kernels are compiled for: the common decode head dims; any
// other multiple of 8 runs on the next one (its padding columns are never read, so it
// costs no bandwidth).
using DecodeHeadDims = std::integer_sequence<int, 64, 128, 256>;

struct DecodeTiles {
  static constexpr int kRows = 16;   // query rows per block: one m16 MMA slice
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMaxStages = 4;
  static constexpr int kMaxSplits = 128;  // the combine kernel's limit (as FlashAttention's)

  int dim;       // the compiled head dim
  int keys;      // keys per warp tile
  int pitch;     // shared row pitch in elements: +16 bytes keeps ldmatrix conflict-free

  static constexpr DecodeTiles at(int dim) { return {dim, dim <= 128 ? 32 : 16, dim + 8}; }

  // Shared bytes of a block with `stages` ring stages per warp (16-bit elements): the query
  // rows, every warp's K and V stages, every warp's row addresses (K and V, 8 bytes each).
  constexpr std::int64_t smem_bytes(int stages) const {
    return (static_cast<std::int64_t>(kRows) + 2LL * kWarps * stages * keys) * pitch * 2 +
           2LL * kWarps * keys * 8;
  }
  // What the warps' merge at the end needs (it reuses the stages): per warp its rows' max
  // and sum and its 16 × dim partial output, float32; and each row's weights.
  constexpr std::int64_t merge_bytes() const {
    return (2LL * kWarps * kRows + static_cast<std::int64_t>(kWarps) * kRows * dim +
            (kWarps + 1LL) * kRows) * 4;
  }
};

// Key splits of a decode call: `blocks` blocks (sequences × kv heads × row tiles) without
// splitting, `slots` blocks the device runs at once (multiprocessors × blocks per
// multiprocessor), `max_keys` keys per sequence at most, `min_keys` the fewest keys worth a
// split (every warp at least two tiles). No split when the blocks already fill the device;
// else the fewest splits whose waves are at least 85 % as full as the best count's
// (FlashAttention's num_splits_heuristic, hopper/heuristics.h, in spirit: wave efficiency
// over the split counts the keys allow), at most kMaxSplits.
inline int choose_decode_splits(std::int64_t blocks, std::int64_t slots, std::int64_t max_keys,
                                std::int64_t min_keys) {
  if (blocks <= 0 || slots <= 0 || blocks * 10 >= slots * 8) return 1;
  std::int64_t most = min_keys > 0 ? max_keys / min_keys : 1;
  if (most > DecodeTiles::kMaxSplits) most = DecodeTiles::kMaxSplits;
  if (most <= 1) return 1;
  auto efficiency = [&](std::int64_t s) {
    const std::int64_t n = blocks * s, waves = (n + slots - 1) / slots;
    return static_cast<double>(n) / static_cast<double>(waves * slots);
  };
  double best = 0.0;
  for (std::int64_t s = 1; s <= most; ++s)
    if (efficiency(s) > best) best = efficiency(s);
  for (std::int64_t s = 1; s <= most; ++s)
    if (efficiency(s) >= 0.85 * best) return static_cast<int>(s);
  return 1;
}

}  // namespace fattn::cuda
