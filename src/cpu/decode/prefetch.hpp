// fattn — the decode kernel's software prefetch: the lines of the rows a worker reads next
// (the next key tile's K and V rows of its kv heads), asked of the memory a few at a time
// between blocks of the current tile's compute, so the loads of one tile overlap the
// arithmetic of the one before. Without it a core computed, then waited for the hardware
// prefetchers, which do not follow 64-192 rows 4 KiB apart (decode, Sk = 64k: 23 → 31
// GB/s, docs/perf-log.md).
//
// The rows come as up to two spans (K's, then V's), each the rows of some kv heads over
// some keys, asked for in the order they lie in memory (a (B, S, Hkv, D) cache: key by key,
// every head of a key). A cursor walks them as runs of contiguous bytes, a line at a time:
// rows that lie end to end (a key's heads in a (B, S, Hkv, D) cache; a 16-key group of
// every head, contiguous or on one page) are one run, so asking for a line is a prefetch
// and a pointer step. Walking row by row (a key group's pointer, the key's and the head's
// offsets, for every row) cost 27-30 cycles a key at GQA 4, D 128 — a fifth of the tile's
// time with the cache in L2, the prefetch instructions themselves almost nothing of it
// (dev-zen4, docs/perf-log.md 2026-12-08).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>

namespace fattn::cpu {

// A line asked of the memory, into L2 (PREFETCHT1) or L1 (PREFETCHT0); a hint must be a
// constant: two calls.
struct PrefetchHint {
  [[gnu::always_inline]] void operator()(const char* at, bool to_l2) const {
    if (to_l2)
      __builtin_prefetch(at, 0, 2);
    else
      __builtin_prefetch(at, 0, 3);
  }
};

// kGroups key groups of kKeyGroup keys a tile (DecodeOps: a group's rows are a pointer
// step apart, a page holds whole groups). Hint asks for a line (tests record them).
template <int kGroups, int kKeyGroup, class Hint = PrefetchHint>
struct TilePrefetch {
  static constexpr std::int64_t kLineBytes = 64;
  // Rows asked for after each 16×16 block of the transpose: 2 rows (32.5 GB/s), 4 (30.6),
  // 8 (30.1), 16 (27.0); the rows left a line per dim of the scores (issue_line).
  static constexpr std::int64_t kRowsPerBlock = 2;
  // ... and after each block of direct scores (cpu/decode/direct.hpp, direct_avx2.hpp)
  // an equal part of the unit's share (spread). A fixed 32 lines a block left half of a
  // float32 share (8 lines a row) to one burst at the scores' end: spread evenly, decode
  // (B 1 and 8, Hq 32, Hkv 8, D 128, 8k-32k keys, 2 threads, dev-zen4) read 85 → 93 % and
  // 76 → 82 % of a read stream over the same memory; bfloat16 (4 lines a row, which the
  // fixed pace already spread) 88 → 86 % (docs/perf-log.md, 2026-12-06).

  // Rows [0, keys) of `heads` kv heads of K or V, as bytes: head x's row j at
  // group[j / kKeyGroup] + (j % kKeyGroup)·stride + x·head_bytes, row_bytes each; key by
  // key where a key's heads lie closer together than a head's keys, else head by head.
  struct Span {
    const char* group[kGroups]{};
    std::int64_t stride = 0, head_bytes = 0, heads = 0, keys = 0;
    bool keys_outer = true;
  };
  // rows: a tile's rows (DecodeOps::Rows: group pointers, stride in elements).
  template <class Rows>
  static Span span_of(const Rows& rows, std::int64_t head_stride, std::int64_t heads,
                      std::int64_t keys) {
    constexpr auto kElement = static_cast<std::int64_t>(sizeof(*rows.group[0]));
    Span s{{}, rows.stride * kElement, head_stride * kElement, heads, keys,
           std::abs(head_stride) < std::abs(rows.stride)};
    for (int g = 0; g < kGroups; ++g) s.group[g] = reinterpret_cast<const char*>(rows.group[g]);
    return s;
  }

  TilePrefetch() = default;
  TilePrefetch(const Span& a, const Span& b, std::int64_t bytes_per_row, bool into_l2,
               Hint hint = {})
      : spans_{a, b}, hint_(hint), row_bytes_(bytes_per_row),
        lines_per_row_((bytes_per_row + kLineBytes - 1) / kLineBytes), to_l2_(into_l2) {
    // The lines of a run from the line its first byte lies in: where a run may start
    // inside a line, one more than its bytes fill (a bound the walk may stop short of).
    for (const Span& s : spans_)
      for (int g = 0; g < kGroups; ++g) {
        const Group r = group_runs(s, g);
        const bool aligned = offset_in_line(r.first) == 0 && r.outer_stride % kLineBytes == 0 &&
                             r.inner_stride % kLineBytes == 0;
        total_ += r.outer * r.inner * ((r.bytes + kLineBytes - 1) / kLineBytes + (aligned ? 0 : 1));
      }
    quota_ = total_;
    span_ = 0;
    group_ = -1;
    next_group();
  }

  // The units of a phase ask for equal shares: unit x of n stops at (x + 1)/n of the lines.
  void share(int x, int n) { quota_ = total_ * (x + 1) / n; }
  void issue(std::int64_t rows) { issue_lines(rows * lines_per_row_); }
  // One line: called once per dim of a score block, so the lines go out evenly among the
  // FMAs. In bursts (a block's share at once) the core stalled on full miss buffers: Sq =
  // 16, query lanes, 6 % of the samples on the burst's loop; evenly, 348-355 → 388
  // GFLOP/s; Sq = 4, key lanes, 166-181 → 184-195 (docs/perf-log.md, "query rows along the
  // lanes").
  [[gnu::always_inline]] void issue_line() {
    if (done_ >= total_ || !at_) return;
    line(at_);
    ++done_;
    if ((at_ += kLineBytes) >= end_) next_run();
  }
  void issue_rest() { issue_lines(quota_ - done_); }
  // The rest of the unit's share over its next `blocks` blocks of direct scores.
  void spread(std::int64_t blocks) {
    const std::int64_t left = quota_ - done_, n = std::max<std::int64_t>(blocks, 1);
    lines_per_direct_block_ = std::max<std::int64_t>(1, (left + n - 1) / n);
  }
  void issue_after_direct_block() { issue_lines(lines_per_direct_block_); }

  // The next line the cursor asks for (null when every line was asked for) and the lines
  // to ask for (exact where every run starts on a line, else a bound): what a test reads
  // to check that every line of the rows is asked for once.
  const char* next_line() const { return done_ < total_ ? at_ : nullptr; }
  std::int64_t lines() const { return total_; }

 private:
  // A group's rows as `outer` × `inner` runs of `bytes` each, run (o, i) at
  // first + o·outer_stride + i·inner_stride: rows end to end along the inner order merge
  // into one run, and inner runs end to end along the outer order into one.
  struct Group {
    const char* first = nullptr;
    std::int64_t outer = 0, inner = 0, outer_stride = 0, inner_stride = 0, bytes = 0;
  };
  Group group_runs(const Span& s, int g) const {
    const std::int64_t keys = std::clamp<std::int64_t>(s.keys - g * kKeyGroup, 0, kKeyGroup);
    if (keys == 0 || s.heads == 0) return {};
    Group r{s.group[g], keys, s.heads, s.stride, s.head_bytes, row_bytes_};
    if (!s.keys_outer) std::swap(r.outer, r.inner), std::swap(r.outer_stride, r.inner_stride);
    if (r.inner == 1 || r.inner_stride == row_bytes_) {  // one run along the inner order
      r.bytes = r.inner * row_bytes_;
      r.inner = 1;
      if (r.outer == 1 || r.outer_stride == r.bytes) r.bytes *= r.outer, r.outer = 1;
    }
    return r;
  }
  // The first run of the next group that holds rows (of this span, then the next).
  void next_group() {
    for (;;) {
      if (++group_ >= kGroups) {
        if (++span_ >= 2) {
          at_ = end_ = nullptr;
          return;
        }
        group_ = 0;
      }
      runs_ = group_runs(spans_[span_], group_);
      if (runs_.outer > 0) break;
    }
    outer_ = inner_ = 0;
    start_run();
  }
  static std::int64_t offset_in_line(const char* at) {
    return static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(at) % kLineBytes);
  }
  void start_run() {
    const char* first = runs_.first + outer_ * runs_.outer_stride + inner_ * runs_.inner_stride;
    at_ = first - offset_in_line(first);  // the line the run's first byte lies in
    end_ = first + runs_.bytes;
  }
  void next_run() {
    if (++inner_ < runs_.inner) return start_run();
    inner_ = 0;
    if (++outer_ < runs_.outer) return start_run();
    next_group();
  }
  [[gnu::always_inline]] void line(const char* at) const { hint_(at, to_l2_); }
  void issue_lines(std::int64_t n) {
    n = std::min(n, total_ - done_);
    done_ += std::max<std::int64_t>(n, 0);
    while (n > 0 && at_) {
      const std::int64_t in_run = std::min(n, (end_ - at_ + kLineBytes - 1) / kLineBytes);
      for (std::int64_t x = 0; x < in_run; ++x) line(at_ + x * kLineBytes);
      at_ += in_run * kLineBytes;
      n -= in_run;
      if (at_ >= end_) next_run();
    }
  }

  Span spans_[2]{};
  [[no_unique_address]] Hint hint_{};
  std::int64_t row_bytes_ = 0, lines_per_row_ = 0, total_ = 0, done_ = 0, quota_ = 0;
  std::int64_t lines_per_direct_block_ = 1;
  bool to_l2_ = false;  // PREFETCHT1 (L2) rather than PREFETCHT0 (L1): the level asked
  int span_ = 2, group_ = kGroups;
  Group runs_{};
  std::int64_t outer_ = 0, inner_ = 0;
  const char *at_ = nullptr, *end_ = nullptr;
};

}  // namespace fattn::cpu
