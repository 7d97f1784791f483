// fattn tests — the CUDA decode kernel's host-checkable parts (cuda/decode_params.hpp,
// cuda/decode_tiles.hpp, the band it reads from cuda/visibility.cuh), without nvcc: each
// sequence's band against the model's
// (model/problem.hpp, a KV cache of per-sequence lengths), the split of a sequence's keys
// into whole tiles, and the split count's rules.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "cuda/decode_params.hpp"
#include "cuda/decode_tiles.hpp"
#include "cuda/visibility.cuh"
#include "model/problem.hpp"

namespace {

using fattn::cuda::choose_decode_splits;
using fattn::cuda::DecodeParams;
using fattn::cuda::DecodeTiles;
using fattn::cuda::SequenceBand;
using fattn::cuda::SplitRange;
using fattn::cuda::VisibilityOf;

// The model's problem for one sequence of `length` keys in a cache: causal bottom-right and
// the window aligned to the sequence's own length.
fattn::detail::Problem model(int q_len, int length, bool causal, int left, int right) {
  fattn::detail::Problem pr;
  pr.batch = pr.q_heads = pr.kv_heads = 1;
  pr.q_len = q_len;
  pr.kv_len = length + 7;  // the cache's capacity: more than the sequence holds
  pr.causal = causal ? fattn::Causal::bottom_right : fattn::Causal::none;
  pr.window_left = left;
  pr.window_right = right;
  return pr;
}

TEST(CudaDecodePlan, SequenceBandIsTheModelsBandPerSequence) {
  std::mt19937 rng(20261128);
  const int windows[] = {-1, 0, 1, 3, 9, 40};
  int cases = 0;
  for (int q_len : {1, 2, 5})
    for (int length : {0, 1, 4, 17, 33})
      for (bool causal : {false, true})
        for (int left : windows)
          for (int right : windows) {
            const fattn::detail::Problem pr = model(q_len, length, causal, left, right);
            std::int32_t lengths[1] = {length};
            fattn::detail::Problem with_cache = pr;
            with_cache.paging.seqlens = lengths;
            const SequenceBand sequence = SequenceBand::bottom_right(q_len, length, causal, left, right);
            const VisibilityOf<SequenceBand> band{sequence};
            const std::string what = "Sq " + std::to_string(q_len) + ", L " +
                                     std::to_string(length) + ", causal " +
                                     std::to_string(causal) + ", window (" +
                                     std::to_string(left) + ", " + std::to_string(right) + ")";
            for (int i = 0; i < q_len; ++i) {
              const std::int64_t begin = with_cache.visible_begin(0, i);
              const std::int64_t end = with_cache.visible_end(0, i);
              for (int j = 0; j < length + 3; ++j)
                ASSERT_EQ(band.hidden(i, j), !(j >= begin && j < end)) << what << ", i " << i << ", j " << j;
              // The keys a block of queries [i, i_last] loads: every visible key inside.
              for (int i_last = i; i_last < q_len; ++i_last) {
                const int first = band.kv_begin(i), last = band.kv_end(i_last + 1);
                // ... and the tile test the kernel masks by: a tile without it hides nothing.
                for (int k0 = 0; k0 < length; k0 += 4) {
                  bool hides = false;
                  for (int r = i; r <= i_last; ++r)
                    for (int j = k0; j < k0 + 4; ++j) hides |= band.hidden(r, j);
                  if (hides)
                    ASSERT_TRUE(band.tile_hides_keys(k0, 4, i) || band.below_band(k0, i_last))
                        << what << ", rows [" << i << ", " << i_last << "], keys from " << k0;
                }
                for (int r = i; r <= i_last; ++r)
                  for (int j = 0; j < length; ++j)
                    if (!band.hidden(r, j)) {
                      ASSERT_GE(j, first) << what;
                      ASSERT_LT(j, last) << what;
                    }
              }
            }
            ++cases;
          }
  EXPECT_GT(cases, 1000);
}

TEST(CudaDecodePlan, SplitsCoverTheKeysOnceInWholeTiles) {
  for (int tile : {16, 32})
    for (int begin : {0, 16, 64})
      for (int keys : {0, 1, 31, 32, 33, 100, 1000, 4099})
        for (int splits : {1, 2, 3, 7, 16, 128}) {
          const int end = begin + keys;
          int next = begin;
          for (int s = 0; s < splits; ++s) {
            const SplitRange r = SplitRange::of(begin, end, s, splits, tile);
            ASSERT_LE(r.begin, r.end);
            if (r.begin == r.end) continue;
            ASSERT_EQ(r.begin, next) << "split " << s << " of " << splits << ", keys " << keys;
            ASSERT_EQ((r.begin - begin) % tile, 0);
            next = r.end;
          }
          EXPECT_EQ(next, end) << splits << " splits of " << keys << " keys";
        }
}

TEST(CudaDecodePlan, SplitCountFillsTheDeviceOnlyWhereItIsEmpty) {
  const int slots = 132;
  // Enough blocks already: no split.
  EXPECT_EQ(choose_decode_splits(8 * 32 * 1, slots, 1 << 17, 256), 1);
  EXPECT_EQ(choose_decode_splits(slots, slots, 1 << 17, 256), 1);
  // One sequence of 8 kv heads at 8k keys: the waves of 8·s blocks at least 85 % of the best.
  const int s = choose_decode_splits(8, slots, 8192, 256);
  EXPECT_GE(s, 14);
  EXPECT_LE(s, 32);
  EXPECT_GE(8.0 * s / slots, 0.85 * 0.97);
  // Short caches: no split smaller than min_keys.
  EXPECT_EQ(choose_decode_splits(8, slots, 256, 256), 1);
  EXPECT_LE(choose_decode_splits(8, slots, 1024, 256), 4);
  // Never more than the combine step takes.
  EXPECT_LE(choose_decode_splits(1, slots, 1 << 24, 16), DecodeTiles::kMaxSplits);
  EXPECT_GE(choose_decode_splits(1, slots, 1 << 24, 16), 1);
}

TEST(CudaDecodePlan, SharedMemoryOfTheRingFitsHopperAtTheDefaultDepth) {
  // 227 KB per block on an H100/H200: three stages at D <= 128, and at D = 256 (16-key tiles).
  const std::int64_t hopper = 227 * 1024;
  for (int d : {64, 128, 256}) {
    const DecodeTiles tiles = DecodeTiles::at(d);
    EXPECT_LE(tiles.smem_bytes(3), hopper) << "D " << d;
    // The warps' merge reuses the ring (after the query rows).
    EXPECT_GE(tiles.smem_bytes(2) - DecodeTiles::kRows * tiles.pitch * 2, tiles.merge_bytes())
        << "D " << d;
  }
  // An A100 (163 KB): two stages.
  EXPECT_LE(DecodeTiles::at(128).smem_bytes(2), 163 * 1024);
}

}  // namespace
