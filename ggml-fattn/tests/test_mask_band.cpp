// ggml-fattn tests — read_mask: the keys a mask shows and the band it is exactly.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "mask_band.hpp"

namespace {

using ggml_fattn::MaskBand;
using ggml_fattn::read_mask;

constexpr std::uint16_t kHidden = 0xFC00, kZero = 0x0000, kOne = 0x3C00;

// rows × keys, row i seeing keys [begin(i), end(i)) with value `value`, the rest hidden.
template <class Begin, class End>
std::vector<std::uint16_t> runs(std::int64_t rows, std::int64_t keys, Begin begin, End end,
                                std::uint16_t value = kZero) {
  std::vector<std::uint16_t> m(static_cast<std::size_t>(rows * keys), kHidden);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = begin(i); j < end(i); ++j) m[static_cast<std::size_t>(i * keys + j)] = value;
  return m;
}

TEST(MaskBand, CausalWithUnusedCells) {  // 5 queries at positions 100..104 of 256 cells
  const auto m = runs(5, 256, [](auto) { return 0; }, [](auto i) { return 101 + i; });
  const MaskBand b = read_mask(m.data(), 5, 256, 256);
  EXPECT_EQ(b.first, 0);
  EXPECT_EQ(b.end, 105);
  EXPECT_TRUE(b.is_band);
  EXPECT_EQ(b.window_left, -1);
}

TEST(MaskBand, SlidingWindow) {  // window of 8 keys ending at the query: rows 0.. start at 0
  const auto m = runs(20, 64, [](auto i) { return i + 3 < 7 ? 0 : i + 3 - 7; },
                      [](auto i) { return i + 4; });
  const MaskBand b = read_mask(m.data(), 20, 64, 64);
  EXPECT_TRUE(b.is_band);
  EXPECT_EQ(b.first, 0);
  EXPECT_EQ(b.end, 23);
  EXPECT_EQ(b.window_left, 7);
}

TEST(MaskBand, WindowPastTheFirstKeysDropsThem) {
  const auto m = runs(4, 300, [](auto i) { return 200 + i; }, [](auto i) { return 250 + i; });
  const MaskBand b = read_mask(m.data(), 4, 300, 300);
  EXPECT_TRUE(b.is_band);
  EXPECT_EQ(b.first, 200);
  EXPECT_EQ(b.end, 253);
  EXPECT_EQ(b.window_left, 49);
}

TEST(MaskBand, WhatIsNoBand) {
  // a value that is not 0 (ALiBi's distances)
  auto m = runs(3, 32, [](auto) { return 0; }, [](auto i) { return 30 + i; }, kOne);
  EXPECT_FALSE(read_mask(m.data(), 3, 32, 32).is_band);
  // a hole inside a row's run (another sequence's cell)
  m = runs(3, 32, [](auto) { return 0; }, [](auto i) { return 30 + i; });
  m[1 * 32 + 10] = kHidden;
  MaskBand b = read_mask(m.data(), 3, 32, 32);
  EXPECT_FALSE(b.is_band);
  EXPECT_EQ(b.end, 32);
  // rows whose ends do not step by one (not causal)
  m = runs(3, 32, [](auto) { return 0; }, [](auto) { return 20; });
  EXPECT_FALSE(read_mask(m.data(), 3, 32, 32).is_band);
  // a row that sees nothing
  m = runs(3, 32, [](auto) { return 0; }, [](auto i) { return i == 1 ? 0 : 30 + i; });
  b = read_mask(m.data(), 3, 32, 32);
  EXPECT_FALSE(b.is_band);
  EXPECT_EQ(b.first, 0);
  EXPECT_EQ(b.end, 32);
  // windows of two widths
  m = runs(3, 32, [](auto i) { return i == 2 ? 25 : 20 + i; }, [](auto i) { return 30 + i; });
  EXPECT_FALSE(read_mask(m.data(), 3, 32, 32).is_band);
}

TEST(MaskBand, NothingVisible) {
  const std::vector<std::uint16_t> m(4 * 16, kHidden);
  const MaskBand b = read_mask(m.data(), 4, 16, 16);
  EXPECT_LE(b.end, b.first);
  EXPECT_FALSE(b.is_band);
}

TEST(MaskBand, RowStrideSkipsPadding) {  // rows 32 apart, the keys 20 of them
  std::vector<std::uint16_t> m(static_cast<std::size_t>(2 * 32), kOne);  // padding: not a band's
  for (std::int64_t i = 0; i < 2; ++i)
    for (std::int64_t j = 0; j < 20; ++j) m[static_cast<std::size_t>(i * 32 + j)] = j <= 18 + i ? kZero : kHidden;
  const MaskBand b = read_mask(m.data(), 2, 20, 32);
  EXPECT_TRUE(b.is_band);
  EXPECT_EQ(b.end, 20);
}

}  // namespace
