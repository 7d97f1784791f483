// fattn tests — the CUDA kernels' band (cuda/band.hpp, cuda/visibility.cuh) against the
// model's (model/problem.hpp), on the host: both headers compile without nvcc, so every
// build checks what the GPU kernels will ask. Random lengths, both causal alignments, left
// and right windows of every size (none, zero, inside, past the sequence), and the questions
// the fused kernels ask at their grains: one pair, the key tiles a block loads, the tiles it
// masks, the tiles whose hidden values must stay out of P·V.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "cuda/band.hpp"
#include "cuda/visibility.cuh"
#include "model/problem.hpp"

namespace {

using fattn::Causal;
using fattn::cuda::Params;
using fattn::cuda::visibility;
using fattn::detail::Problem;

Problem problem(int q_len, int kv_len, Causal causal, int window_left, int window_right) {
  Problem pr;
  pr.batch = pr.q_heads = pr.kv_heads = 1;
  pr.q_len = q_len;
  pr.kv_len = kv_len;
  pr.causal = causal;
  pr.window_left = window_left;
  pr.window_right = window_right;
  pr.band_lo = pr.band_lo_of(0);  // as detail::make_problem sets them
  pr.band_hi = pr.band_hi_of(0);
  return pr;
}

Params params_of(const Problem& pr) {
  Params p;
  p.q_len = static_cast<int>(pr.q_len);
  p.kv_len = static_cast<int>(pr.kv_len);
  fattn::cuda::set_band(p, pr);
  return p;
}

std::string describe(const Problem& pr) {
  return "Sq " + std::to_string(pr.q_len) + ", Sk " + std::to_string(pr.kv_len) + ", causal " +
         fattn::to_string(pr.causal) + ", window (" + std::to_string(pr.window_left) + ", " +
         std::to_string(pr.window_right) + ")";
}

bool model_sees(const Problem& pr, int i, int j) {
  return j >= pr.visible_begin(0, i) && j < pr.visible_end(0, i);
}

// Every pair, every block of kRows rows and kKeys-key tile, the kernels' questions.
void check(const Problem& pr, int rows, int keys) {
  const Params p = params_of(pr);
  const auto band = visibility(p);
  const int sq = static_cast<int>(pr.q_len), sk = static_cast<int>(pr.kv_len);
  for (int i = 0; i < sq; ++i)
    for (int j = 0; j < sk; ++j)
      ASSERT_EQ(band.hidden(i, j), !model_sees(pr, i, j))
          << describe(pr) << ": pair (" << i << ", " << j << ")";
  for (int q0 = 0; q0 < sq; q0 += rows) {
    const int last = std::min(q0 + rows, sq) - 1;
    // The key tiles the block loads hold every key its rows see.
    const int first_tile = band.kv_begin(q0) / keys;
    const int end_tile = (band.kv_end(last + 1) + keys - 1) / keys;
    for (int i = q0; i <= last; ++i)
      for (int j = 0; j < sk; ++j)
        if (model_sees(pr, i, j))
          ASSERT_TRUE(j >= first_tile * keys && j < end_tile * keys)
              << describe(pr) << ": block from row " << q0 << " loads key tiles [" << first_tile
              << ", " << end_tile << ") of " << keys << ", row " << i << " sees key " << j;
    for (int kt = first_tile; kt < end_tile; ++kt) {
      const int k0 = kt * keys;
      bool hides = false, band_hides = false;
      for (int i = q0; i < q0 + rows; ++i)  // the block's rows past Sq too: the kernels compute them
        for (int j = k0; j < k0 + keys; ++j) {
          const bool outside_band = (p.has_band_hi && j - i > p.band_hi) ||
                                    (p.has_band_lo && j - i < p.band_lo);
          hides |= j >= sk || outside_band;
          band_hides |= j < sk && outside_band;
        }
      const bool asked_mask = band.tile_hides_keys(k0, keys, q0) || band.below_band(k0, q0 + rows - 1);
      const bool asked_band = band.crosses_limit(k0, keys, q0) || band.below_band(k0, q0 + rows - 1);
      ASSERT_TRUE(!hides || asked_mask)
          << describe(pr) << ": tile " << kt << " hides keys from rows " << q0 << ".. unasked";
      ASSERT_TRUE(!band_hides || asked_band)
          << describe(pr) << ": the band crosses tile " << kt << " for rows " << q0 << ".. unasked";
    }
  }
}

// The backward's questions (backward_tma.cuh): the query rows a key block of `keys` keys
// visits hold every row that sees one of its keys; a tile of `rows` rows × `keys` keys (past
// the sequences too) is masked exactly when one of its pairs is hidden.
void check_backward(const Problem& pr, int rows, int keys) {
  const Params p = params_of(pr);
  const auto band = visibility(p);
  const int sq = static_cast<int>(pr.q_len), sk = static_cast<int>(pr.kv_len);
  for (int k0 = 0; k0 < sk; k0 += keys) {
    const int begin = band.q_begin(k0), end = band.q_end(std::min(k0 + keys, sk));
    for (int j = k0; j < std::min(k0 + keys, sk); ++j)
      for (int i = 0; i < sq; ++i)
        if (model_sees(pr, i, j))
          ASSERT_TRUE(i >= begin && i < end)
              << describe(pr) << ": key block from " << k0 << " visits rows [" << begin << ", "
              << end << "), row " << i << " sees key " << j;
  }
  for (int q0 = 0; q0 < sq; q0 += rows)
    for (int k0 = 0; k0 < sk; k0 += keys) {
      bool any = false;
      for (int i = q0; i < q0 + rows; ++i)
        for (int j = k0; j < k0 + keys; ++j) {
          const bool hidden = i >= sq || j >= sk || !model_sees(pr, i, j);
          ASSERT_EQ(band.pair_hidden(i, j), hidden) << describe(pr) << ": pair (" << i << ", " << j << ")";
          any |= hidden;
        }
      ASSERT_EQ(band.tile_has_hidden_pair(q0, rows, k0, keys), any)
          << describe(pr) << ": rows " << q0 << ".., keys " << k0 << "..";
    }
}

TEST(CudaBand, MatchesTheModelOnRandomProblems) {
  std::mt19937 engine(20261128);
  std::uniform_int_distribution<int> length(1, 300), window(0, 320), pick(0, 3);
  const Causal causals[] = {Causal::none, Causal::top_left, Causal::bottom_right};
  for (int trial = 0; trial < 300; ++trial) {
    const int sq = length(engine), sk = length(engine);
    auto side = [&] {
      switch (pick(engine)) {
        case 0: return -1;
        case 1: return 0;
        default: return window(engine);
      }
    };
    const Problem pr = problem(sq, sk, causals[trial % 3], side(), side());
    check(pr, 128, 128);  // the TMA kernel's block and key tile at D = 128
    check(pr, 128, 64);   // ... at D = 64
    check_backward(pr, 64, 128);  // the Hopper backward's key blocks: 64-row query tiles, 128 keys
    check_backward(pr, 128, 64);  // its query blocks: 128 rows, 64-key tiles
    if (HasFatalFailure()) return;
  }
}

// Every small problem, every window, blocks and tiles of sizes that meet the band's edges at
// every offset.
TEST(CudaBand, MatchesTheModelOnEverySmallProblem) {
  for (int sq = 1; sq <= 9; ++sq)
    for (int sk = 1; sk <= 9; ++sk)
      for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right})
        for (int left = -1; left <= 10; ++left)
          for (int right = -1; right <= 10; ++right) {
            const Problem pr = problem(sq, sk, causal, left, right);
            check(pr, 4, 3);
            check(pr, 2, 5);
            check_backward(pr, 4, 3);
            check_backward(pr, 3, 2);
            if (HasFatalFailure()) return;
          }
}

TEST(CudaBand, EdgesThatHideNothingAreNoEdges) {
  const Params wide = params_of(problem(100, 80, Causal::none, 1000, 1 << 30));
  EXPECT_FALSE(wide.has_band_lo);
  EXPECT_FALSE(wide.has_band_hi);
  const Params causal = params_of(problem(100, 80, Causal::bottom_right, 99, -1));
  EXPECT_FALSE(causal.has_band_lo);  // j - i >= -99 for every pair
  EXPECT_TRUE(causal.has_band_hi);
  EXPECT_EQ(causal.band_hi, -20);
  const Params narrow = params_of(problem(100, 80, Causal::top_left, 98, -1));
  EXPECT_TRUE(narrow.has_band_lo);
  EXPECT_EQ(narrow.band_lo, -98);
}

TEST(CudaBand, AZeroWindowShowsOneDiagonal) {
  // window (0, 0), bottom-right aligned at Sk - Sq = -5: row i sees key i - 5 only, rows 0-4
  // none (their blocks load no key tile).
  const Problem pr = problem(10, 5, Causal::none, 0, 0);
  const Params p = params_of(pr);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(visibility(p).kv_begin(i), std::min(std::max(i - 5, 0), 5)) << i;
    EXPECT_EQ(visibility(p).kv_end(i + 1), std::max(i - 4, 0)) << i;
  }
  check(pr, 4, 2);
}

}  // namespace
