// fattn tests — the decode kernel's software prefetch (src/cpu/decode/prefetch.hpp): the
// cursor asks for every cache line of the next tile's K and V rows, nothing else, each once,
// in the order the rows lie, for every layout a cache comes in (key-major and head-major,
// an item of every kv head or of some, pages, partial tiles, rows that are not a whole
// number of lines), and the units of a phase split the lines in equal shares. The prefetch
// changes no result, so the kernel's tests cannot see a line it forgets.
#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "cpu/decode/prefetch.hpp"

namespace fattn_test {
namespace {

constexpr int kGroups = 6, kKeyGroup = 16;
// The lines asked for, recorded instead of sent to the memory.
struct Recorder {
  std::vector<std::uintptr_t>* lines = nullptr;
  void operator()(const char* at, bool) const {
    if (lines) lines->push_back(reinterpret_cast<std::uintptr_t>(at) / 64);
  }
};
using Prefetch = fattn::cpu::TilePrefetch<kGroups, kKeyGroup, Recorder>;
constexpr std::int64_t kLine = Prefetch::kLineBytes;

// A tile's rows as DecodeOps::Rows holds them (group pointers, strides in elements).
struct Rows {
  const std::uint16_t* group[kGroups]{};
  std::int64_t stride = 0, dim_stride = 1;
};

// One span's rows: for key j < keys and head x < heads, the row at
// group[j / 16] + (j % 16)·stride + x·head_stride elements, row_elements long.
struct Layout {
  std::string name;
  std::int64_t keys, heads, head_stride, stride, row_elements;
  std::vector<std::int64_t> group_at;  // each group's first row, in elements from the base
};
void PrintTo(const Layout& l, std::ostream* os) { *os << l.name; }

std::uintptr_t line_of(const void* at) { return reinterpret_cast<std::uintptr_t>(at) / kLine; }

// The lines a cursor asks for, in order: a line at a time (issue_line), or rows at a time
// and a burst of lines after blocks of scores (issue, issue_after_direct_block, issue_rest),
// as the kernel's score loops mix them.
std::vector<std::uintptr_t> walk(const Prefetch::Span& a, const Prefetch::Span& b,
                                 std::int64_t row_bytes, bool by_lines) {
  std::vector<std::uintptr_t> lines;
  Prefetch p(a, b, row_bytes, true, Recorder{&lines});
  if (by_lines) {
    while (p.next_line()) p.issue_line();
  } else {
    p.spread(7);
    p.issue(3);
    p.issue_after_direct_block();
    p.issue_line();
    p.issue_after_direct_block();
    p.issue_rest();
  }
  return lines;
}

class DecodePrefetch : public ::testing::TestWithParam<Layout> {
 protected:
  // Memory for the rows (64-byte aligned at its start; `shift` elements in) and the span.
  std::vector<std::uint16_t> memory = std::vector<std::uint16_t>(1 << 22);
  const std::uint16_t* base(std::int64_t shift) const {
    const auto at = reinterpret_cast<std::uintptr_t>(memory.data());
    return memory.data() + (kLine - at % kLine) % kLine / 2 + shift;
  }
  Prefetch::Span span(const Layout& l, std::int64_t shift) const {
    Rows r;
    r.stride = l.stride;
    for (int g = 0; g < kGroups; ++g)
      r.group[g] = g * kKeyGroup < l.keys ? base(shift) + l.group_at[static_cast<std::size_t>(g)] : nullptr;
    return Prefetch::span_of(r, l.head_stride, l.heads, l.keys);
  }
  // The cache lines holding a byte of some row, in the order the rows lie in memory.
  std::set<std::uintptr_t> row_lines(const Layout& l, std::int64_t shift) const {
    std::set<std::uintptr_t> lines;
    for (std::int64_t j = 0; j < l.keys; ++j)
      for (std::int64_t x = 0; x < l.heads; ++x) {
        const std::uint16_t* row = base(shift) + l.group_at[static_cast<std::size_t>(j / kKeyGroup)] +
                                   j % kKeyGroup * l.stride + x * l.head_stride;
        for (std::int64_t e = 0; e < l.row_elements; ++e) lines.insert(line_of(row + e));
      }
    return lines;
  }
};

TEST_P(DecodePrefetch, AsksForEveryLineOfTheRowsAndNothingElse) {
  const Layout& l = GetParam();
  for (const std::int64_t shift : {0, 8, 24}) {  // rows starting on a line, and inside one
    SCOPED_TRACE("first row " + std::to_string(shift * 2) + " bytes into a line");
    const Prefetch::Span a = span(l, shift), b = span(l, shift + (1 << 21));
    const Prefetch p(a, b, l.row_elements * 2, true);
    std::set<std::uintptr_t> want = row_lines(l, shift), v = row_lines(l, shift + (1 << 21));
    want.insert(v.begin(), v.end());
    for (const bool by_lines : {true, false}) {
      SCOPED_TRACE(by_lines ? "a line at a time" : "in bursts");
      const std::vector<std::uintptr_t> got = walk(a, b, l.row_elements * 2, by_lines);
      const std::set<std::uintptr_t> asked(got.begin(), got.end());
      EXPECT_EQ(asked, want);
      EXPECT_LE(static_cast<std::int64_t>(got.size()), p.lines());
      if (shift == 0 && l.row_elements * 2 % kLine == 0) {
        // rows of whole lines that start on one: each line once, exactly lines() of them
        EXPECT_EQ(got.size(), asked.size());
        EXPECT_EQ(static_cast<std::int64_t>(got.size()), p.lines());
      }
    }
  }
}

TEST_P(DecodePrefetch, UnitsOfAPhaseAskForEqualSharesInTurn) {
  const Layout& l = GetParam();
  Prefetch p(span(l, 0), span(l, 1 << 21), l.row_elements * 2, false);
  const std::int64_t total = p.lines();
  const bool exact = l.row_elements * 2 % kLine == 0;
  constexpr int kUnits = 3;
  for (int x = 0; x < kUnits; ++x) {  // as a tile's kv heads ask, one after another
    p.share(x, kUnits);
    p.spread(5);
    for (int block = 0; block < 2; ++block) p.issue_after_direct_block();
    p.issue_rest();
    std::int64_t left = 0;  // lines a copy of the cursor still asks for
    for (Prefetch rest = p; rest.next_line(); rest.issue_line()) ++left;
    const std::int64_t share_end = total * (x + 1) / kUnits;  // unit x stops there
    if (exact)
      EXPECT_EQ(left, total - share_end) << "unit " << x;
    else
      EXPECT_LE(left, total - share_end) << "unit " << x;
  }
  EXPECT_EQ(p.next_line(), nullptr);  // the last unit's share ends the walk
}

TEST(DecodePrefetchEmpty, AsksForNothing) {
  Prefetch none;
  EXPECT_EQ(none.next_line(), nullptr);
  EXPECT_EQ(none.lines(), 0);
  none.issue_line();
  none.issue(4);
  none.issue_rest();
  EXPECT_EQ(none.next_line(), nullptr);
}

// Group starts for a contiguous tile (group g at g·16 keys) or for pages given by number.
std::vector<std::int64_t> contiguous(std::int64_t stride) {
  std::vector<std::int64_t> at;
  for (int g = 0; g < kGroups; ++g) at.push_back(g * kKeyGroup * stride);
  return at;
}
std::vector<std::int64_t> pages(std::int64_t page_elements, std::vector<std::int64_t> order) {
  for (auto& page : order) page *= page_elements;
  return order;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DecodePrefetch,
    ::testing::Values(
        // (B, S, Hkv, D) float16, D 128, an item of all 8 kv heads: each key group one run
        Layout{"bshd_every_head", 96, 8, 128, 8 * 128, 128, contiguous(8 * 128)},
        // ... of kv heads 2-4 only: a run per key
        Layout{"bshd_some_heads", 96, 3, 128, 8 * 128, 128, contiguous(8 * 128)},
        // (B, Hkv, S, D): head by head, each head's 16 keys one run
        Layout{"bhsd", 96, 4, 4096 * 64, 64, 64, contiguous(64)},
        // 16-key pages in shuffled order, 8 heads, D 64
        Layout{"pages_16", 96, 8, 64, 8 * 64, 64, pages(16 * 8 * 64, {7, 2, 11, 0, 5, 9})},
        // a partial tile: 40 keys (groups 0-2, the third half full; the rest unset)
        Layout{"partial_tile", 40, 2, 128, 2 * 128, 128, contiguous(2 * 128)},
        // rows of 48 elements (96 bytes, not a whole number of lines), heads end to end
        Layout{"rows_of_96_bytes", 96, 2, 48, 2 * 48, 48, contiguous(2 * 48)},
        // padded rows: a key's heads 80 elements apart, rows 48 long, keys 200 apart
        Layout{"padded_rows", 96, 2, 80, 200, 48, contiguous(200)},
        // one head, one key
        Layout{"one_row", 1, 1, 128, 128, 128, contiguous(128)}),
    [](const ::testing::TestParamInfo<Layout>& info) { return info.param.name; });

}  // namespace
}  // namespace fattn_test
