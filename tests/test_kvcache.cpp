// fattn tests — attention against a KV cache (attention_kvcache) and over packed
// variable-length sequences (attention_varlen): the decode kernel on every ISA against
// the float64 reference, and against an independent path — attention_forward's reference
// on each sequence's own keys, copied out of the cache. Cache slots past each sequence's
// length and pages no sequence uses hold NaN, so a kernel that reads them fails.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>

#include "util/checks.hpp"
#include "util/cpu_variants.hpp"
#include "util/reference.hpp"

namespace fattn_test {
namespace {

using ::testing::HasSubstr;

struct CacheCase {
  std::int64_t B, Hq, Hkv, Sq, capacity, D;
  std::vector<std::int32_t> lengths;  // keys before the append, one per sequence
  std::int64_t new_len = 0;           // keys appended
  Causal causal = Causal::none;
  std::int64_t block_size = 0;        // 0: contiguous cache
  int splits = 0;
  int threads = 0;
  const char* tag = "";
  int prefetch_tiles = -1;            // Options::decode_prefetch_tiles
};

std::string case_name(const CacheCase& c) {
  std::ostringstream s;
  s << "B" << c.B << "_H" << c.Hq << "x" << c.Hkv << "_Sq" << c.Sq << "_cap" << c.capacity << "_D"
    << c.D << "_len";
  for (auto l : c.lengths) s << "_" << l;
  s << "_new" << c.new_len << "_" << fattn::to_string(c.causal) << "_bs" << c.block_size << "_split"
    << c.splits << "_t" << c.threads;
  if (*c.tag) s << "_" << c.tag;
  return s.str();
}
void PrintTo(const CacheCase& c, std::ostream* os) { *os << case_name(c); }

// A cache in FlashAttention's memory layouts: contiguous (B, S, Hkv, D) or paged
// (pages, block_size, Hkv, D) with a shuffled block table and a spare page. Keys are
// N(0,1) up to each sequence's length, NaN beyond.
struct Cache {
  Tensor k, v;
  std::vector<std::int32_t> table;  // paged: (B, blocks_per_seq)
  std::int64_t blocks_per_seq = 0;
  TensorView table_view;

  // Logical key j of sequence b, kv head h, element d.
  float& at(Tensor& t, const CacheCase& c, std::int64_t b, std::int64_t h, std::int64_t j,
            std::int64_t d) {
    if (!c.block_size) return t.at(b, h, j, d);
    const std::int64_t page = table[static_cast<std::size_t>(b * blocks_per_seq + j / c.block_size)];
    return t.at(page, h, j % c.block_size, d);
  }
};

Cache make_cache(const CacheCase& c, Rng& rng) {
  Cache cache;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::int64_t S = c.block_size ? c.block_size : c.capacity;
  std::int64_t pages = c.B;
  if (c.block_size) {
    cache.blocks_per_seq = c.capacity / c.block_size;
    pages = c.B * cache.blocks_per_seq + 1;  // one page no sequence uses
    std::vector<std::int32_t> order(static_cast<std::size_t>(pages));
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 shuffle(static_cast<unsigned>(test_seed()));
    std::shuffle(order.begin(), order.end(), shuffle);
    cache.table.assign(order.begin(), order.begin() + c.B * cache.blocks_per_seq);
    cache.table_view = TensorView::int32_matrix(cache.table.data(), c.B, cache.blocks_per_seq);
  }
  const Placement p = placement(Layout::bshd, pages, c.Hkv, S, c.D);
  cache.k = Tensor(4, {pages, c.Hkv, S, c.D}, p.strides, p.offset, nan);
  cache.v = Tensor(4, {pages, c.Hkv, S, c.D}, p.strides, p.offset, nan);
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t h = 0; h < c.Hkv; ++h)
      for (std::int64_t j = 0; j < c.lengths[static_cast<std::size_t>(b)]; ++j)
        for (std::int64_t d = 0; d < c.D; ++d) {
          cache.at(cache.k, c, b, h, j, d) = rng.normal();
          cache.at(cache.v, c, b, h, j, d) = rng.normal();
        }
  return cache;
}

struct Call {
  Result r;
  std::vector<std::int32_t> seqlens;
};

Call run_kvcache(const CacheCase& c, Cache& cache, const Tensor& q, const Tensor* k_new,
                 const Tensor* v_new, Impl impl, Isa isa = Isa::automatic) {
  Call call{{make_output(Layout::bshd, c.B, c.Hq, c.Sq, c.D), make_lse(LseLayout::contiguous, c.B, c.Hq, c.Sq)},
            c.lengths};
  const TensorView seqlens = TensorView::int32_vector(call.seqlens.data(), c.B);
  fattn::KvCache kv{cache.k.view(), cache.v.view(), &seqlens,
                    c.block_size ? &cache.table_view : nullptr};
  Options o;
  o.causal = c.causal;
  o.impl = impl;
  o.isa = isa;
  o.num_threads = c.threads;
  o.kv_splits = c.splits;
  o.decode_prefetch_tiles = c.prefetch_tiles;
  fattn::attention_kvcache(q.view(), kv, k_new ? k_new->view_ptr() : nullptr,
                           v_new ? v_new->view_ptr() : nullptr, call.r.out.view(),
                           call.r.lse.view_ptr(), o);
  return call;
}

// The independent path: each sequence's keys copied out of the cache (after the append)
// and run through attention_forward's float64 reference, causal bottom-right on its own
// length (top-left as is).
Result per_sequence_reference(const CacheCase& c, Cache& cache, const Tensor& q) {
  Result r{make_output(Layout::bhsd, c.B, c.Hq, c.Sq, c.D), make_lse(LseLayout::contiguous, c.B, c.Hq, c.Sq)};
  for (std::int64_t b = 0; b < c.B; ++b) {
    const std::int64_t L = c.lengths[static_cast<std::size_t>(b)] + c.new_len;
    Tensor qb(4, {1, c.Hq, c.Sq, c.D}, {c.Hq * c.Sq * c.D, c.Sq * c.D, c.D, 1}, 0, 0.0f);
    qb.for_each([&](auto, auto h, auto i, auto d) { qb.at(0, h, i, d) = q.at(b, h, i, d); });
    if (L == 0) {  // no key: rows are 0, logsumexp −inf
      for (std::int64_t h = 0; h < c.Hq; ++h)
        for (std::int64_t i = 0; i < c.Sq; ++i) {
          for (std::int64_t d = 0; d < c.D; ++d) r.out.at(b, h, i, d) = 0.0f;
          r.lse.at(b, h, i) = -kInf;
        }
      continue;
    }
    Tensor kb(4, {1, c.Hkv, L, c.D}, {c.Hkv * L * c.D, L * c.D, c.D, 1}, 0, 0.0f);
    Tensor vb = kb.clone();
    kb.for_each([&](auto, auto h, auto j, auto d) {
      kb.at(0, h, j, d) = cache.at(cache.k, c, b, h, j, d);
      vb.at(0, h, j, d) = cache.at(cache.v, c, b, h, j, d);
    });
    Options o;
    o.causal = c.causal;
    const Result rb = run_reference(qb, kb, vb, o);
    rb.out.for_each([&](auto, auto h, auto i, auto d) { r.out.at(b, h, i, d) = rb.out.at(0, h, i, d); });
    for (std::int64_t h = 0; h < c.Hq; ++h)
      for (std::int64_t i = 0; i < c.Sq; ++i) r.lse.at(b, h, i) = rb.lse.at(0, h, i);
  }
  return r;
}

class KvCacheTest : public ::testing::TestWithParam<std::tuple<Isa, CacheCase>> {};

TEST_P(KvCacheTest, MatchesReferenceAndPerSequenceAttention) {
  const auto& [isa, c] = GetParam();
  FATTN_SKIP_IF_UNSUPPORTED(isa);
  Rng rng(test_seed());
  Cache cache = make_cache(c, rng);
  Cache reference_cache = make_cache(c, rng = Rng(test_seed()));
  const Tensor q = make_input(Layout::bshd, c.B, c.Hq, c.Sq, c.D, rng);
  std::optional<Tensor> k_new, v_new;
  if (c.new_len) {
    k_new = make_input(Layout::strided, c.B, c.Hkv, c.new_len, c.D, rng);
    v_new = make_input(Layout::bshd, c.B, c.Hkv, c.new_len, c.D, rng);
  }
  const Tensor* kn = k_new ? &*k_new : nullptr;
  const Tensor* vn = v_new ? &*v_new : nullptr;
  const Call got = run_kvcache(c, cache, q, kn, vn, Impl::decode, isa);
  const Call ref = run_kvcache(c, reference_cache, q, kn, vn, Impl::reference);
  EXPECT_TRUE(outputs_near(got.r.out, ref.r.out));
  EXPECT_TRUE(lse_near(got.r.lse, ref.r.lse));
  EXPECT_TRUE(outside_view_untouched(got.r.out));
  // The reference's KV-cache reading against attention_forward on copied-out keys.
  const Result independent = per_sequence_reference(c, cache, q);
  EXPECT_TRUE(outputs_near(ref.r.out, independent.out, 1e-12));
  EXPECT_TRUE(lse_near(ref.r.lse, independent.lse, 1e-12));
  // The append wrote the new keys where the cache had NaN, and nothing else.
  EXPECT_TRUE(unchanged(cache.k, reference_cache.k));
  EXPECT_TRUE(unchanged(cache.v, reference_cache.v));
}

CacheCase contiguous(std::int64_t B, std::int64_t Hq, std::int64_t Hkv, std::int64_t Sq,
                     std::int64_t cap, std::int64_t D, std::vector<std::int32_t> lengths,
                     Causal causal = Causal::none) {
  return CacheCase{B, Hq, Hkv, Sq, cap, D, std::move(lengths), 0, causal};
}
CacheCase paged(CacheCase c, std::int64_t block_size) {
  c.block_size = block_size;
  return c;
}
CacheCase appending(CacheCase c, std::int64_t n) {
  c.new_len = n;
  return c;
}
CacheCase split(CacheCase c, int splits, int threads = 0) {
  c.splits = splits;
  c.threads = threads;
  return c;
}

const Causal kNone = Causal::none, kBR = Causal::bottom_right, kTL = Causal::top_left;

std::vector<CacheCase> grid() {
  return {
      // decode: one query, GQA groups 1, 4, 8, 32, key counts around the tile sizes
      contiguous(2, 8, 2, 1, 1000, 64, {1000, 617}),
      contiguous(1, 32, 1, 1, 4097, 128, {4097}),
      contiguous(3, 8, 8, 1, 64, 32, {1, 15, 16}),
      contiguous(2, 8, 1, 1, 40, 80, {17, 0}),
      contiguous(2, 4, 4, 1, 33, 256, {33, 32}, kBR),
      contiguous(2, 14, 2, 1, 700, 64, {700, 95}),  // 7 rows a kv head: direct scores 4 + 2 + 1
      contiguous(1, 8, 2, 3, 500, 128, {500}, kBR),  // 12 rows: transposed
      // short queries, causal both ways, odd head dims
      contiguous(2, 8, 2, 2, 1000, 64, {999, 3}, kBR),
      contiguous(2, 8, 2, 3, 200, 48, {200, 1}, kBR),
      contiguous(1, 4, 1, 7, 300, 24, {300}, kTL),
      contiguous(2, 16, 2, 16, 1000, 64, {1000, 250}, kBR),
      contiguous(1, 2, 1, 65, 130, 16, {130}, kBR),
      contiguous(1, 2, 2, 65, 130, 96, {130}, kNone),
      contiguous(2, 4, 1, 16, 20, 72, {5, 20}, kBR),  // Sq > keys: rows that see nothing
      // split-KV on and off, threads
      split(contiguous(1, 8, 2, 1, 4097, 128, {4097}), 1),
      split(contiguous(1, 8, 2, 1, 4097, 128, {4097}), 5, 2),
      split(contiguous(2, 8, 2, 4, 3000, 64, {3000, 129}, kBR), 7, 1),
      // paged, with shuffled pages
      paged(contiguous(3, 8, 2, 1, 512, 64, {500, 0, 17}), 16),
      paged(contiguous(2, 8, 8, 3, 1024, 128, {1000, 64}, kBR), 64),
      split(paged(contiguous(2, 4, 1, 2, 4096, 64, {4096, 2049}, kBR), 256), 6),
      // append then attend
      appending(contiguous(2, 8, 2, 1, 100, 64, {10, 0}, kBR), 1),
      appending(contiguous(2, 8, 2, 5, 100, 64, {90, 3}, kBR), 5),
      appending(paged(contiguous(2, 4, 2, 4, 256, 32, {30, 100}, kBR), 32), 4),
      appending(paged(contiguous(3, 4, 4, 2, 128, 64, {15, 16, 0}), 16), 2),
      // 48 rows or more per kv head (the query rows along the lanes), paged and appended
      paged(contiguous(2, 16, 2, 8, 1024, 64, {1000, 301}, kBR), 16),
      split(paged(contiguous(1, 12, 1, 4, 2048, 128, {2047}), 32), 3, 2),
      appending(paged(contiguous(2, 8, 1, 7, 256, 64, {100, 9}, kBR), 16), 7),
  };
}

std::vector<std::tuple<Isa, CacheCase>> isa_grid() {
  std::vector<std::tuple<Isa, CacheCase>> cases;
  for (const CacheCase& c : grid()) cases.emplace_back(Isa::avx512, c);
  for (Isa isa : {Isa::amx, Isa::avx2, Isa::portable})
    for (std::size_t n : {0, 5, 7, 10, 18, 21}) cases.emplace_back(isa, grid()[n]);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Grid, KvCacheTest, ::testing::ValuesIn(isa_grid()),
                         [](const auto& info) {
                           return std::string(fattn::to_string(std::get<0>(info.param))) + "_" +
                                  case_name(std::get<1>(info.param));
                         });

// ---- properties -----------------------------------------------------------------------------

Call run_default(const CacheCase& c, Cache& cache, const Tensor& q) {
  return run_kvcache(c, cache, q, nullptr, nullptr, Impl::automatic);
}

TEST(KvCache, PagedEqualsContiguousBitForBit) {
  // GQA 4:1: 12 rows per kv head (keys along the lanes) and 64 (query rows along them)
  for (std::int64_t Sq : {3, 16})
    for (int splits : {1, 4}) {
      const CacheCase c = split(contiguous(2, 8, 2, Sq, 1024, 64, {1000, 333}, kBR), splits);
      Rng rng(test_seed());
      Cache flat = make_cache(c, rng);
      const Tensor q = make_input(Layout::bhsd, c.B, c.Hq, c.Sq, c.D, rng);
      Rng rng2(test_seed());
      Cache pages = make_cache(paged(c, 32), rng2);
      EXPECT_TRUE(bitwise_equal(run_default(c, flat, q).r.out, run_default(paged(c, 32), pages, q).r.out))
          << "Sq " << Sq << ", splits " << splits;
    }
}

// The prefetch distance moves no bit: contiguous and paged (the rows asked for past a
// chunk's end never looked up), keys along the lanes and query rows along them.
TEST(KvCache, SameBitsAtEveryPrefetchDistance) {
  for (std::int64_t block_size : {0, 32})
    for (std::int64_t Sq : {1, 16}) {
      CacheCase c = split(contiguous(2, 8, 2, Sq, 1024, 64, {1000, 333}, kBR), 3);
      if (block_size) c = paged(c, block_size);
      Rng rng(test_seed());
      Cache cache = make_cache(c, rng);
      const Tensor q = make_input(Layout::bhsd, c.B, c.Hq, c.Sq, c.D, rng);
      const Call chosen = run_default(c, cache, q);
      for (int tiles = 0; tiles <= fattn::kMaxDecodePrefetchTiles; ++tiles) {
        c.prefetch_tiles = tiles;
        const Call got = run_default(c, cache, q);
        EXPECT_TRUE(bitwise_equal(chosen.r.out, got.r.out))
            << "block_size " << block_size << ", Sq " << Sq << ", prefetch tiles " << tiles;
        EXPECT_TRUE(bitwise_equal(chosen.r.lse, got.r.lse));
      }
    }
}

TEST(KvCache, SameBitsEveryRun) {
  const CacheCase c = split(contiguous(1, 32, 8, 1, 20000, 128, {20000}), 0, 2);
  Rng rng(test_seed());
  Cache cache = make_cache(c, rng);
  const Tensor q = make_input(Layout::bhsd, c.B, c.Hq, c.Sq, c.D, rng);
  const Call a = run_default(c, cache, q), b = run_default(c, cache, q);
  EXPECT_TRUE(bitwise_equal(a.r.out, b.r.out));
  EXPECT_TRUE(bitwise_equal(a.r.lse, b.r.lse));
}

TEST(KvCache, EmptySequenceGivesZeroRowsAndMinusInfinity) {
  const CacheCase c = contiguous(2, 4, 2, 2, 64, 32, {0, 64});
  Rng rng(test_seed());
  Cache cache = make_cache(c, rng);
  const Tensor q = make_input(Layout::bhsd, c.B, c.Hq, c.Sq, c.D, rng);
  const Call got = run_default(c, cache, q);
  for (std::int64_t h = 0; h < c.Hq; ++h)
    for (std::int64_t i = 0; i < c.Sq; ++i) {
      EXPECT_EQ(got.r.lse.at(0, h, i), -kInf);
      for (std::int64_t d = 0; d < c.D; ++d) EXPECT_EQ(got.r.out.at(0, h, i, d), 0.0f);
      EXPECT_TRUE(std::isfinite(got.r.lse.at(1, h, i)));
    }
}

// A key count of 64k and more, checked on sampled rows against reference_row.
TEST(KvCache, LongCacheSampledRows) {
  const std::int64_t L = 65600, Hq = 8, D = 64;
  const CacheCase c = contiguous(1, Hq, 2, 1, L, D, {static_cast<std::int32_t>(L)});
  Rng rng(test_seed());
  Cache cache = make_cache(c, rng);
  const Tensor q = make_input(Layout::bhsd, 1, Hq, 1, D, rng);
  const Call got = run_default(c, cache, q);
  std::vector<double> row(static_cast<std::size_t>(D));
  for (std::int64_t h : {0, 3, 7}) {
    const double lse = fattn::reference_row(q.view(), cache.k.view(), cache.v.view(), {}, 0, h, 0, row.data());
    EXPECT_NEAR(got.r.lse.at(0, h, 0), lse, kLseTol * std::max(1.0, std::fabs(lse)));
    for (std::int64_t d = 0; d < D; ++d) EXPECT_NEAR(got.r.out.at(0, h, 0, d), row[d], kOutTol);
  }
}

// Working memory does not grow with the cache's length (with no split partials).
TEST(KvCache, WorkingMemoryIndependentOfKeys) {
  std::vector<std::int64_t> bytes;
  for (std::int64_t L : {1024, 65536}) {
    std::vector<float> k(static_cast<std::size_t>(L * 2 * 64), 1.0f), v = k, q(8 * 64, 1.0f);
    std::int32_t len = static_cast<std::int32_t>(L);
    const TensorView seqlens = TensorView::int32_vector(&len, 1);
    fattn::KvCache kv{TensorView::bshd(k.data(), 1, L, 2, 64), TensorView::bshd(v.data(), 1, L, 2, 64), &seqlens};
    Options o;
    o.kv_splits = 1;
    bytes.push_back(fattn::kvcache_extra_bytes(TensorView::bshd(q.data(), 1, 1, 8, 64), kv, nullptr, o));
  }
  EXPECT_EQ(bytes[0], bytes[1]);
}

// ---- errors: named, and the cache left as it was ---------------------------------------------

struct ErrorCase {
  const char* what;
  std::function<void(CacheCase&, Cache&, std::vector<std::int32_t>&, Tensor&)> spoil;
  const char* message;
};

TEST(KvCache, BadArgumentsAreNamedAndTheCacheIsUntouched) {
  const std::vector<ErrorCase> cases = {
      {"negative length", [](auto&, auto&, auto& s, auto&) { s[0] = -1; },
       "seqlens[0] must be >= 0, got -1"},
      {"append past capacity", [](auto&, auto&, auto& s, auto&) { s[1] = 31; },
       "seqlens[1] + k_new.size(2) = 31 + 2 = 33 keys exceed the cache's capacity of 32 keys"},
      {"page out of range", [](auto&, auto& cache, auto&, auto&) { cache.table[0] = 99; },
       "block_table[0][0] = 99 is outside [0, 5)"},
      {"two appends to one slot", [](auto&, auto& cache, auto& s, auto&) {
         s[0] = 16; s[1] = 16; cache.table[3] = cache.table[1]; },
       "both append to slots of page"},
      {"block size", [](auto& c, auto& cache, auto&, auto&) {
         cache.k.view().sizes[2] = 8; cache.v.view().sizes[2] = 8; (void)c; },
       "must be a multiple of 16"},
  };
  for (const ErrorCase& e : cases) {
    CacheCase c = appending(paged(contiguous(2, 4, 2, 1, 32, 16, {5, 20}), 16), 2);
    Rng rng(test_seed());
    Cache cache = make_cache(c, rng);
    Tensor q = make_input(Layout::bhsd, c.B, c.Hq, c.Sq, c.D, rng);
    const Tensor kn = make_input(Layout::bhsd, c.B, c.Hkv, 2, c.D, rng);
    const Tensor vn = make_input(Layout::bhsd, c.B, c.Hkv, 2, c.D, rng);
    std::vector<std::int32_t> seqlens = c.lengths;
    e.spoil(c, cache, seqlens, q);
    const Tensor k_before = cache.k.clone(), v_before = cache.v.clone();
    Tensor out = make_output(Layout::bhsd, c.B, c.Hq, c.Sq, c.D);
    const TensorView s = TensorView::int32_vector(seqlens.data(), c.B);
    cache.table_view = TensorView::int32_matrix(cache.table.data(), c.B, cache.blocks_per_seq);
    fattn::KvCache kv{cache.k.view(), cache.v.view(), &s, &cache.table_view};
    try {
      fattn::attention_kvcache(q.view(), kv, &kn.view(), &vn.view(), out.view(), nullptr, {});
      ADD_FAILURE() << e.what << ": no error";
    } catch (const fattn::Error& err) {
      EXPECT_THAT(err.what(), HasSubstr(e.message)) << e.what;
    }
    EXPECT_TRUE(unchanged(cache.k, k_before)) << e.what;
    EXPECT_TRUE(unchanged(cache.v, v_before)) << e.what;
    EXPECT_TRUE(all_poison(out)) << e.what;
  }
}

TEST(KvCache, OtherErrors) {
  std::vector<float> q(4 * 16, 1.0f), k(2 * 64 * 16, 1.0f), v = k, out(4 * 16);
  std::int32_t lens[1] = {64};
  const TensorView s = TensorView::int32_vector(lens, 1);
  const TensorView qv = TensorView::bhsd(q.data(), 1, 4, 1, 16);
  const TensorView ov = TensorView::bhsd(out.data(), 1, 4, 1, 16);
  const TensorView kv = TensorView::bhsd(k.data(), 1, 2, 64, 16), vv = TensorView::bhsd(v.data(), 1, 2, 64, 16);
  auto error_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const fattn::Error& e) {
      return e.what();
    }
    return "no error";
  };
  Options fused;
  fused.impl = Impl::fused;
  EXPECT_THAT(error_of([&] { fattn::attention_kvcache(qv, {kv, vv, &s}, nullptr, nullptr, ov, nullptr, fused); }),
              HasSubstr("attention_kvcache runs impl auto, decode or reference, got fused"));
  EXPECT_THAT(error_of([&] { fattn::attention_kvcache(qv, {kv, vv, &s}, &kv, nullptr, ov, nullptr); }),
              HasSubstr("k_new and v_new must be given together"));
  std::vector<float> k_new(2 * 16, 1.0f), v_new = k_new;
  const TensorView knv = TensorView::bhsd(k_new.data(), 1, 2, 1, 16);
  const TensorView vnv = TensorView::bhsd(v_new.data(), 1, 2, 1, 16);
  EXPECT_THAT(error_of([&] { fattn::attention_kvcache(qv, {kv, vv, nullptr}, &knv, &vnv, ov, nullptr); }),
              HasSubstr("k_new and v_new need seqlens"));
  EXPECT_THAT(error_of([&] { fattn::attention_kvcache(qv, {kv, vv, &s}, &kv, &vv, ov, nullptr); }),
              HasSubstr("k_cache must not overlap k_new"));
  EXPECT_THAT(error_of([&] { fattn::attention_kvcache(qv, {kv, vv, &s}, nullptr, nullptr, kv, nullptr); }),
              HasSubstr("out.size(1) (as q) must equal q.size(1) = 4, got 2"));
  const TensorView aliased = TensorView::bhsd(k.data(), 1, 4, 1, 16);
  EXPECT_THAT(error_of([&] { fattn::attention_kvcache(qv, {kv, vv, &s}, nullptr, nullptr, aliased, nullptr); }),
              HasSubstr("out must not overlap k_cache"));
  const TensorView float_lengths{q.data(), 1, {1, 0, 0, 0}, {1, 0, 0, 0}, fattn::DType::float32};
  EXPECT_THAT(error_of([&] { fattn::attention_kvcache(qv, {kv, vv, &float_lengths}, nullptr, nullptr, ov, nullptr); }),
              HasSubstr("seqlens must have dtype int32, got float32"));
  Options bad_splits;
  bad_splits.kv_splits = -1;
  EXPECT_THAT(error_of([&] { fattn::attention_kvcache(qv, {kv, vv, &s}, nullptr, nullptr, ov, nullptr, bad_splits); }),
              HasSubstr("kv_splits must be >= 0"));
  for (int tiles : {-2, fattn::kMaxDecodePrefetchTiles + 1}) {
    Options bad_prefetch;
    bad_prefetch.decode_prefetch_tiles = tiles;
    EXPECT_THAT(error_of([&] { fattn::attention_kvcache(qv, {kv, vv, &s}, nullptr, nullptr, ov, nullptr, bad_prefetch); }),
                HasSubstr("decode_prefetch_tiles must be -1 (chosen by fattn) or 0 to 4, got " +
                          std::to_string(tiles)));
  }
  for (int level : {-2, 0, fattn::kMaxDecodePrefetchLevel + 1}) {
    Options bad_level;
    bad_level.decode_prefetch_level = level;
    EXPECT_THAT(error_of([&] { fattn::attention_kvcache(qv, {kv, vv, &s}, nullptr, nullptr, ov, nullptr, bad_level); }),
                HasSubstr("decode_prefetch_level must be -1 (chosen by fattn) or 1 to 2 (the cache "
                          "level the prefetch fills), got " + std::to_string(level)));
  }
}

// ---- variable-length prefill ---------------------------------------------------------------

TEST(Varlen, EachSequenceAsItsOwnProblem) {
  const std::int64_t Hq = 4, Hkv = 2, D = 32;
  const std::vector<std::int32_t> cu_q{0, 5, 5, 40, 41}, cu_k{0, 7, 19, 19, 60};
  std::vector<std::int32_t> cq = cu_q, ck = cu_k;
  for (Causal causal : {kNone, kBR}) {
    Rng rng(test_seed());
    const Tensor q = make_input(Layout::bshd, 1, Hq, 41, D, rng);
    const Tensor k = make_input(Layout::bshd, 1, Hkv, 60, D, rng);
    const Tensor v = make_input(Layout::bshd, 1, Hkv, 60, D, rng);
    Tensor out = make_output(Layout::bshd, 1, Hq, 41, D);
    Tensor lse = make_lse(LseLayout::contiguous, 1, Hq, 41);
    Options o;
    o.causal = causal;
    fattn::attention_varlen(q.view(), k.view(), v.view(), TensorView::int32_vector(cq.data(), 5),
                            TensorView::int32_vector(ck.data(), 5), out.view(), lse.view_ptr(), o);
    for (std::size_t b = 0; b + 1 < cu_q.size(); ++b) {
      const std::int64_t q0 = cu_q[b], nq = cu_q[b + 1] - q0, k0 = cu_k[b], nk = cu_k[b + 1] - k0;
      for (std::int64_t h = 0; h < Hq; ++h)
        for (std::int64_t i = 0; i < nq; ++i) {
          std::vector<double> row(D);
          double want_lse = -std::numeric_limits<double>::infinity();
          if (nk > 0) {
            Tensor qb = make_input(Layout::bhsd, 1, Hq, nq, D, rng);
            qb.for_each([&](auto, auto hh, auto ii, auto d) { qb.at(0, hh, ii, d) = q.at(0, hh, q0 + ii, d); });
            TensorView kb = k.view(), vb = v.view();
            kb.data = const_cast<float*>(k.storage().data() + k.offset_of(0, 0, k0, 0));
            vb.data = const_cast<float*>(v.storage().data() + v.offset_of(0, 0, k0, 0));
            kb.sizes[2] = vb.sizes[2] = nk;
            want_lse = fattn::reference_row(qb.view(), kb, vb, o, 0, h, i, row.data());
          }
          if (std::isinf(want_lse)) EXPECT_EQ(lse.at(0, h, q0 + i), -kInf);
          else EXPECT_NEAR(lse.at(0, h, q0 + i), want_lse, 1e-5 * std::max(1.0, std::fabs(want_lse)));
          for (std::int64_t d = 0; d < D; ++d) EXPECT_NEAR(out.at(0, h, q0 + i, d), row[d], 1e-5);
        }
    }
  }
}

// float64 runs the reference per sequence; the rows of a sequence with queries but no key
// (0, logsumexp −inf) and the zero gradients of sequences without (query, key) pairs are
// written as float64, at float64 offsets.
TEST(Varlen, Float64SequencesWithoutKeysOrQueries) {
  const std::int64_t H = 2, D = 16, total_q = 5, total_k = 4;
  std::vector<std::int32_t> cu_q{0, 3, 3, 5}, cu_k{0, 0, 2, 4};  // 0: no key, 1: no query
  Rng rng(test_seed());
  auto filled = [&](std::int64_t rows) {
    std::vector<double> x(static_cast<std::size_t>(rows * H * D));
    for (double& e : x) e = rng.normal();
    return x;
  };
  auto view = [&](std::vector<double>& x, std::int64_t rows) {
    return TensorView::bshd(x.data(), 1, rows, H, D, fattn::DType::float64);
  };
  std::vector<double> q = filled(total_q), k = filled(total_k), v = filled(total_k);
  std::vector<double> dout = filled(total_q), out(q.size(), 7.0), lse(H * total_q, 7.0);
  std::vector<double> dq(q.size(), 7.0), dk(k.size(), 7.0), dv(v.size(), 7.0);
  const TensorView cq = TensorView::int32_vector(cu_q.data(), 4);
  const TensorView ck = TensorView::int32_vector(cu_k.data(), 4);
  const TensorView lv = TensorView::lse(lse.data(), fattn::DType::float64, 1, H, total_q);
  fattn::attention_varlen(view(q, total_q), view(k, total_k), view(v, total_k), cq, ck,
                          view(out, total_q), &lv);
  for (std::int64_t i = 0; i < total_q; ++i)
    for (std::int64_t h = 0; h < H; ++h) {
      const double row_lse = lse[static_cast<std::size_t>(h * total_q + i)];
      if (i < 3) EXPECT_EQ(row_lse, -std::numeric_limits<double>::infinity()) << i;
      else EXPECT_TRUE(std::isfinite(row_lse)) << i;
      for (std::int64_t d = 0; d < D; ++d) {
        const double o = out[static_cast<std::size_t>((i * H + h) * D + d)];
        if (i < 3) EXPECT_EQ(o, 0.0) << i;
        else EXPECT_TRUE(std::isfinite(o) && o != 7.0) << i;
      }
    }
  fattn::attention_varlen_backward(view(q, total_q), view(k, total_k), view(v, total_k),
                                   view(out, total_q), view(dout, total_q), lv, cq, ck,
                                   view(dq, total_q), view(dk, total_k), view(dv, total_k));
  for (std::size_t e = 0; e < dq.size(); ++e)  // queries 0..2 see no key
    if (e < static_cast<std::size_t>(3 * H * D)) EXPECT_EQ(dq[e], 0.0) << e;
    else EXPECT_NE(dq[e], 7.0) << e;
  for (std::size_t e = 0; e < dk.size(); ++e)  // keys 0..1 have no query
    if (e < static_cast<std::size_t>(2 * H * D)) EXPECT_TRUE(dk[e] == 0.0 && dv[e] == 0.0) << e;
    else EXPECT_TRUE(dk[e] != 7.0 && dv[e] != 7.0) << e;
}

TEST(Varlen, BadOffsetsAreNamed) {
  std::vector<float> q(4 * 10 * 16, 1.0f), k(2 * 10 * 16, 1.0f), v = k, out(q.size());
  std::vector<std::int32_t> cu_q{0, 6, 4}, cu_k{0, 5, 10};
  const auto qv = TensorView::bshd(q.data(), 1, 10, 4, 16), ov = TensorView::bshd(out.data(), 1, 10, 4, 16);
  const auto kv = TensorView::bshd(k.data(), 1, 10, 2, 16), vv = TensorView::bshd(v.data(), 1, 10, 2, 16);
  try {
    fattn::attention_varlen(qv, kv, vv, TensorView::int32_vector(cu_q.data(), 3),
                            TensorView::int32_vector(cu_k.data(), 3), ov, nullptr);
    ADD_FAILURE() << "no error";
  } catch (const fattn::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cu_seqlens_q[2] must be >= the offset before it, 6, got 4"));
  }
}

}  // namespace
}  // namespace fattn_test
