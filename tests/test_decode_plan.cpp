// fattn tests — what forward_plan and kvcache_plan say the decode kernel does
// (ForwardPlan::decode): the scores' form by rows and element type on each instruction set,
// the cache read in place or staged, the work items and key chunks (consistent with each
// other and with kv_splits), and a reason that names them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fattn/fattn.hpp"
#include "util/cpu_variants.hpp"

namespace fattn_test {
namespace {

using fattn::DType;
using fattn::KvCache;
using fattn::TensorView;
using ::testing::HasSubstr;

struct Shape {
  std::int64_t B, Hq, Hkv, Sq, Sk, D;
};

// The plan of a decode call over (B, S, H, D) float32 data (the values are read only where a
// test runs the call).
struct Call {
  Shape s;
  std::vector<float> q, k, v;
  TensorView qv, kv, vv;
  explicit Call(const Shape& shape, DType dtype = DType::float32)
      : s(shape),
        q(static_cast<std::size_t>(shape.B * shape.Sq * shape.Hq * shape.D)),
        k(static_cast<std::size_t>(shape.B * shape.Sk * shape.Hkv * shape.D)),
        v(k.size()) {
    qv = TensorView::bshd(q.data(), s.B, s.Sq, s.Hq, s.D, dtype);
    kv = TensorView::bshd(k.data(), s.B, s.Sk, s.Hkv, s.D, dtype);
    vv = TensorView::bshd(v.data(), s.B, s.Sk, s.Hkv, s.D, dtype);
  }
  fattn::DecodePlan plan(Isa isa, std::int64_t splits = 0, int threads = 2, int prefetch_tiles = -1,
                         int prefetch_level = -1) const {
    fattn::Options o;
    o.decode_prefetch_tiles = prefetch_tiles;
    o.decode_prefetch_level = prefetch_level;
    o.impl = Impl::decode;
    o.isa = isa;
    o.kv_splits = static_cast<int>(splits);
    o.num_threads = threads;
    o.causal = fattn::Causal::bottom_right;
    const fattn::ForwardPlan p = fattn::forward_plan(qv, kv, vv, o);
    EXPECT_EQ(p.impl, Impl::decode);
    return p.decode;
  }
};

// items = batch × head groups × row tiles × splits, whatever the shape.
void expect_consistent(const fattn::DecodePlan& d, const Shape& s) {
  const std::int64_t head_groups = (s.Hkv + d.heads_per_item - 1) / d.heads_per_item;
  const std::int64_t row_tiles = (d.rows + 63) / 64;
  EXPECT_EQ(d.rows, s.Sq * (s.Hq / s.Hkv));
  EXPECT_EQ(d.items, s.B * head_groups * row_tiles * d.splits);
  EXPECT_GE(d.heads_per_item, 1);
  EXPECT_LE(d.heads_per_item, s.Hkv);
  EXPECT_GT(d.key_tile, 0);
  EXPECT_THAT(d.reason, HasSubstr(d.scores));
}

TEST(DecodePlan, ScoresByRowsAndInstructionSet) {
  const Shape gqa4{1, 32, 8, 1, 4096, 128}, gqa8{1, 32, 4, 1, 4096, 128}, sq16{1, 32, 8, 16, 4096, 128};
  for (Isa isa : {Isa::avx512, Isa::avx2, Isa::portable}) {
    if (!fattn::cpu_supports(isa)) continue;
    SCOPED_TRACE(fattn::to_string(isa));
    const Call four(gqa4), eight(gqa8), many(sq16);
    const fattn::DecodePlan d4 = four.plan(isa), d8 = eight.plan(isa), d64 = many.plan(isa);
    for (const auto& [d, s] : {std::pair{d4, gqa4}, std::pair{d8, gqa8}, std::pair{d64, sq16}})
      expect_consistent(d, s);
    EXPECT_TRUE(d4.reads_in_place);
    // 4 rows: straight from the key rows where vectors allow; the portable table transposes.
    EXPECT_EQ(d4.scores, isa == Isa::portable ? "transposed" : "direct");
    // 8 rows (GQA 8), float32 keys: direct in two passes of 4 rows; the portable table
    // transposes.
    EXPECT_EQ(d8.scores, isa == Isa::portable ? "transposed" : "direct");
    // 64 rows: the query rows along the lanes on AVX-512.
    if (isa == Isa::avx512) EXPECT_EQ(d64.scores, "query_lanes");
  }
}

TEST(DecodePlan, SplitsByRuleOrAsAsked) {
  const Shape one{1, 32, 8, 1, 32768, 128};
  const Call call(one);
  const fattn::DecodePlan rule = call.plan(fattn::best_cpu_isa() == Isa::amx ? Isa::avx512 : fattn::best_cpu_isa());
  // One sequence, all 8 kv heads in one item: the keys are cut so that each worker gets
  // several items.
  EXPECT_GT(rule.splits, 1);
  EXPECT_THAT(rule.reason, HasSubstr("key chunks: "));
  const fattn::DecodePlan asked = call.plan(Isa::portable, 3);
  EXPECT_EQ(asked.splits, 3);
  EXPECT_THAT(asked.reason, HasSubstr("as asked (kv_splits 3"));
  expect_consistent(asked, one);
}

TEST(DecodePlan, ShortCacheHeadsDealtOutAmongWorkers) {
  // Under two chunks of keys, one sequence: one item of all 8 kv heads would leave all but
  // one worker idle, so the heads are split among the workers.
  const Shape short_cache{1, 32, 8, 1, 600, 128};
  const Call call(short_cache);
  const Isa isa = fattn::best_cpu_isa() == Isa::amx ? Isa::avx512 : fattn::best_cpu_isa();
  for (int threads : {2, 3, 16}) {
    SCOPED_TRACE(threads);
    const fattn::DecodePlan d = call.plan(isa, 0, threads);
    expect_consistent(d, short_cache);
    EXPECT_EQ(d.splits, 1);
    EXPECT_GE(d.items, std::min<std::int64_t>(threads, short_cache.Hkv));
    EXPECT_THAT(d.reason, HasSubstr("dealt out among " + std::to_string(threads) + " workers"));
  }
  // One thread, a long cache (chunks instead) or chunks asked for: all heads in one item.
  EXPECT_EQ(call.plan(isa, 0, 1).heads_per_item, 8);
  EXPECT_EQ(Call(Shape{1, 32, 8, 1, 4096, 128}).plan(isa).heads_per_item, 8);
  EXPECT_EQ(call.plan(isa, 2, 2).heads_per_item, 8);
  // One kv head has nothing to deal out.
  const fattn::DecodePlan mqa = Call(Shape{1, 8, 1, 1, 600, 128}).plan(isa);
  EXPECT_EQ(mqa.heads_per_item, 1);
  EXPECT_THAT(mqa.reason, ::testing::Not(HasSubstr("dealt out")));
}

TEST(DecodePlan, PrefetchDistanceByDefaultOrAsAsked) {
  const Call call(Shape{1, 32, 8, 1, 32768, 128});
  const Isa isa = fattn::best_cpu_isa() == Isa::amx ? Isa::avx512 : fattn::best_cpu_isa();
  const fattn::DecodePlan chosen = call.plan(isa);
  EXPECT_EQ(chosen.prefetch_tiles, 1);
  EXPECT_THAT(chosen.reason, HasSubstr("the rows 1 key tile ahead asked of memory"));
  EXPECT_THAT(chosen.reason, HasSubstr("the measured default"));
  const fattn::DecodePlan none = call.plan(isa, 0, 2, 0);
  EXPECT_EQ(none.prefetch_tiles, 0);
  EXPECT_THAT(none.reason, HasSubstr("the hardware prefetchers alone"));
  const fattn::DecodePlan far = call.plan(isa, 0, 2, 3);
  EXPECT_EQ(far.prefetch_tiles, 3);
  EXPECT_THAT(far.reason, HasSubstr("3 key tiles ahead"));
  EXPECT_THAT(far.reason, HasSubstr("as asked"));
  // The level it fills: the probed core's by default, the one asked for where asked; none
  // without a prefetch.
  const fattn::DecodePrefetchLevelChoice& probed = fattn::decode_prefetch_level_choice();
  EXPECT_EQ(chosen.prefetch_level, probed.level);
  EXPECT_THAT(chosen.reason, HasSubstr(probed.level == 2 ? "into L2 (PREFETCHT1: " + probed.reason
                                                         : "into L1 (PREFETCHT0: " + probed.reason));
  const fattn::DecodePlan l1 = call.plan(isa, 0, 2, -1, 1);
  EXPECT_EQ(l1.prefetch_level, 1);
  EXPECT_THAT(l1.reason, HasSubstr("into L1 (PREFETCHT0: decode_prefetch_level as asked)"));
  const fattn::DecodePlan l2 = call.plan(isa, 0, 2, -1, 2);
  EXPECT_EQ(l2.prefetch_level, 2);
  EXPECT_THAT(l2.reason, HasSubstr("into L2 (PREFETCHT1: decode_prefetch_level as asked)"));
  EXPECT_EQ(call.plan(isa, 0, 2, 0, 2).prefetch_level, 0);
}

// The probe's rule: level 2 where a line PREFETCHT1 asked for loads nearer an unhinted
// line's time than a PREFETCHT0 one's (it stayed in L2); 1 where it loads as fast as after
// PREFETCHT0, and where the probe sees no L1 apart from L2 at all.
TEST(DecodePrefetchLevel, ProbeRule) {
  using fattn::decode_prefetch_level_for, fattn::PrefetchLatencies;
  EXPECT_EQ(decode_prefetch_level_for(PrefetchLatencies{2.9, 1.8, 2.8}), 2);  // Zen 4, as probed
  EXPECT_EQ(decode_prefetch_level_for(PrefetchLatencies{2.9, 1.8, 1.9}), 1);  // T1 fills L1
  EXPECT_EQ(decode_prefetch_level_for(PrefetchLatencies{2.9, 1.8, 2.4}), 2);  // past the midpoint
  EXPECT_EQ(decode_prefetch_level_for(PrefetchLatencies{2.9, 1.8, 2.3}), 1);
  EXPECT_EQ(decode_prefetch_level_for(PrefetchLatencies{2.9, 2.8, 2.9}), 1);  // no L1 seen
  EXPECT_FALSE(fattn::prefetch_probe_tells_levels(PrefetchLatencies{2.9, 2.8, 2.9}));
  EXPECT_TRUE(fattn::prefetch_probe_tells_levels(PrefetchLatencies{2.9, 1.8, 2.9}));
}

// The probe on this machine: once per process, a level the options take, the timings in its
// reason.
TEST(DecodePrefetchLevel, ProbedOncePerProcess) {
  const fattn::DecodePrefetchLevelChoice& choice = fattn::decode_prefetch_level_choice();
  EXPECT_EQ(&choice, &fattn::decode_prefetch_level_choice());
  EXPECT_TRUE(choice.level == 1 || choice.level == 2) << choice.level;
  EXPECT_FALSE(choice.reason.empty());
#if defined(__x86_64__)
  const fattn::PrefetchLatencies& t = choice.latencies;
  EXPECT_GT(t.unhinted_ns, 0.0);
  EXPECT_GT(t.t0_ns, 0.0);
  EXPECT_GT(t.t1_ns, 0.0);
  EXPECT_EQ(choice.level, fattn::decode_prefetch_level_for(t));
  EXPECT_THAT(choice.reason, HasSubstr("after PREFETCHT1"));
#endif
}

// The prefetch's distance and level change when the rows arrive, never the results.
TEST(DecodePlan, PrefetchOptionsKeepTheBits) {
  const Shape s{2, 8, 2, 1, 3000, 128};
  Call call(s);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (auto* t : {&call.q, &call.k, &call.v})
    for (float& x : *t) x = normal(rng);
  auto run = [&](int tiles, int level) {
    std::vector<float> out(call.q.size(), std::nanf(""));
    fattn::Options o;
    o.impl = Impl::decode;
    o.num_threads = 2;
    o.causal = fattn::Causal::bottom_right;
    o.decode_prefetch_tiles = tiles;
    o.decode_prefetch_level = level;
    fattn::attention_forward(call.qv, call.kv, call.vv,
                             TensorView::bshd(out.data(), s.B, s.Sq, s.Hq, s.D), nullptr, o);
    return out;
  };
  const std::vector<float> base = run(-1, -1);
  for (float x : base) ASSERT_FALSE(std::isnan(x));  // every row written over the poison
  EXPECT_EQ(run(-1, 1), base);
  EXPECT_EQ(run(-1, 2), base);
  EXPECT_EQ(run(2, 2), base);
  EXPECT_EQ(run(0, -1), base);
}

TEST(DecodePlan, StagedWhereDimsAreStrided) {
  const Shape s{2, 8, 2, 1, 256, 64};
  Call call(s);
  call.kv.strides[3] = 2;  // every other float: the dims are not contiguous
  call.kv.strides[0] *= 2, call.kv.strides[1] *= 2, call.kv.strides[2] *= 2;
  call.k.resize(call.k.size() * 2);
  call.kv.data = call.k.data();
  const fattn::DecodePlan d = call.plan(Isa::portable);
  EXPECT_FALSE(d.reads_in_place);
  EXPECT_THAT(d.reason, HasSubstr("staged as float32"));
  EXPECT_EQ(d.prefetch_tiles, 0);  // staged tiles: nothing to ask for ahead
  EXPECT_THAT(d.reason, HasSubstr("no software prefetch (staged tiles)"));
}

TEST(DecodePlan, KvCachePlanOfAPagedQ8_0Cache) {
  const std::int64_t B = 2, Hq = 16, Hkv = 4, D = 64, pages = 8, block = 16;
  std::vector<float> q(static_cast<std::size_t>(B * Hq * D));
  std::vector<std::uint8_t> k(static_cast<std::size_t>(pages * block * Hkv * fattn::q8_0_row_bytes(D))), v(k);
  std::vector<std::int32_t> table{0, 1, 2, 3, 4, 5, 6, 7};
  const TensorView qv = TensorView::bshd(q.data(), B, 1, Hq, D);
  const TensorView t = TensorView::int32_matrix(table.data(), B, 4);
  const KvCache cache{TensorView::bshd(k.data(), pages, block, Hkv, D, DType::q8_0),
                      TensorView::bshd(v.data(), pages, block, Hkv, D, DType::q8_0), nullptr, &t};
  fattn::Options o;
  o.isa = Isa::portable;
  const fattn::ForwardPlan p = fattn::kvcache_plan(qv, cache, nullptr, o);
  EXPECT_EQ(p.impl, Impl::decode);
  EXPECT_EQ(p.decode.rows, 4);
  EXPECT_TRUE(p.decode.reads_in_place);
  EXPECT_EQ(p.decode.scores, "transposed");
  o.impl = Impl::reference;
  EXPECT_TRUE(fattn::kvcache_plan(qv, cache, nullptr, o).decode.scores.empty());
}

}  // namespace
}  // namespace fattn_test
