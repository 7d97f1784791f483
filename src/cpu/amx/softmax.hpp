// fattn — the AMX kernel's softmax step for one query tile and one key tile, as a task
// that runs in slices between the tile products of another query tile.
//
// The tile unit and the vector units work in parallel only if the instruction stream
// interleaves them: a run of tile products fills the reorder buffer while they wait
// for the tile unit. So the fused kernel hands this task to the products of the other
// query tile of its work item (AmxOps::mma_split calls step() after every four
// products), and the softmax of one tile costs little beside the products of the other.
//
// Work, in order (each step() does one slice and returns whether work is left):
//   max      mask the diagonal tile's hidden scores (−inf), running max of 8 key rows
//   exp      two key rows: p = 2^(s − m), row sums, p split into the VNNI P parts
//   finish   alpha = 2^(m_old − m) (kept here for the rescale), l = alpha·l + Σp, m
// Each step is OnlineSoftmax's (reference, weight, rescale), as the FMA kernels'.
//   rescale  8 rows of the accumulator ot ← alpha·ot, only if some alpha is not 1
// The running max is lazy: a query keeps its reference max while the new scores exceed
// it by at most kMaxGrowth (log2 units), so its alpha is exactly 1 and, when that holds
// for the whole tile, the rescale is skipped (with 64 queries some query's max moves in
// nearly every key tile of random data). Probabilities then reach 2^kMaxGrowth, exact in
// float32 and in the three-part split; out = ot/l and the lse are unchanged, since l and
// ot share the reference.
#pragma once

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BW__)
#include <cstdint>

#include "cpu/amx/ops.hpp"
#include "cpu/common/online_softmax.hpp"

namespace fattn::cpu {

template <class S>
class SoftmaxTask {
 public:
  using Ops = AmxOps<S>;
  using Fma = typename Ops::Fma;
  using Softmax = OnlineSoftmax<S>;  // the steps below are its update_lanes, in slices
  using vec = typename S::vec;
  using ivec = typename S::ivec;
  static constexpr int NV = Fma::NV, L = Fma::L, Br = Fma::Br;
  static constexpr float kMaxGrowth = 8.0f;
  // Rows per slice of the max and rescale passes (two vector ops per vector there, against
  // ~25 per vector in the exp pass, one row pair per slice): slices of ~100 operations.
  static constexpr int kRowsPerSlice = 8;

  struct Tile {
    float* st;       // [Bc][Br] scores, keys × queries
    float *m, *l, *ot;
    bf16* p_parts;   // out: P split (AmxOps::split_pairs layout)
    std::int64_t nj, dim_pad;
    const typename Fma::Band* diag;  // null: no key of the tile is hidden
  };

  void start(const Tile& t) {
    t_ = t;
    phase_ = Phase::max;
    row_ = 0;
    for (int v = 0; v < NV; ++v) m_new_[v] = m_old_[v] = S::load(t.m + v * L);
  }

  [[gnu::noinline]] bool step() {
    switch (phase_) {
      case Phase::max: return max_rows();
      case Phase::exp: return exp_rows();
      case Phase::finish: return finish();
      case Phase::rescale: return rescale_rows();
      case Phase::done: return false;
    }
    return false;
  }

 private:
  enum class Phase { max, exp, finish, rescale, done };

  bool max_rows() {
    const std::int64_t end = std::min<std::int64_t>(row_ + kRowsPerSlice, t_.nj);
    for (std::int64_t j = row_; j < end; ++j) {
      float* row = t_.st + j * Br;
      if (t_.diag) hide(row, t_.diag->first_seeing(j));
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) m_new_[v] = S::max(S::load(row + v * L), m_new_[v]);
    }
    row_ = end;
    if (row_ < t_.nj) return true;
    for (int v = 0; v < NV; ++v) {
      // From −inf (no key seen yet) the difference is +inf: the lane takes its new max.
      m_new_[v] = m_new_[v] - m_old_[v] > kMaxGrowth ? m_new_[v] : m_old_[v];
      m_ref_[v] = Softmax::reference(m_new_[v]);
      sum_[v] = S::zero();
    }
    phase_ = Phase::exp;
    row_ = 0;
    return true;
  }

  // Queries [0, first) of a row do not see its key (TileOps::mask_tile, one row).
  static void hide(float* row, std::int64_t first) {
    if (first <= 0) return;
    const auto seen_from = static_cast<std::int32_t>(first < Br ? first : Br);
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const ivec lane = __builtin_convertvector(S::iota(), ivec) + v * L;
      S::store(row + v * L, lane < seen_from ? S::splat(Fma::kNegInf) : S::load(row + v * L));
    }
  }

  bool exp_rows() {
    const std::int64_t j = row_;  // rows j, j+1; rows past nj give p = 0
    bf16* out = t_.p_parts + j / 2 * Ops::kPairRows;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const vec a = j < t_.nj ? Softmax::weight(S::load(t_.st + j * Br + v * L), m_ref_[v]) : S::zero();
      const vec b =
          j + 1 < t_.nj ? Softmax::weight(S::load(t_.st + (j + 1) * Br + v * L), m_ref_[v]) : S::zero();
      sum_[v] += a + b;
      Ops::store_pair_parts(out + 2 * v * L, a, b);
    }
    row_ += 2;
    if (row_ >= Ops::round_up(t_.nj)) phase_ = Phase::finish;
    return true;
  }

  bool finish() {
    __mmask16 moved = 0;
    for (int v = 0; v < NV; ++v) {
      vec l = S::load(t_.l + v * L);
      const vec a = Softmax::rescale(m_old_[v], m_ref_[v], sum_[v], &l);
      alpha_[v] = a;
      moved |= _mm512_cmp_ps_mask(a, _mm512_set1_ps(1.0f), _CMP_NEQ_UQ);
      S::store(t_.l + v * L, l);
      S::store(t_.m + v * L, m_new_[v]);
    }
    phase_ = moved ? Phase::rescale : Phase::done;
    row_ = 0;
    return phase_ != Phase::done;
  }

  bool rescale_rows() {
    const std::int64_t end = std::min<std::int64_t>(row_ + kRowsPerSlice, t_.dim_pad);
    for (std::int64_t d = row_; d < end; ++d)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        float* o = t_.ot + d * Br + v * L;
        S::store(o, S::load(o) * alpha_[v]);
      }
    row_ = end;
    if (row_ < t_.dim_pad) return true;
    phase_ = Phase::done;
    return false;
  }

  Tile t_{};
  Phase phase_ = Phase::done;
  std::int64_t row_ = 0;
  vec m_old_[NV], m_new_[NV], m_ref_[NV], sum_[NV], alpha_[NV];
};

}  // namespace fattn::cpu
#endif
