// fattn — the variants on the decode kernel's score tiles (cpu/decode/decode.hpp).
//
// Decode tiles are rows × keys, st [R][Bk] with the keys along the lanes, and a tile's rows
// mix the query heads of one kv head (row r = i·G + g). Each row is its own (head, query):
// its attn_mask row is read once (ScoreModOps::mask_cover on a one-row tile), then softcap,
// ALiBi and the mask change the row in place, and the window's left edge hides the keys
// before the row's first visible one (the right edge and the causal limit are the
// kernel's `visible` counts). The sinks join each row's softmax state before its output is
// written (add_sink_to_rows), after the split partials are merged.
#pragma once

#include <cmath>
#include <cstdint>

#include "cpu/decode/ops.hpp"
#include "cpu/common/score_mods.hpp"

namespace fattn::cpu {

template <class S>
struct DecodeModOps {
  using Ops = DecodeOps<S>;
  using Mods = ScoreModOps<S>;
  using vec = typename S::vec;
  static constexpr int L = S::lanes, Bk = Ops::Bk;

  // Changes the scores of rows [r0, r0 + rows) of kv head hk's group against keys
  // [j0, j0 + nj); returns false when every row's mask hides every key (the caller skips
  // the tile for this head).
  static bool apply(const detail::Problem& p, std::int64_t b, std::int64_t hk, std::int64_t r0,
                    std::int64_t rows, std::int64_t j0, std::int64_t nj, float* st) {
    const detail::ScoreMods& m = p.mods;
    const float cap2 = static_cast<float>(m.softcap) * Ops::kLog2e;
    bool any_visible = false;
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto [h, i] = Ops::group_row(p, hk, r0 + r);
      float* s = st + r * Bk;
      const typename Mods::Tile pair_row{b, h, i, 1, j0, nj};
      const MaskCover cover = Mods::mask_cover(p, pair_row);
      if (cover == MaskCover::hidden) {
        for (std::int64_t j = 0; j < nj; ++j) s[j] = Ops::kNegInf;
        continue;
      }
      any_visible = true;
      if (m.softcap != 0.0)
        for (int e = 0; e < Bk; e += L) S::store(s + e, Mods::softcap(S::load(s + e), cap2, nullptr));
      if (m.alibi) add_alibi(p, b, h, i, j0, s);
      if (cover == MaskCover::mixed)
        Mods::with_mask_type(m, [&](auto type) {
          using E = std::remove_cv_t<std::remove_pointer_t<decltype(type)>>;
          const E* mask = Mods::template mask_row<E>(m, pair_row, 0);
          const float factor = Mods::mask_factor(m, h);
          for (std::int64_t j = 0; j < nj; ++j)
            s[j] = Mods::masked(s[j], mask[j * m.mask_key], factor);
        });
      const std::int64_t hidden_before = p.visible_begin(b, i) - j0;  // the window's left edge
      for (std::int64_t j = 0; j < hidden_before && j < nj; ++j) s[j] = Ops::kNegInf;
    }
    return any_visible;
  }

  // s[j] −= slope·log2(e)·|i + Sk − Sq − j0 − j| over the tile's Bk lanes.
  static void add_alibi(const detail::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i,
                        std::int64_t j0, float* s) {
    const vec slope2 = S::splat(-static_cast<float>(p.mods.slope(b, h)) * Ops::kLog2e);
    const vec base = S::splat(static_cast<float>(i + p.keys_of(b) - p.q_len - j0));
    for (int e = 0; e < Bk; e += L) {
      const vec distance = base - (S::iota() + S::splat(static_cast<float>(e)));
      S::store(s + e, S::fma(distance < 0.0f ? -distance : distance, slope2, S::load(s + e)));
    }
  }

  // Each row's sink joins its (m, l), and its accumulated output os [rows][Dp] is rescaled.
  static void add_sink_to_rows(const detail::Problem& p, std::int64_t hk, std::int64_t r0,
                               std::int64_t rows, std::int64_t Dp, float* os, float* m,
                               float* l) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t head = Ops::group_row(p, hk, r0 + r).head;
      const float alpha = Mods::join_sink(Mods::sink_log2(p, head), &m[r], &l[r]);
      for (std::int64_t d = 0; d < Dp; ++d) os[r * Dp + d] *= alpha;
    }
  }
};

}  // namespace fattn::cpu
