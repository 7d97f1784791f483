// fattn tests — attention_varlen over a KV cache (FlashAttention's flash_attn_varlen_func
// with block_table and seqused_k): the keys of packed sequences laid on shuffled pages of a
// cache (unused slots and spare pages NaN, table entries past a sequence's pages out of
// range), or packed with rows past seqused_k NaN, give the bits of the packed call on the
// same numbers, for every kernel, dtype and variant varlen takes (the packed call itself
// is checked against the float64 reference in test_varlen.cpp); bad tables and lengths are
// errors that name the argument, with nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "fattn/attention.hpp"
#include "fattn/kv_cache.hpp"
#include "util/checks.hpp"
#include "util/elements.hpp"
#include "util/seed.hpp"
#include "util/varlen.hpp"

namespace fattn_test {
namespace varlen {
namespace {

// Where the keys are: pages with cu_seqlens_k, pages with seqused_k only, or packed rows
// with NaN rows after each sequence's seqused_k keys.
enum class Keys { pages, pages_seqused, packed_seqused };

struct PagedCase {
  Case c;
  Keys keys = Keys::pages;
  std::int64_t page = 16;
};
void PrintTo(const PagedCase& p, std::ostream* os) {
  PrintTo(p.c, os);
  *os << (p.keys == Keys::pages ? "_pages" : p.keys == Keys::pages_seqused ? "_pages_seqused"
                                                                            : "_packed_seqused")
      << p.page;
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Elements of `dtype` in bshd order, every one NaN until written.
std::vector<std::uint8_t> nan_bytes(std::int64_t elements, DType dtype) {
  const auto size = static_cast<std::size_t>(fattn::element_size(dtype));
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(elements) * size);
  for (std::size_t e = 0; e < bytes.size(); e += size) element_from_float(dtype, kNaN, &bytes[e]);
  return bytes;
}

// Row r (all heads) of packed tensor t into row `to` of `dst`, both (rows, H, D) in bshd.
void copy_row(const Packed& t, std::int64_t r, std::vector<std::uint8_t>& dst, std::int64_t to) {
  const std::int64_t row_bytes = t.heads * t.D * fattn::element_size(t.dtype);
  std::memcpy(dst.data() + to * row_bytes, t.bytes.data() + r * row_bytes,
              static_cast<std::size_t>(row_bytes));
}

// The packed keys and values on shuffled pages of `page` keys: (num_blocks, page, Hkv, D),
// two spare pages, the table (B, max_blocks) -1 past each sequence's pages.
struct PagedCache {
  std::int64_t page, blocks = 0, max_blocks = 0, Hkv, D;
  DType dtype;
  std::vector<std::uint8_t> k, v;
  std::vector<std::int32_t> table;
  PagedCache(const Packed& pk, const Packed& pv, const Offsets& cu, std::int64_t page_size,
             std::uint64_t seed)
      : page(page_size), Hkv(pk.heads), D(pk.D), dtype(pk.dtype) {
    const std::int64_t B = cu.batch();
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t n = (cu.k[b + 1] - cu.k[b] + page - 1) / page;
      blocks += n;
      max_blocks = std::max(max_blocks, n);
    }
    max_blocks += 1;  // a column no sequence uses
    blocks += 2;
    std::vector<std::int32_t> order(static_cast<std::size_t>(blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
    k = nan_bytes(blocks * page * Hkv * D, dtype);
    v = nan_bytes(blocks * page * Hkv * D, dtype);
    table.assign(static_cast<std::size_t>(B * max_blocks), -1);
    std::size_t next = 0;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t j = 0; j < cu.k[b + 1] - cu.k[b]; ++j) {
        if (j % page == 0) table[static_cast<std::size_t>(b * max_blocks + j / page)] = order[next++];
        const std::int64_t slot = table[static_cast<std::size_t>(b * max_blocks + j / page)] * page + j % page;
        copy_row(pk, cu.k[b] + j, k, slot);
        copy_row(pv, cu.k[b] + j, v, slot);
      }
  }
  fattn::KvCache cache(const TensorView* seqused) {
    table_view = TensorView::int32_matrix(table.data(), static_cast<std::int64_t>(table.size()) / max_blocks,
                                          max_blocks);
    return {TensorView::bshd(k.data(), blocks, page, Hkv, D, dtype),
            TensorView::bshd(v.data(), blocks, page, Hkv, D, dtype), seqused, &table_view};
  }
  TensorView table_view;
};

// The packed keys with `extra` NaN rows after each sequence's, and their offsets.
struct WidePacked {
  std::vector<std::uint8_t> k, v;
  std::vector<std::int32_t> offsets{0};
  std::int64_t rows = 0;
  WidePacked(const Packed& pk, const Packed& pv, const Offsets& cu, std::int64_t extra) {
    for (std::int64_t b = 0; b < cu.batch(); ++b)
      offsets.push_back(offsets.back() + cu.k[b + 1] - cu.k[b] + static_cast<std::int32_t>(extra));
    rows = offsets.back();
    k = nan_bytes(rows * pk.heads * pk.D, pk.dtype);
    v = nan_bytes(rows * pk.heads * pk.D, pk.dtype);
    for (std::int64_t b = 0; b < cu.batch(); ++b)
      for (std::int64_t j = 0; j < cu.k[b + 1] - cu.k[b]; ++j) {
        copy_row(pk, cu.k[b] + j, k, offsets[static_cast<std::size_t>(b)] + j);
        copy_row(pv, cu.k[b] + j, v, offsets[static_cast<std::size_t>(b)] + j);
      }
  }
};

class VarlenOverCache : public ::testing::TestWithParam<PagedCase> {};

TEST_P(VarlenOverCache, GivesThePackedCallsBits) {
  const PagedCase pc = GetParam();
  const Case& c = pc.c;
  if (!fattn::cpu_supports(c.isa)) GTEST_SKIP() << "isa " << fattn::to_string(c.isa) << " not on this CPU";
  Rng rng(test_seed());
  const Lengths lengths =
      c.waves ? wave_lengths() : c.many ? many_lengths(test_seed())
      : c.long_decode ? long_decode_lengths() : odd_lengths();
  Offsets cu(lengths);
  const std::int64_t B = cu.batch(), total_q = cu.q.back(), total_k = cu.k.back();
  Packed q(total_q, c.Hq, c.D, c.dtype, &rng), k(total_k, c.Hkv, c.D, c.dtype, &rng),
      v(total_k, c.Hkv, c.D, c.dtype, &rng), packed_out(total_q, c.Hq, c.D, c.dtype, nullptr),
      out(total_q, c.Hq, c.D, c.dtype, nullptr);
  std::vector<float> packed_lse(static_cast<std::size_t>(c.Hq * total_q), kNaN), lse = packed_lse;
  const TensorView packed_lse_view = TensorView::lse(packed_lse.data(), 1, c.Hq, total_q);
  const TensorView lse_view = TensorView::lse(lse.data(), 1, c.Hq, total_q);
  Variants variants(c, B, rng);
  const Options options = variants.options(c);
  fattn::attention_varlen(q.view(), k.view(), v.view(), cu.q_view(), cu.k_view(), packed_out.view(),
                          &packed_lse_view, options);

  std::vector<std::int32_t> used;
  for (std::int64_t b = 0; b < B; ++b) used.push_back(cu.k[b + 1] - cu.k[b]);
  const TensorView used_view = TensorView::int32_vector(used.data(), B);
  if (pc.keys == Keys::packed_seqused) {
    WidePacked wide(k, v, cu, 5);
    TensorView wide_k = TensorView::bshd(wide.k.data(), 1, wide.rows, c.Hkv, c.D, c.dtype);
    TensorView wide_v = TensorView::bshd(wide.v.data(), 1, wide.rows, c.Hkv, c.D, c.dtype);
    const TensorView offsets = TensorView::int32_vector(wide.offsets.data(), B + 1);
    fattn::attention_varlen(q.view(), fattn::KvCache{wide_k, wide_v, &used_view, nullptr},
                            cu.q_view(), &offsets, out.view(), &lse_view, options);
  } else {
    PagedCache paged(k, v, cu, pc.page, test_seed() + 1);
    const bool seqused = pc.keys == Keys::pages_seqused;
    const TensorView cu_k = cu.k_view();
    fattn::attention_varlen(q.view(), paged.cache(seqused ? &used_view : nullptr), cu.q_view(),
                            seqused ? nullptr : &cu_k, out.view(), &lse_view, options);
  }
  int shown = 0;
  for (std::int64_t r = 0; r < total_q && shown < 5; ++r)
    for (std::int64_t h = 0; h < c.Hq && shown < 5; ++h)
      for (std::int64_t d = 0; d < c.D && shown < 5; ++d) {
        const double a = out.read(r, h, d), e = packed_out.read(r, h, d);
        if (std::memcmp(&a, &e, sizeof a) != 0)
          ADD_FAILURE() << "out row " << r << " head " << h << " dim " << d << ": " << a
                        << ", the packed call's " << e << (++shown == 5 ? " (first 5 shown)" : "");
      }
  EXPECT_EQ(0, std::memcmp(lse.data(), packed_lse.data(), lse.size() * sizeof(float)))
      << "lse differs from the packed call's";
}

// Every forward case of test_varlen.cpp (every kernel, isa, dtype and variant), the keys on
// pages of 16, 48 and 256 keys in turn, with seqused_k or packed with seqused_k in turn.
std::vector<PagedCase> paged_cases() {
  std::vector<PagedCase> all;
  const std::int64_t pages[3] = {16, 48, 256};
  const Keys keys[3] = {Keys::pages, Keys::pages_seqused, Keys::packed_seqused};
  std::size_t n = 0;
  for (const Case& c : forward_cases()) {
    all.push_back({c, keys[n % 3], pages[(n / 3) % 3]});
    ++n;
  }
  return all;
}
INSTANTIATE_TEST_SUITE_P(Cases, VarlenOverCache, ::testing::ValuesIn(paged_cases()));

std::vector<PagedCase> amx_paged_cases() {
  std::vector<PagedCase> all;
  for (const Case& c : amx_cases()) all.push_back({c, Keys::pages, 32});
  return all;
}
INSTANTIATE_TEST_SUITE_P(Amx, VarlenOverCache, ::testing::ValuesIn(amx_paged_cases()));

TEST(VarlenOverCacheArguments, AreCheckedAndNamed) {
  const std::int64_t H = 2, D = 16, page = 16;
  std::vector<float> q(10 * H * D, 0.5f), k(4 * page * H * D, 0.25f), v = k, out(q.size(), 7.0f);
  const auto qv = TensorView::bshd(q.data(), 1, 10, H, D), ov = TensorView::bshd(out.data(), 1, 10, H, D);
  std::vector<std::int32_t> cq{0, 4, 10}, ck{0, 20, 30}, table{0, 1, 2, -1};
  auto call = [&](std::int64_t page_size, std::vector<std::int32_t>* used, bool with_cu_k,
                  std::int64_t table_rows = 2) {
    const std::int64_t blocks = static_cast<std::int64_t>(k.size()) / (page_size * H * D);
    const TensorView kv = TensorView::bshd(k.data(), blocks, page_size, H, D);
    const TensorView vv = TensorView::bshd(v.data(), blocks, page_size, H, D);
    const TensorView tv = TensorView::int32_matrix(table.data(), table_rows, 4 / table_rows);
    const TensorView uv = used ? TensorView::int32_vector(used->data(), 2) : TensorView{};
    const TensorView cqv = TensorView::int32_vector(cq.data(), 3), ckv = TensorView::int32_vector(ck.data(), 3);
    fattn::attention_varlen(qv, fattn::KvCache{kv, vv, used ? &uv : nullptr, &tv}, cqv,
                            with_cu_k ? &ckv : nullptr, ov, nullptr, {});
  };
  expect_error([&] { call(8, nullptr, true); }, "k.size(2) (block_size, keys per page) must be a multiple of 16");
  expect_error([&] { call(page, nullptr, true, 1); },
               "block_table.size(0) (batch) must equal cu_seqlens_q.size(0) - 1 = 2, got 1");
  expect_error([&] { call(page, nullptr, false); }, "needs cu_seqlens_k or seqused_k");
  std::vector<std::int32_t> too_many{20, 33}, negative{-1, 3};
  expect_error([&] { call(page, &too_many, true); }, "seqused_k[1] must be in [0, 32]");
  expect_error([&] { call(page, &negative, true); }, "seqused_k[0] must be in [0, 32]");
  table = {0, 1, 9, -1};
  expect_error([&] { call(page, nullptr, true); },
               "block_table[1][0] = 9 is outside [0, 4) (k.size(0), the cache's pages), and sequence 1 uses that block");
  table = {0, 1, 2, -1};
  ck = {0, 20, 53};
  expect_error([&] { call(page, nullptr, true); },
               "sequence 1 has 33 keys (cu_seqlens_k[2] - cu_seqlens_k[1]), more than its pages hold");
  ck = {0, 20, 19};
  expect_error([&] { call(page, nullptr, true); }, "cu_seqlens_k[2] must be >= the offset before it, 20, got 19");
  ck = {0, 20, 30};
  call(page, nullptr, true);  // the same arguments, valid: it runs
  for (float& x : out) x = 7.0f;
  // Packed keys with seqused_k: no more than a sequence's rows.
  std::vector<std::int32_t> over{21, 3};
  std::vector<std::int32_t> packed_k{0, 20, 40};
  const TensorView kp = TensorView::bshd(k.data(), 1, 40, H, D), vp = TensorView::bshd(v.data(), 1, 40, H, D);
  const TensorView over_view = TensorView::int32_vector(over.data(), 2);
  const TensorView cqv = TensorView::int32_vector(cq.data(), 3), ckp = TensorView::int32_vector(packed_k.data(), 3);
  expect_error([&] { fattn::attention_varlen(qv, fattn::KvCache{kp, vp, &over_view, nullptr}, cqv, &ckp, ov, nullptr, {}); },
               "seqused_k[0] must be in [0, 20] (its rows in cu_seqlens_k)");
  expect_error([&] { fattn::attention_varlen(qv, fattn::KvCache{kp, vp, &over_view, nullptr}, cqv, nullptr, ov, nullptr, {}); },
               "cu_seqlens_k must be given for keys packed in k and v");
  for (const float x : out) EXPECT_EQ(x, 7.0f);  // nothing written by a call that threw
}

}  // namespace
}  // namespace varlen
}  // namespace fattn_test
