// fattn-decode-tile's timed loops for one ISA (FATTN_BENCH_VECTOR_BYTES, the unit's -m
// flags): one worker's key tile as DecodeOps runs it, K and V rows in place, the rows of
// one kv head of a (B, S, Hkv, D) cache with Hkv = 1, cycled over `tiles` tiles.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "cpu/decode/ops.hpp"
#include "decode_tile.hpp"

namespace fattn_bench {
namespace {

using S = fattn::cpu::Simd<FATTN_BENCH_VECTOR_BYTES>;
using Ops = fattn::cpu::DecodeOps<S>;
constexpr int kBk = Ops::Bk;

template <class E>
DecodeTileTimes run_tiles(const DecodeTileRequest& request) {
  const std::int64_t D = Ops::padded_dim(request.head_dim), rows = request.rows;
  const std::int64_t tiles = std::max(request.tiles, 1);
  const std::int64_t nj = request.keys > 0 ? std::min(request.keys, kBk) : kBk;
  std::mt19937 rng(24301);
  std::normal_distribution<float> normal;
  std::vector<E> k(static_cast<std::size_t>(tiles * kBk * D)), v(k.size());
  for (auto& x : k) x = fattn::cpu::from_float<E>(normal(rng));
  for (auto& x : v) x = fattn::cpu::from_float<E>(normal(rng));
  const std::size_t lanes = static_cast<std::size_t>(S::lanes);
  auto floats = [&](std::int64_t n) { return std::vector<float>(static_cast<std::size_t>(n) + lanes); };
  std::vector<float> qs = floats(rows * D), st = floats(rows * kBk), os = floats(rows * D),
                     kt = floats(D * kBk), m = floats(rows), l = floats(rows), alpha = floats(rows);
  for (std::int64_t i = 0; i < rows * D; ++i) qs[static_cast<std::size_t>(i)] = 0.1f * normal(rng);
  Ops::start_rows(rows, D, m.data(), l.data(), os.data());
  std::vector<std::int32_t> visible(static_cast<std::size_t>(rows), static_cast<std::int32_t>(nj));
  auto rows_of = [&](const std::vector<E>& x, std::int64_t t) {
    typename Ops::template Rows<E> r{{}, D, 1};
    for (int g = 0; g < Ops::kGroups; ++g)
      r.group[g] = x.data() + (t * kBk + g * Ops::kKeyGroup) * D;
    return r;
  };
  auto next_of = [&](std::int64_t t) {  // the next tile's K and V rows, as the worker asks
    const std::int64_t u = (t + 1) % tiles;
    typename Ops::Prefetch p(Ops::Prefetch::span_of(rows_of(k, u), D, 1, nj),
                             Ops::Prefetch::span_of(rows_of(v, u), D, 1, nj),
                             D * static_cast<std::int64_t>(sizeof(E)), true);
    p.share(0, 1);
    return p;
  };
  typename Ops::Prefetch none{};
  const std::int64_t reps = std::max<std::int64_t>(tiles, 20000 / tiles * tiles);
  auto best_ns_a_key = [&](auto&& tile) {
    double best = std::numeric_limits<double>::infinity();
    for (int round = 0; round < request.rounds; ++round) {
      const auto start = std::chrono::steady_clock::now();
      for (std::int64_t i = 0; i < reps; ++i) tile(i % tiles);
      const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
      best = std::min(best, took.count() / static_cast<double>(reps * nj));
    }
    return best;
  };
  auto scores = [&](std::int64_t t, typename Ops::Prefetch& next) {
    Ops::tile_scores(qs.data(), rows, D, rows_of(k, t), nj, kt.data(), st.data(), next);
  };
  auto softmax = [&] { Ops::softmax_update(st.data(), rows, visible.data(), m.data(), l.data(), alpha.data()); };
  auto values = [&](std::int64_t t) {
    Ops::pv_accumulate(st.data(), rows, visible.data(), nj, rows_of(v, t), alpha.data(), D, os.data());
  };
  DecodeTileTimes times;
  times.key_tile = kBk;
  times.keys = static_cast<int>(nj);
  times.scores = best_ns_a_key([&](std::int64_t t) { scores(t, none); });
  // the scores drift down a little each round, so the running max keeps moving
  times.softmax = best_ns_a_key([&](std::int64_t) {
    for (std::int64_t i = 0; i < rows * kBk; ++i) st[static_cast<std::size_t>(i)] *= 0.999f;
    softmax();
  });
  std::fill(alpha.begin(), alpha.end(), 1.0f);
  times.values = best_ns_a_key(values);
  times.whole = best_ns_a_key([&](std::int64_t t) {
    scores(t, none);
    softmax();
    values(t);
  });
  times.scores_prefetching = best_ns_a_key([&](std::int64_t t) {
    auto next = next_of(t);
    scores(t, next);
  });
  times.whole_prefetching = best_ns_a_key([&](std::int64_t t) {
    auto next = next_of(t);
    scores(t, next);
    softmax();
    values(t);
  });
  return times;
}

DecodeTileTimes run(const DecodeTileRequest& request) {
  switch (request.element) {
    case TileElement::float16: return run_tiles<fattn::cpu::Float16>(request);
    case TileElement::bfloat16: return run_tiles<fattn::cpu::BFloat16>(request);
    case TileElement::float32: break;
  }
  return run_tiles<float>(request);
}

}  // namespace

const DecodeTileLoops FATTN_BENCH_DECODE_TILE{FATTN_BENCH_ISA_NAME, run};

}  // namespace fattn_bench
