// fattn tests — a q8_0 KV cache in attention_kvcache: the append quantizes k_new and v_new
// (float32) into the cache's rows with quantize_q8_0's bytes, and the attention that follows
// gives the bits of the same call over the cache widened to float32 — contiguous and paged
// (shuffled pages, NaN-scaled junk in every slot no sequence uses), GQA, several queries
// (chunked prefill, causal bottom-right), every instruction set and the float64 reference.
// A call that fails leaves the cache's bytes as they were.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "fattn/fattn.hpp"
#include "util/checks.hpp"
#include "util/cpu_variants.hpp"

namespace fattn_test {
namespace {

using fattn::Causal;
using fattn::DType;
using fattn::KvCache;
using fattn::TensorView;

struct Q8CacheCase {
  std::int64_t B, Hq, Hkv, Sq, D;
  std::vector<std::int32_t> lengths;  // keys before the append
  std::int64_t new_len;
  std::int64_t block_size;  // 0: contiguous (B, S, Hkv, D)
  std::int64_t capacity;    // keys per sequence
  Causal causal;
};
void PrintTo(const Q8CacheCase& c, std::ostream* os) {
  *os << "B" << c.B << " H" << c.Hq << "x" << c.Hkv << " Sq" << c.Sq << " D" << c.D << " new"
      << c.new_len << " block_size " << c.block_size;
}

// A cache of q8_0 rows, (pages or B, S, Hkv, D) as ggml and vLLM lay it out. Every row
// starts as junk whose scale is a float16 NaN, so a kernel that reads a slot no sequence
// uses turns its output NaN.
struct Q8PagedCache {
  std::int64_t pages, page_keys, row_bytes;
  std::vector<std::uint8_t> k, v;
  std::vector<std::int32_t> table;  // paged: (B, capacity / block_size)

  Q8PagedCache(const Q8CacheCase& c, std::mt19937& rng)
      : pages(c.block_size ? c.B * c.capacity / c.block_size + 1 : c.B),
        page_keys(c.block_size ? c.block_size : c.capacity),
        row_bytes(fattn::q8_0_row_bytes(c.D)) {
    const std::size_t bytes = static_cast<std::size_t>(pages * page_keys * c.Hkv * row_bytes);
    k.assign(bytes, 0xFF);  // scale 0xFFFF: a float16 NaN
    v.assign(bytes, 0xFF);
    if (c.block_size) {  // every page but one spare, in shuffled order
      std::vector<std::int32_t> order(static_cast<std::size_t>(pages));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      table.assign(order.begin(), order.begin() + c.B * c.capacity / c.block_size);
    }
  }
  TensorView view(std::vector<std::uint8_t>& bytes, const Q8CacheCase& c) {
    return TensorView::bshd(bytes.data(), pages, page_keys, c.Hkv, c.D, DType::q8_0);
  }
  // The bytes of key j of sequence b, kv head h.
  std::uint8_t* row(std::vector<std::uint8_t>& bytes, const Q8CacheCase& c, std::int64_t b,
                    std::int64_t h, std::int64_t j) {
    std::int64_t page = b, slot = j;
    if (c.block_size) {
      page = table[static_cast<std::size_t>(b * (c.capacity / c.block_size) + j / c.block_size)];
      slot = j % c.block_size;
    }
    return bytes.data() + ((page * page_keys + slot) * c.Hkv + h) * row_bytes;
  }
  // Each sequence's first keys[b] keys widened to float32, in a contiguous (B, S, Hkv, D)
  // cache of `capacity` keys (NaN past them).
  std::vector<float> widened(std::vector<std::uint8_t>& bytes, const Q8CacheCase& c,
                             const std::vector<std::int32_t>& keys) {
    std::vector<float> out(static_cast<std::size_t>(c.B * c.capacity * c.Hkv * c.D), std::nanf(""));
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t j = 0; j < keys[static_cast<std::size_t>(b)]; ++j)
        for (std::int64_t h = 0; h < c.Hkv; ++h)
          fattn::dequantize_q8_0(row(bytes, c, b, h, j), c.D,
                                 out.data() + ((b * c.capacity + j) * c.Hkv + h) * c.D);
    return out;
  }
};

std::vector<float> normal_values(std::int64_t n, std::mt19937& rng, float spread = 1.0f) {
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (float& e : x) e = normal(rng);
  return x;
}

class Q8KvCacheTest : public ::testing::TestWithParam<std::tuple<Q8CacheCase, Variant>> {};

TEST_P(Q8KvCacheTest, AppendQuantizesAndAttendsAsTheWidenedCache) {
  const auto& [c, variant] = GetParam();
  FATTN_SKIP_IF_UNSUPPORTED(variant.isa);
  std::mt19937 rng(static_cast<unsigned>(c.D * 131 + c.block_size * 7 + c.new_len));
  Q8PagedCache cache(c, rng);
  std::vector<std::int32_t> after(c.lengths);
  for (std::int32_t& n : after) n += static_cast<std::int32_t>(c.new_len);
  // The keys already cached: quantized rows of unlike scales.
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t j = 0; j < c.lengths[static_cast<std::size_t>(b)]; ++j)
      for (std::int64_t h = 0; h < c.Hkv; ++h) {
        const float spread = 0.25f + static_cast<float>(j % 5);
        fattn::quantize_q8_0(normal_values(c.D, rng, spread).data(), c.D, cache.row(cache.k, c, b, h, j));
        fattn::quantize_q8_0(normal_values(c.D, rng, spread).data(), c.D, cache.row(cache.v, c, b, h, j));
      }
  std::vector<float> qf = normal_values(c.B * c.Sq * c.Hq * c.D, rng);
  std::vector<float> kn = normal_values(c.B * c.new_len * c.Hkv * c.D, rng, 2.0f);
  std::vector<float> vn = normal_values(kn.size(), rng, 2.0f);
  std::vector<std::int32_t> seqlens(c.lengths);
  const TensorView q = TensorView::bshd(qf.data(), c.B, c.Sq, c.Hq, c.D);
  const TensorView k_new = TensorView::bshd(kn.data(), c.B, c.new_len, c.Hkv, c.D);
  const TensorView v_new = TensorView::bshd(vn.data(), c.B, c.new_len, c.Hkv, c.D);
  const TensorView lens = TensorView::int32_vector(seqlens.data(), c.B);
  const TensorView table =
      TensorView::int32_matrix(cache.table.data(), c.B, c.capacity / std::max<std::int64_t>(c.block_size, 1));
  fattn::Options o;
  o.causal = c.causal;
  o.impl = variant.impl;
  o.isa = variant.isa;
  std::vector<float> out(qf.size(), std::nanf("")), lse(static_cast<std::size_t>(c.B * c.Hq * c.Sq), std::nanf(""));
  std::vector<float> lse_wide(lse.size(), std::nanf("")), out_wide(out.size(), std::nanf(""));
  const TensorView lse_view = TensorView::lse(lse.data(), c.B, c.Hq, c.Sq);
  KvCache q8{cache.view(cache.k, c), cache.view(cache.v, c), &lens, c.block_size ? &table : nullptr};
  fattn::attention_kvcache(q, q8, c.new_len ? &k_new : nullptr, c.new_len ? &v_new : nullptr,
                           TensorView::bshd(out.data(), c.B, c.Sq, c.Hq, c.D), &lse_view, o);

  // The appended rows hold quantize_q8_0's bytes of k_new and v_new.
  std::vector<std::uint8_t> expected(static_cast<std::size_t>(cache.row_bytes));
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t t = 0; t < c.new_len; ++t)
      for (std::int64_t h = 0; h < c.Hkv; ++h) {
        const std::int64_t j = c.lengths[static_cast<std::size_t>(b)] + t;
        const std::size_t at = static_cast<std::size_t>(((b * c.new_len + t) * c.Hkv + h) * c.D);
        fattn::quantize_q8_0(kn.data() + at, c.D, expected.data());
        ASSERT_EQ(0, std::memcmp(expected.data(), cache.row(cache.k, c, b, h, j), expected.size()))
            << "k_new row b" << b << " t" << t << " h" << h;
        fattn::quantize_q8_0(vn.data() + at, c.D, expected.data());
        ASSERT_EQ(0, std::memcmp(expected.data(), cache.row(cache.v, c, b, h, j), expected.size()))
            << "v_new row b" << b << " t" << t << " h" << h;
      }

  // The same call over the cache widened to float32, already appended.
  std::vector<float> kw = cache.widened(cache.k, c, after), vw = cache.widened(cache.v, c, after);
  std::vector<std::int32_t> lens_after(after);
  const TensorView lens_after_view = TensorView::int32_vector(lens_after.data(), c.B);
  KvCache wide{TensorView::bshd(kw.data(), c.B, c.capacity, c.Hkv, c.D),
               TensorView::bshd(vw.data(), c.B, c.capacity, c.Hkv, c.D), &lens_after_view, nullptr};
  const TensorView lse_wide_view = TensorView::lse(lse_wide.data(), c.B, c.Hq, c.Sq);
  fattn::attention_kvcache(q, wide, nullptr, nullptr,
                           TensorView::bshd(out_wide.data(), c.B, c.Sq, c.Hq, c.D), &lse_wide_view, o);
  for (std::size_t i = 0; i < out.size(); ++i) {
    ASSERT_FALSE(std::isnan(out[i])) << "out[" << i << "]";
    ASSERT_EQ(out[i], out_wide[i]) << "out[" << i << "]";
  }
  for (std::size_t i = 0; i < lse.size(); ++i) ASSERT_EQ(lse[i], lse_wide[i]) << "lse[" << i << "]";
}

std::vector<Q8CacheCase> q8_cache_cases() {
  return {
      // decode, GQA 4, paged pages of 16: one new token each
      {3, 8, 2, 1, 128, {0, 37, 90}, 1, 16, 128, Causal::bottom_right},
      // GQA 8 (8 rows a kv head), pages of 32, a long sequence beside short ones
      {2, 16, 2, 1, 64, {200, 5}, 1, 32, 256, Causal::bottom_right},
      // chunked prefill: 5 queries and 5 new keys, contiguous cache
      {2, 4, 4, 5, 96, {17, 0}, 5, 0, 64, Causal::bottom_right},
      // no append, no causal limit, MHA
      {1, 4, 4, 2, 32, {70}, 0, 16, 80, Causal::none},
  };
}

std::vector<Variant> q8_cache_variants() {
  std::vector<Variant> vs;
  for (Isa isa : {Isa::avx512, Isa::avx2, Isa::portable}) vs.push_back({Impl::decode, isa});
  vs.push_back({Impl::reference, Isa::automatic});
  return vs;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Q8KvCacheTest,
    ::testing::Combine(::testing::ValuesIn(q8_cache_cases()), ::testing::ValuesIn(q8_cache_variants())),
    [](const auto& info) {
      const Q8CacheCase& c = std::get<0>(info.param);
      return "B" + std::to_string(c.B) + "_H" + std::to_string(c.Hq) + "x" + std::to_string(c.Hkv) +
             "_Sq" + std::to_string(c.Sq) + "_D" + std::to_string(c.D) + "_new" + std::to_string(c.new_len) +
             "_bs" + std::to_string(c.block_size) + "_" + variant_name(std::get<1>(info.param));
    });

// The q8_0 cache's rules, each an error naming the argument, and the cache untouched by a
// call that fails.
TEST(Q8KvCache, Validation) {
  const Q8CacheCase c{2, 4, 2, 1, 64, {3, 10}, 1, 16, 32, Causal::bottom_right};
  std::mt19937 rng(3);
  Q8PagedCache cache(c, rng);
  std::vector<float> qf = normal_values(c.B * c.Hq * c.D, rng), out(qf.size());
  std::vector<float> kn = normal_values(c.B * c.Hkv * c.D, rng), vn(kn);
  std::vector<std::int32_t> seqlens(c.lengths);
  const TensorView q = TensorView::bshd(qf.data(), c.B, 1, c.Hq, c.D);
  const TensorView o = TensorView::bshd(out.data(), c.B, 1, c.Hq, c.D);
  const TensorView k_new = TensorView::bshd(kn.data(), c.B, 1, c.Hkv, c.D);
  const TensorView v_new = TensorView::bshd(vn.data(), c.B, 1, c.Hkv, c.D);
  const TensorView lens = TensorView::int32_vector(seqlens.data(), c.B);
  const TensorView table = TensorView::int32_matrix(cache.table.data(), c.B, c.capacity / c.block_size);
  const KvCache q8{cache.view(cache.k, c), cache.view(cache.v, c), &lens, &table};
  auto call = [&](const TensorView& qv, const KvCache& kv, const TensorView& kn_view, const TensorView& ov) {
    return [=] { fattn::attention_kvcache(qv, kv, &kn_view, &v_new, ov, nullptr, {}); };
  };
  const std::vector<std::uint8_t> k_before = cache.k, v_before = cache.v;

  std::vector<std::uint16_t> bits(qf.size());
  TensorView half = q;
  half.data = bits.data();
  half.dtype = DType::float16;
  expect_error(call(half, q8, k_new, o), "q must have dtype float32 with k and v of dtype q8_0, got float16");
  KvCache mixed = q8;
  std::vector<float> wide(static_cast<std::size_t>(cache.pages * cache.page_keys * c.Hkv * c.D));
  mixed.v = TensorView::bshd(wide.data(), cache.pages, cache.page_keys, c.Hkv, c.D);
  expect_error(call(q, mixed, k_new, o), "v_cache must have dtype q8_0, got float32");
  TensorView quantized_new = cache.view(cache.k, c);
  expect_error(call(q, q8, quantized_new, o), "k_new must have dtype float32, got q8_0");
  KvCache overlapping = q8;  // pages a row's bytes too close: an append would overwrite a row
  overlapping.k.strides[0] -= 4;
  expect_error(call(q, overlapping, k_new, o), "k_cache has overlapping elements");
  seqlens[1] = static_cast<std::int32_t>(c.capacity);  // no room for the new key
  expect_error(call(q, q8, k_new, o), "seqlens[1] + k_new.size(2) = 32 + 1 = 33 keys exceed");
  EXPECT_EQ(k_before, cache.k);
  EXPECT_EQ(v_before, cache.v);
}

}  // namespace
}  // namespace fattn_test
