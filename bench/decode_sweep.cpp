// fattn-bench --decode (see decode_sweep.hpp).
#include "decode_sweep.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <random>
#include <numeric>
#include <limits>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "accuracy.hpp"
#include "fattn/kv_cache.hpp"
#include "inputs.hpp"
#include "read_bandwidth.hpp"
#include "report.hpp"
#include "timing.hpp"

namespace fattn_bench {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Cheap N(0, 1)-like values (sum of four uniforms, scaled), never zero: gigabytes of
// cache are filled in a second, where std::normal_distribution takes tens.
void fill_random(std::vector<float>& values, std::uint64_t seed) {
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& x : values) {
    float sum = 0.0f;
    for (int n = 0; n < 4; ++n) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;  // xorshift64
      sum += static_cast<float>(state >> 40) * (1.0f / 16777216.0f);
    }
    x = (sum - 2.0f) * 1.7320508f + 1e-6f;  // variance of a sum of 4 uniforms is 1/3
  }
}

// Bytes of n values of a cache of `dtype` (q8_0: blocks of 32 values in 34 bytes).
std::int64_t cache_bytes(std::int64_t n, fattn::DType dtype) {
  return dtype == fattn::DType::q8_0 ? fattn::q8_0_row_bytes(n) : n * fattn::element_size(dtype);
}

// One tensor of the problem in (B, S, H, D) memory, FlashAttention's layout: float32
// values, or only their 16-bit bits or q8_0 blocks (gigabytes of cache).
struct Stored {
  std::vector<float> values;
  std::vector<std::uint16_t> bits;
  std::vector<std::uint8_t> blocks;
  fattn::TensorView view;

  void allocate(std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D, fattn::DType dtype) {
    const auto count = static_cast<std::size_t>(B * S * H * D);
    const bool wide = dtype == fattn::DType::float32, q8_0 = dtype == fattn::DType::q8_0;
    values.assign(wide ? count : 0, 0.0f);
    bits.assign(wide || q8_0 ? 0 : count, 0);
    blocks.assign(q8_0 ? static_cast<std::size_t>(cache_bytes(B * S * H * D, dtype)) : 0, 0);
    void* data = wide ? static_cast<void*>(values.data())
                      : q8_0 ? static_cast<void*>(blocks.data()) : static_cast<void*>(bits.data());
    view = fattn::TensorView::bshd(data, B, S, H, D, dtype);
  }

  // Random values (fill_random), rounded to the dtype (q8_0: quantized row by row).
  void fill(std::uint64_t seed) {
    if (view.dtype == fattn::DType::float32) return fill_random(values, seed);
    if (view.dtype == fattn::DType::q8_0) {
      std::vector<float> drawn(blocks.size() / fattn::kQ8_0BlockBytes * fattn::kQ8_0BlockValues);
      fill_random(drawn, seed);
      return fattn::quantize_q8_0(drawn.data(), static_cast<std::int64_t>(drawn.size()), blocks.data());
    }
    std::vector<float> drawn(bits.size());
    fill_random(drawn, seed);
    std::transform(drawn.begin(), drawn.end(), bits.begin(),
                   [dtype = view.dtype](float x) { return fattn::to_16bit(x, dtype); });
  }

  // NaN everywhere, so an element the kernel fails to write shows in the error.
  void poison() {
    std::fill(values.begin(), values.end(), std::nanf(""));
    std::fill(bits.begin(), bits.end(), kNaN16);
  }

  float at(std::int64_t e) const {
    const auto i = static_cast<std::size_t>(e);
    if (view.dtype == fattn::DType::q8_0) {  // value d·q of its block (rows of D values)
      const std::int64_t D = view.size(3), d = e % D;
      const std::uint8_t* block = blocks.data() + (e / D) * fattn::q8_0_row_bytes(D) +
                                  d / fattn::kQ8_0BlockValues * fattn::kQ8_0BlockBytes;
      std::uint16_t scale;
      std::memcpy(&scale, block, sizeof scale);
      const auto q = static_cast<std::int8_t>(block[sizeof scale + d % fattn::kQ8_0BlockValues]);
      return fattn::from_16bit(scale, fattn::DType::float16) * static_cast<float>(q);
    }
    return view.dtype == fattn::DType::float32 ? values[i] : fattn::from_16bit(bits[i], view.dtype);
  }
};

struct Problem {
  std::int64_t B, Hq, Hkv, D, Sq, Sk;
  Stored q, k, v, out;
  // A paged cache: k and v (B·Sk/page pages, page, Hkv, D), sequence b's key j on page
  // table[b][j / page]; page 0: k and v (B, Sk, Hkv, D).
  std::int64_t page = 0;
  std::vector<std::int32_t> table;
  fattn::TensorView table_view;

  // The cache's memory as the (B, Sk, Hkv, D) tensor a contiguous cache would be (shapes for
  // the plan and the working-memory count; a paged cache's keys are not in this order).
  fattn::TensorView contiguous(const Stored& t) const {
    return fattn::TensorView::bshd(t.view.data, B, Sk, Hkv, D, t.view.dtype);
  }
  // Element d of key j of kv head h of sequence b.
  float kv_at(const Stored& t, std::int64_t b, std::int64_t j, std::int64_t h, std::int64_t d) const {
    const std::int64_t row = page ? table[static_cast<std::size_t>(b * (Sk / page) + j / page)] * page + j % page
                                  : b * Sk + j;
    return t.at((row * Hkv + h) * D + d);
  }
};

// Sequence b's keys on pages in a shuffled order (a serving engine's cache after a while).
void page_the_cache(Problem& p, std::uint64_t seed) {
  const std::int64_t pages = p.B * (p.Sk / p.page);
  p.table.resize(static_cast<std::size_t>(pages));
  std::iota(p.table.begin(), p.table.end(), 0);
  std::shuffle(p.table.begin(), p.table.end(), std::mt19937_64(seed));
  p.table_view = fattn::TensorView::int32_matrix(p.table.data(), p.B, p.Sk / p.page);
}

// Row (b, h, i) of the output in float64, from the cache element by element (any layout).
void reference_row(const Problem& p, double scale, std::int64_t b, std::int64_t h, std::int64_t i,
                   double* row) {
  const std::int64_t hk = h / (p.Hq / p.Hkv), keys = p.Sk - p.Sq + i + 1;  // bottom-right
  std::vector<double> s(static_cast<std::size_t>(keys));
  double m = -std::numeric_limits<double>::infinity();
  for (std::int64_t j = 0; j < keys; ++j) {
    double dot = 0.0;
    for (std::int64_t d = 0; d < p.D; ++d)
      dot += static_cast<double>(p.q.at(((b * p.Sq + i) * p.Hq + h) * p.D + d)) * p.kv_at(p.k, b, j, hk, d);
    s[static_cast<std::size_t>(j)] = dot * scale;
    m = std::max(m, dot * scale);
  }
  double l = 0.0;
  std::fill(row, row + p.D, 0.0);
  for (std::int64_t j = 0; j < keys; ++j) {
    const double w = std::exp(s[static_cast<std::size_t>(j)] - m);
    l += w;
    for (std::int64_t d = 0; d < p.D; ++d) row[d] += w * p.kv_at(p.v, b, j, hk, d);
  }
  for (std::int64_t d = 0; d < p.D; ++d) row[d] /= l;
}

double sampled_error(const Problem& p, const fattn::Options& options) {
  double err = 0.0;
  std::vector<double> row(static_cast<std::size_t>(p.D));
  const std::int64_t samples[][3] = {{0, 0, p.Sq - 1}, {p.B - 1, p.Hq - 1, 0}, {p.B / 2, p.Hq / 2, p.Sq / 2}};
  for (const auto& s : samples) {
    if (p.page)
      reference_row(p, 1.0 / std::sqrt(static_cast<double>(p.D)), s[0], s[1], s[2], row.data());
    else
      fattn::reference_row(p.q.view, p.k.view, p.v.view, options, s[0], s[1], s[2], row.data());
    const std::int64_t first = ((s[0] * p.Sq + s[2]) * p.Hq + s[1]) * p.D;
    for (std::int64_t d = 0; d < p.D; ++d)
      err = worse(err, p.out.at(first + d), row[static_cast<std::size_t>(d)]);
  }
  return err;
}

DecodeResult measure(const DecodeConfig& c, const Ceilings& ceilings, Problem& p, fattn::Impl impl,
                     int prefetch_tiles, int prefetch_level, int kv_splits) {
  fattn::Options options;
  options.decode_prefetch_tiles = prefetch_tiles;
  options.decode_prefetch_level = prefetch_level;
  options.kv_splits = kv_splits;
  options.causal = fattn::Causal::bottom_right;
  options.impl = impl;
  options.isa = c.isa;
  options.num_threads = c.threads;
  const fattn::KvCache paged{p.k.view, p.v.view, nullptr, &p.table_view};
  auto decode = [&] {
    if (p.page) return fattn::attention_kvcache(p.q.view, paged, nullptr, nullptr, p.out.view, nullptr, options);
    fattn::attention_forward(p.q.view, p.k.view, p.v.view, p.out.view, nullptr, options);
  };
  const std::int64_t cache_bytes_each = cache_bytes(p.B * p.Hkv * p.Sk * p.D, p.k.view.dtype);
  const std::vector<Region> cache{{p.k.view.data, cache_bytes_each}, {p.v.view.data, cache_bytes_each}};
  std::int64_t cache_read_bytes = 0;
  auto read_cache = [&] { cache_read_bytes = read_regions_once(c.read_isa, c.threads, cache); };
  // The decode and the read stream over its cache in turn, run by run: on a shared machine
  // both see the same phases of the memory's speed.
  for (int i = 0; i < c.warmup; ++i) decode(), read_cache();
  std::vector<double> decode_ms, read_ms;
  for (int i = 0; i < c.reps; ++i) {
    decode_ms.push_back(milliseconds(decode));
    read_ms.push_back(milliseconds(read_cache));
  }
  const Timing t{median(decode_ms), *std::min_element(decode_ms.begin(), decode_ms.end()),
                 *std::max_element(decode_ms.begin(), decode_ms.end())};
  DecodeResult r;
  r.impl = impl;
  r.dtype = c.dtype;
  r.batch = p.B, r.q_heads = p.Hq, r.kv_heads = p.Hkv, r.head_dim = p.D, r.q_len = p.Sq, r.kv_len = p.Sk;
  r.page = p.page;
  r.prefetch_tiles_asked = prefetch_tiles, r.prefetch_level_asked = prefetch_level;
  r.kv_splits_asked = kv_splits;
  r.ms_median = t.median_ms, r.ms_min = t.min_ms, r.ms_max = t.max_ms;
  r.kv_bytes = 2 * cache_bytes(p.B * p.Hkv * p.Sk * p.D, p.k.view.dtype);
  constexpr double kGigaPerMilli = 1e-6;
  r.gbs = static_cast<double>(r.kv_bytes) / t.median_ms * kGigaPerMilli;
  r.pct_read_bandwidth = 100.0 * r.gbs / ceilings.read_bandwidth_gbs;
  r.pct_bandwidth = 100.0 * r.gbs / ceilings.bandwidth_gbs;
  r.cache_read_gbs = static_cast<double>(cache_read_bytes) / median(read_ms) * kGigaPerMilli;
  r.pct_cache_read = 100.0 * r.gbs / r.cache_read_gbs;
  std::int64_t pairs = 0;  // bottom-right causal: query i sees Sk − Sq + i + 1 keys
  for (std::int64_t i = 0; i < p.Sq; ++i) pairs += std::clamp<std::int64_t>(p.Sk - p.Sq + i + 1, 0, p.Sk);
  r.flops = 4 * p.B * p.Hq * pairs * p.D;
  r.gflops = static_cast<double>(r.flops) / t.median_ms * kGigaPerMilli;
  r.pct_fma_peak = 100.0 * r.gflops / ceilings.fma_peak_gflops;
  const fattn::TensorView k = p.contiguous(p.k), v = p.contiguous(p.v);
  const fattn::ForwardPlan plan = p.page ? fattn::kvcache_plan(p.q.view, paged, nullptr, options)
                                          : fattn::forward_plan(p.q.view, k, v, options);
  r.plan = plan.decode;
  const Roof roof = roof_for(plan, ceilings);
  r.roof = roof.name;
  r.pct_roof = 100.0 * r.gflops / roof.gflops;
  r.extra_bytes = p.page ? fattn::kvcache_extra_bytes(p.q.view, paged, nullptr, options)
                         : fattn::extra_bytes(p.q.view, k, v, options);
  r.max_abs_err = sampled_error(p, options);
  return r;
}

}  // namespace

std::vector<DecodeResult> run_decode_sweep(const DecodeConfig& c, const Ceilings& ceilings) {
  std::vector<DecodeResult> results;
  for (std::int64_t B : c.batches)
    for (std::int64_t Hkv : c.kv_heads)
      for (std::int64_t D : c.head_dims)
        for (std::int64_t Sk : c.kv_lens) {
          const fattn::DType cache = c.dtype;
          // A q8_0 cache is read with float32 queries and output.
          const fattn::DType rows = cache == fattn::DType::q8_0 ? fattn::DType::float32 : cache;
          const double kv_gib = 2.0 * static_cast<double>(cache_bytes(B * Hkv * Sk * D, cache)) / kGiB;
          if (kv_gib > c.max_kv_gib) {
            std::fprintf(stderr, "skipping B=%lld Hkv=%lld D=%lld Sk=%lld: K+V %.1f GiB > --max-kv-gib\n",
                         static_cast<long long>(B), static_cast<long long>(Hkv),
                         static_cast<long long>(D), static_cast<long long>(Sk), kv_gib);
            continue;
          }
          if (c.page && Sk % c.page != 0) {
            std::fprintf(stderr, "skipping Sk=%lld: not a whole number of pages of %lld keys\n",
                         static_cast<long long>(Sk), static_cast<long long>(c.page));
            continue;
          }
          Problem p{B, c.q_heads, Hkv, D, 0, Sk};
          p.page = c.page;
          if (p.page) {  // pages of `page` keys, as many as the contiguous cache's keys
            p.k.allocate(B * Sk / p.page, p.page, Hkv, D, cache);
            p.v.allocate(B * Sk / p.page, p.page, Hkv, D, cache);
            page_the_cache(p, c.seed + 4);
          } else {
            p.k.allocate(B, Sk, Hkv, D, cache);
            p.v.allocate(B, Sk, Hkv, D, cache);
          }
          p.k.fill(c.seed + 1);
          p.v.fill(c.seed + 2);
          for (std::int64_t Sq : c.q_lens) {
            p.Sq = Sq;
            p.q.allocate(B, Sq, c.q_heads, D, rows);
            p.q.fill(c.seed + 3);
            p.out.allocate(B, Sq, c.q_heads, D, rows);
            p.out.poison();
            for (fattn::Impl impl : c.impls) {
              if (impl == fattn::Impl::fused && (Sk > c.fused_max_keys || p.page)) continue;
              std::fprintf(stderr, "B=%lld Hkv=%lld D=%lld Sq=%lld Sk=%lld %s ...\n",
                           static_cast<long long>(B), static_cast<long long>(Hkv),
                           static_cast<long long>(D), static_cast<long long>(Sq),
                           static_cast<long long>(Sk), fattn::to_string(impl));
              if (impl != fattn::Impl::decode) {  // the schedule options are the decode kernel's
                const fattn::Options defaults;
                results.push_back(measure(c, ceilings, p, impl, defaults.decode_prefetch_tiles,
                                          defaults.decode_prefetch_level, defaults.kv_splits));
                continue;
              }
              for (int prefetch_tiles : c.prefetch_tiles)
                for (int prefetch_level : c.prefetch_levels)
                  for (int kv_splits : c.kv_splits)
                    results.push_back(
                        measure(c, ceilings, p, impl, prefetch_tiles, prefetch_level, kv_splits));
            }
          }
        }
  return results;
}

void print_decode_table(std::FILE* out, const Machine& m, const std::vector<DecodeResult>& results) {
  std::fprintf(out,
               "\nDecode sweep: %s, Hq=%lld, causal bottom-right, %s, %d threads; "
               "DRAM read bandwidth %.1f GB/s (1 thread %.1f), triad %.1f GB/s, FMA peak %.0f "
               "GFLOP/s, bf16 dot peak %.0f GFLOP/s (0: none; same run)\n",
               results.empty() ? "-" : fattn::to_string(results.front().dtype),
               results.empty() ? 0LL : static_cast<long long>(results.front().q_heads),
               results.empty() || !results.front().page
                   ? "(B, S, H, D) cache"
                   : ("paged cache, shuffled pages of " + std::to_string(results.front().page) + " keys").c_str(),
               m.ceilings.threads, m.ceilings.read_bandwidth_gbs,
               m.ceilings.read_bandwidth_one_thread_gbs, m.ceilings.bandwidth_gbs,
               m.ceilings.fma_peak_gflops, m.ceilings.bf16_dot_peak_gflops);
  // % read: of the read bandwidth on all threads, decode's roof (best of 5 over a fresh
  // buffer); cache GB/s: a read stream over the point's own K and V, its runs alternated
  // with the decode's (medians), and % cache: the decode's share of it; % triad: of the triad.
  // % peak: of the peak of the instructions the kernel runs ("dot": VDPBF16PS).
  print_table_header(out, {"B", "Hkv", "D", "Sq", "Sk", "K+V MiB", "decode ms", "GB/s", "% read",
                           "cache GB/s", "% cache", "% triad", "GFLOP/s", "% peak", "extra KiB", "fused ms", "fused/decode",
                           "max err", "plan: scores, kv heads an item, key chunks, prefetch tiles"});
  for (const DecodeResult& r : results) {
    if (r.impl != fattn::Impl::decode) continue;
    const DecodeResult* fused = nullptr;
    for (const DecodeResult& f : results)
      if (f.impl == fattn::Impl::fused && f.batch == r.batch && f.kv_heads == r.kv_heads &&
          f.head_dim == r.head_dim && f.q_len == r.q_len && f.kv_len == r.kv_len)
        fused = &f;
    char fused_ms[32] = "-", ratio[32] = "-";
    if (fused) {
      std::snprintf(fused_ms, sizeof fused_ms, "%.3f", fused->ms_median);
      std::snprintf(ratio, sizeof ratio, "%.2fx", fused->ms_median / r.ms_median);
    }
    std::fprintf(out,
                 "| %lld | %lld | %lld | %lld | %lld | %.0f | %.3f | %.1f | %.0f %% | %.1f | %.0f %% | "
                 "%.0f %% | %.0f | %.0f %%%s | %.0f | %s | %s | %.1e | %s, %lld, %lld, %d%s |\n",
                 static_cast<long long>(r.batch), static_cast<long long>(r.kv_heads),
                 static_cast<long long>(r.head_dim), static_cast<long long>(r.q_len),
                 static_cast<long long>(r.kv_len), static_cast<double>(r.kv_bytes) / (1 << 20),
                 r.ms_median, r.gbs, r.pct_read_bandwidth, r.cache_read_gbs, r.pct_cache_read,
                 r.pct_bandwidth, r.gflops, r.pct_roof,
                 roof_mark(r.roof), static_cast<double>(r.extra_bytes) / 1024, fused_ms, ratio,
                 r.max_abs_err, r.plan.scores.c_str(), static_cast<long long>(r.plan.heads_per_item),
                 static_cast<long long>(r.plan.splits), r.plan.prefetch_tiles,
                 r.plan.reads_in_place ? "" : ", staged");
  }
}

void write_decode_json(const std::string& path, const Machine& m,
                       const std::vector<DecodeResult>& results) {
  nlohmann::ordered_json doc;
  doc["machine"] = machine_json(m);
  doc["decode"] = nlohmann::ordered_json::array();
  for (const DecodeResult& r : results)
    doc["decode"].push_back({{"impl", fattn::to_string(r.impl)}, {"dtype", fattn::to_string(r.dtype)}, {"B", r.batch}, {"Hq", r.q_heads},
                             {"Hkv", r.kv_heads}, {"D", r.head_dim}, {"Sq", r.q_len},
                             {"Sk", r.kv_len}, {"page", r.page}, {"causal", "bottom_right"},
                             {"decode_prefetch_tiles", r.prefetch_tiles_asked},
                             {"decode_prefetch_level", r.prefetch_level_asked},
                             {"kv_splits", r.kv_splits_asked},
                             {"ms_median", r.ms_median}, {"ms_min", r.ms_min},
                             {"ms_max", r.ms_max}, {"kv_bytes", r.kv_bytes}, {"gbs", r.gbs},
                             {"pct_read_bandwidth", r.pct_read_bandwidth},
                             {"cache_read_gbs", r.cache_read_gbs},
                             {"pct_cache_read", r.pct_cache_read},
                             {"pct_bandwidth", r.pct_bandwidth}, {"flops", r.flops},
                             {"gflops", r.gflops}, {"pct_fma_peak", r.pct_fma_peak},
                             {"roof", r.roof}, {"pct_roof", r.pct_roof},
                             {"extra_bytes", r.extra_bytes}, {"max_abs_err_sampled", r.max_abs_err},
                             {"plan", {{"scores", r.plan.scores}, {"reads_in_place", r.plan.reads_in_place},
                                       {"key_tile", r.plan.key_tile}, {"rows", r.plan.rows},
                                       {"heads_per_item", r.plan.heads_per_item},
                                       {"splits", r.plan.splits}, {"items", r.plan.items},
                                       {"prefetch_tiles", r.plan.prefetch_tiles},
                                       {"prefetch_level", r.plan.prefetch_level},
                                       {"reason", r.plan.reason}}}});
  std::ofstream file(path);
  file << doc.dump(2) << '\n';
  if (!file) throw std::runtime_error("cannot write " + path);
}

}  // namespace fattn_bench
