// fattn-bench --varlen (see varlen_sweep.hpp).
#include "varlen_sweep.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "contention.hpp"
#include "fattn/kv_cache.hpp"
#include "inputs.hpp"
#include "report.hpp"
#include "timing.hpp"

namespace fattn_bench {
namespace {

// The mixes' length ranges (tokens, inclusive).
constexpr std::int64_t kUniformSequences = 64, kUniformMin = 16, kUniformMax = 512;
constexpr std::int64_t kShortSequences = 60, kShortMin = 16, kShortMax = 64;
constexpr std::int64_t kLongSequences = 4, kLongMin = 256, kLongMax = 1024;

// Rows of H heads of D values in (rows, H, D) memory, in float32 or 16-bit bits.
struct Rows {
  std::int64_t rows = 0, heads = 0, D = 0;
  fattn::DType dtype = fattn::DType::float32;
  std::vector<float> f32;
  std::vector<std::uint16_t> b16;

  Rows(std::int64_t r, std::int64_t h, std::int64_t d, fattn::DType t)
      : rows(r), heads(h), D(d), dtype(t) {
    const auto n = static_cast<std::size_t>(r * h * d);
    if (t == fattn::DType::float32) f32.assign(n, 0.0f);
    else b16.assign(n, 0);
  }
  void fill(std::mt19937_64& engine) {
    std::normal_distribution<float> normal;
    for (float& x : f32) x = normal(engine) + 1e-6f;  // never zero
    for (std::uint16_t& x : b16) x = fattn::to_16bit(normal(engine) + 1e-6f, dtype);
  }
  void* row(std::int64_t r) {
    const std::int64_t at = r * heads * D;
    return f32.empty() ? static_cast<void*>(b16.data() + at) : static_cast<void*>(f32.data() + at);
  }
  float value(std::size_t e) const { return f32.empty() ? fattn::from_16bit(b16[e], dtype) : f32[e]; }
  // Rows [first, first + n) as one sequence (1, n, H, D); batch > 1: (batch, n, H, D).
  fattn::TensorView view(std::int64_t first, std::int64_t n, std::int64_t batch = 1) {
    return fattn::TensorView::bshd(row(first), batch, n, heads, D, dtype);
  }
  void copy_rows(std::int64_t from, Rows& to, std::int64_t at, std::int64_t n) {
    const auto bytes = static_cast<std::size_t>(n * heads * D) * (f32.empty() ? 2 : 4);
    std::memcpy(to.row(at), row(from), bytes);
  }
};

// One point: the packed tensors, their padded copies, the outputs of each contender.
struct Point {
  std::vector<std::int64_t> lengths;
  std::vector<std::int32_t> starts{0};
  std::int64_t max_len = 0;
  Rows q, k, v, out_ragged, out_loop, pq, pk, pv, pout;
  // The keys on shuffled pages of c.page keys (num_blocks·page rows), the block table, and
  // the paged call's output.
  Rows k_pages, v_pages, out_paged;
  std::vector<std::int32_t> table;
  std::int64_t max_blocks = 0;
  // The backward's: dO, and each contender's dq, dk, dv (empty unless timed).
  Rows dout, dq_ragged, dk_ragged, dv_ragged, dq_loop, dk_loop, dv_loop;

  Point(const std::vector<std::int64_t>& lens, const VarlenConfig& c, std::int64_t D,
        fattn::DType dtype, bool padded)
      : lengths(lens),
        max_len(*std::max_element(lens.begin(), lens.end())),
        q(total(lens), c.q_heads, D, dtype), k(total(lens), c.kv_heads, D, dtype),
        v(total(lens), c.kv_heads, D, dtype), out_ragged(total(lens), c.q_heads, D, dtype),
        out_loop(total(lens), c.q_heads, D, dtype),
        pq(padded ? batch() * max_len : 0, c.q_heads, D, dtype),
        pk(padded ? batch() * max_len : 0, c.kv_heads, D, dtype),
        pv(padded ? batch() * max_len : 0, c.kv_heads, D, dtype),
        pout(padded ? batch() * max_len : 0, c.q_heads, D, dtype),
        dout(c.backward ? total(lens) : 0, c.q_heads, D, dtype),
        dq_ragged(c.backward ? total(lens) : 0, c.q_heads, D, dtype),
        dk_ragged(c.backward ? total(lens) : 0, c.kv_heads, D, dtype),
        dv_ragged(c.backward ? total(lens) : 0, c.kv_heads, D, dtype),
        dq_loop(c.backward ? total(lens) : 0, c.q_heads, D, dtype),
        dk_loop(c.backward ? total(lens) : 0, c.kv_heads, D, dtype),
        dv_loop(c.backward ? total(lens) : 0, c.kv_heads, D, dtype),
        k_pages(c.page ? pages(lens, c.page) * c.page : 0, c.kv_heads, D, dtype),
        v_pages(c.page ? pages(lens, c.page) * c.page : 0, c.kv_heads, D, dtype),
        out_paged(c.page ? total(lens) : 0, c.q_heads, D, dtype) {
    for (const std::int64_t l : lens) starts.push_back(starts.back() + static_cast<std::int32_t>(l));
    std::mt19937_64 engine(c.seed);
    for (Rows* r : {&q, &k, &v, &pq, &pk, &pv, &dout}) r->fill(engine);
    if (c.page) lay_on_pages(c.page, engine);
    if (!padded) return;
    for (std::int64_t b = 0; b < batch(); ++b) {  // each sequence at the start of its slot
      q.copy_rows(starts[b], pq, b * max_len, lens[b]);
      k.copy_rows(starts[b], pk, b * max_len, lens[b]);
      v.copy_rows(starts[b], pv, b * max_len, lens[b]);
    }
  }
  std::int64_t batch() const { return static_cast<std::int64_t>(lengths.size()); }
  static std::int64_t pages(const std::vector<std::int64_t>& l, std::int64_t page) {
    std::int64_t n = 0;
    for (const std::int64_t x : l) n += (x + page - 1) / page;
    return n;
  }
  // Sequence b's keys on pages in a shuffled order (a serving engine's cache after a while).
  void lay_on_pages(std::int64_t page, std::mt19937_64& engine) {
    std::vector<std::int32_t> order(static_cast<std::size_t>(pages(lengths, page)));
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int32_t>(i);
    std::shuffle(order.begin(), order.end(), engine);
    for (const std::int64_t l : lengths) max_blocks = std::max(max_blocks, (l + page - 1) / page);
    table.assign(static_cast<std::size_t>(batch() * max_blocks), 0);
    std::size_t next = 0;
    for (std::int64_t b = 0; b < batch(); ++b)
      for (std::int64_t n = 0; n * page < lengths[b]; ++n) {
        const std::int32_t at = order[next++];
        table[static_cast<std::size_t>(b * max_blocks + n)] = at;
        const std::int64_t rows = std::min(page, lengths[b] - n * page);
        k.copy_rows(starts[b] + n * page, k_pages, at * page, rows);
        v.copy_rows(starts[b] + n * page, v_pages, at * page, rows);
      }
  }
  static std::int64_t total(const std::vector<std::int64_t>& l) {
    std::int64_t t = 0;
    for (const std::int64_t x : l) t += x;
    return t;
  }
};

// The first n contenders timed `reps` times, rotated within each repetition so that no
// contender always runs first: ms[contender][repetition].
std::vector<std::vector<double>> rotated_ms(const std::vector<std::function<void()>>& contenders,
                                            std::size_t n, int reps) {
  std::vector<std::vector<double>> ms(n);
  for (int r = 0; r < reps; ++r)
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t which = (static_cast<std::size_t>(r) + i) % n;
      ms[which].push_back(milliseconds(contenders[which]));
    }
  return ms;
}

// Median over the repetitions of ms[a][r] / ms[b][r] (robust to a repetition slowed for all).
double median_ratio(const std::vector<std::vector<double>>& ms, std::size_t a, std::size_t b) {
  std::vector<double> ratio;
  for (std::size_t r = 0; r < ms[a].size(); ++r) ratio.push_back(ms[a][r] / ms[b][r]);
  return median(ratio);
}

void measure_backward(const VarlenConfig& c, Point& p, const fattn::Options& o, VarlenResult& res);

VarlenResult measure(const VarlenConfig& c, const std::string& mix, std::int64_t D,
                     fattn::DType dtype) {
  Point p(varlen_lengths(mix, c.seed), c, D, dtype, c.padded);
  const std::int64_t B = p.batch(), total = p.starts.back();
  fattn::Options o;
  o.causal = c.causal;
  o.num_threads = c.threads;
  // The padded batch: each sequence's tokens first in its slot, so a top-left causal limit
  // keeps every real query from the padding keys (Sq = Sk: the same pairs as bottom-right).
  fattn::Options padded_options = o;
  if (c.causal != fattn::Causal::none) padded_options.causal = fattn::Causal::top_left;
  const fattn::TensorView cu_view = fattn::TensorView::int32_vector(p.starts.data(), B + 1);
  const std::int64_t blocks = c.page ? p.k_pages.rows / c.page : 0;
  const fattn::TensorView table =
      fattn::TensorView::int32_matrix(p.table.data(), B, std::max<std::int64_t>(p.max_blocks, 1));
  const fattn::KvCache paged{p.k_pages.view(0, c.page, blocks), p.v_pages.view(0, c.page, blocks),
                             nullptr, &table};
  std::vector<std::function<void()>> contenders{
      [&] {
        fattn::attention_varlen(p.q.view(0, total), p.k.view(0, total), p.v.view(0, total), cu_view,
                                cu_view, p.out_ragged.view(0, total), nullptr, o);
      },
      [&] {  // what attention_varlen did before: one public call per sequence
        for (std::int64_t b = 0; b < B; ++b) {
          const std::int64_t s = p.starts[b], n = p.lengths[b];
          fattn::attention_forward(p.q.view(s, n), p.k.view(s, n), p.v.view(s, n),
                                   p.out_loop.view(s, n), nullptr, o);
        }
      },
      [&] {
        fattn::attention_forward(p.pq.view(0, p.max_len, B), p.pk.view(0, p.max_len, B),
                                 p.pv.view(0, p.max_len, B), p.pout.view(0, p.max_len, B),
                                 nullptr, padded_options);
      }};
  // Rotated with the others: the paged call in the padded call's slot when that is not timed.
  const std::function<void()> paged_call = [&] {
    fattn::attention_varlen(p.q.view(0, total), paged, cu_view, &cu_view, p.out_paged.view(0, total),
                            nullptr, o);
  };
  if (!c.padded) contenders.pop_back();
  const std::size_t paged_at = contenders.size();
  if (c.page) contenders.push_back(paged_call);
  const std::size_t n = contenders.size();
  const CpuSharing sharing;
  for (int w = 0; w < c.warmup; ++w)
    for (std::size_t i = 0; i < n; ++i) contenders[i]();
  const std::vector<std::vector<double>> ms = rotated_ms(contenders, n, c.reps);
  VarlenResult res;
  res.others_cores = sharing.others_cores();
  res.mix = mix, res.dtype = dtype, res.sequences = B, res.tokens = total, res.max_len = p.max_len;
  res.q_heads = c.q_heads, res.kv_heads = c.kv_heads, res.head_dim = D;
  for (const std::int64_t l : p.lengths)
    res.useful_flops += 4.0 * static_cast<double>(D * c.q_heads) *
                        (c.causal == fattn::Causal::none ? double(l) * l : double(l) * (l + 1) / 2);
  res.ragged_ms = median(ms[0]);
  res.loop_ms = median(ms[1]);
  res.padded_ms = c.padded ? median(ms[2]) : 0.0;
  res.loop_over_ragged = median_ratio(ms, 1, 0);
  res.padded_over_ragged = c.padded ? median_ratio(ms, 2, 0) : 0.0;
  if (c.page) {
    res.paged_ms = median(ms[paged_at]);
    res.paged_over_ragged = median_ratio(ms, paged_at, 0);
    for (std::size_t e = 0; e < static_cast<std::size_t>(total * c.q_heads * D); ++e)
      res.paged_max_abs_diff = std::max(res.paged_max_abs_diff, static_cast<double>(std::fabs(
                                            p.out_paged.value(e) - p.out_ragged.value(e))));
  }
  for (std::size_t e = 0; e < static_cast<std::size_t>(total * c.q_heads * D); ++e)
    res.max_abs_diff = std::max(res.max_abs_diff, static_cast<double>(std::fabs(
                                                      p.out_ragged.value(e) - p.out_loop.value(e))));
  if (c.backward) measure_backward(c, p, o, res);
  return res;
}

double gflops(double flops, double ms) { return ms > 0 ? flops / ms * 1e-6 : 0.0; }

// The backward of the ragged forward's out and lse: attention_varlen_backward against
// attention_backward once per sequence (what it ran before its short sequences shared one
// parallel section; their gradients may differ in the last bits), alternated.
void measure_backward(const VarlenConfig& c, Point& p, const fattn::Options& o, VarlenResult& res) {
  const std::int64_t B = p.batch(), total = p.starts.back();
  const fattn::TensorView cu_view = fattn::TensorView::int32_vector(p.starts.data(), B + 1);
  std::vector<float> lse(static_cast<std::size_t>(c.q_heads * total));
  const fattn::TensorView lse_view = fattn::TensorView::lse(lse.data(), 1, c.q_heads, total);
  fattn::attention_varlen(p.q.view(0, total), p.k.view(0, total), p.v.view(0, total), cu_view,
                          cu_view, p.out_ragged.view(0, total), &lse_view, o);
  // Sequence b's rows of the (1, Hq, total) lse.
  auto lse_of = [&](std::int64_t s, std::int64_t n) {
    fattn::TensorView v = fattn::TensorView::lse(lse.data() + s, 1, c.q_heads, n);
    v.strides = {c.q_heads * total, total, 1, 0};
    return v;
  };
  const std::vector<std::function<void()>> contenders{
      [&] {
        fattn::attention_varlen_backward(
            p.q.view(0, total), p.k.view(0, total), p.v.view(0, total), p.out_ragged.view(0, total),
            p.dout.view(0, total), lse_view, cu_view, cu_view, p.dq_ragged.view(0, total),
            p.dk_ragged.view(0, total), p.dv_ragged.view(0, total), o);
      },
      [&] {
        for (std::int64_t b = 0; b < B; ++b) {
          const std::int64_t s = p.starts[b], n = p.lengths[b];
          fattn::attention_backward(p.q.view(s, n), p.k.view(s, n), p.v.view(s, n),
                                    p.out_ragged.view(s, n), p.dout.view(s, n), lse_of(s, n),
                                    nullptr, p.dq_loop.view(s, n), p.dk_loop.view(s, n),
                                    p.dv_loop.view(s, n), o);
        }
      }};
  for (int w = 0; w < c.warmup; ++w)
    for (const auto& run : contenders) run();
  const CpuSharing sharing;
  const std::vector<std::vector<double>> ms = rotated_ms(contenders, contenders.size(), c.reps);
  res.backward_ragged_ms = median(ms[0]);
  res.backward_loop_ms = median(ms[1]);
  res.backward_loop_over_ragged = median_ratio(ms, 1, 0);
  res.backward_others_cores = sharing.others_cores();
  for (const auto& [a, b] : {std::pair<Rows*, Rows*>{&p.dq_ragged, &p.dq_loop},
                             {&p.dk_ragged, &p.dk_loop}, {&p.dv_ragged, &p.dv_loop}})
    for (std::size_t e = 0; e < static_cast<std::size_t>(a->rows * a->heads * a->D); ++e)
      res.backward_max_abs_diff =
          std::max(res.backward_max_abs_diff, static_cast<double>(std::fabs(a->value(e) - b->value(e))));
}

}  // namespace

std::vector<std::int64_t> varlen_lengths(const std::string& mix, std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  auto draw = [&](std::int64_t count, std::int64_t lo, std::int64_t hi, std::vector<std::int64_t>& into) {
    std::uniform_int_distribution<std::int64_t> length(lo, hi);
    for (std::int64_t i = 0; i < count; ++i) into.push_back(length(engine));
  };
  std::vector<std::int64_t> lengths;
  if (mix == "uniform") {
    draw(kUniformSequences, kUniformMin, kUniformMax, lengths);
  } else if (mix == "longtail") {
    draw(kShortSequences, kShortMin, kShortMax, lengths);
    draw(kLongSequences, kLongMin, kLongMax, lengths);
    std::shuffle(lengths.begin(), lengths.end(), engine);  // the long ones anywhere
  } else {
    throw std::invalid_argument("--varlen-mix: unknown mix '" + mix + "' (uniform, longtail)");
  }
  return lengths;
}

std::vector<VarlenResult> run_varlen_sweep(const VarlenConfig& config) {
  std::vector<VarlenResult> results;
  for (const std::string& mix : config.mixes)
    for (const fattn::DType dtype : config.dtypes)
      for (const std::int64_t D : config.head_dims) {
        std::fprintf(stderr, "%s %s D=%lld ...\n", mix.c_str(), fattn::to_string(dtype),
                     static_cast<long long>(D));
        results.push_back(measure(config, mix, D, dtype));
      }
  return results;
}

void print_varlen_table(std::FILE* out, const VarlenConfig& c, const std::vector<VarlenResult>& results) {
  std::fprintf(out,
               "\nvarlen prefill, Hq=%lld Hkv=%lld, %s, %d threads, median of %d repetitions "
               "(the calls rotated within each); ratios: medians of the per-repetition "
               "ratios; GFLOP/s: useful (real sequences' visible pairs) over each time\n\n",
               static_cast<long long>(c.q_heads), static_cast<long long>(c.kv_heads),
               fattn::to_string(c.causal), c.threads, c.reps);
  print_table_header(out, {"mix", "dtype", "D", "seqs", "tokens", "max", "ragged ms", "GFLOP/s",
                           "loop ms", "loop/ragged", "padded ms", "padded/ragged",
                           "padded useful GFLOP/s", "paged ms", "paged/ragged", "paged diff",
                           "max diff", "others' cores"});
  // A column the run did not time (--varlen-no-padded, --varlen-page 0) reads "-".
  auto cell = [&](bool timed, const char* format, double value) {
    char text[32] = "-";
    if (timed) std::snprintf(text, sizeof text, format, value);
    return std::string(text);
  };
  const bool paged = c.page > 0;
  for (const VarlenResult& r : results)
    std::fprintf(out, "| %s | %s | %lld | %lld | %lld | %lld | %.2f | %.1f | %.2f | %.2fx | %s | %s | %s | %s | %s | %s | %.1e | %.2f%s |\n",
                 r.mix.c_str(), fattn::to_string(r.dtype), static_cast<long long>(r.head_dim),
                 static_cast<long long>(r.sequences), static_cast<long long>(r.tokens),
                 static_cast<long long>(r.max_len), r.ragged_ms, gflops(r.useful_flops, r.ragged_ms),
                 r.loop_ms, r.loop_over_ragged, cell(c.padded, "%.1f", r.padded_ms).c_str(),
                 cell(c.padded, "%.2fx", r.padded_over_ragged).c_str(),
                 cell(c.padded, "%.1f", gflops(r.useful_flops, r.padded_ms)).c_str(),
                 cell(paged, "%.2f", r.paged_ms).c_str(), cell(paged, "%.3fx", r.paged_over_ragged).c_str(),
                 cell(paged, "%.1e", r.paged_max_abs_diff).c_str(), r.max_abs_diff,
                 r.others_cores, r.others_cores > kBusyCores ? " (busy)" : "");
  if (!c.backward) return;
  std::fprintf(out,
               "\nvarlen backward (of the ragged forward's out and lse): attention_varlen_backward "
               "against attention_backward once per sequence, alternated; GFLOP/s: 2.5x the "
               "forward's useful FLOPs over the time\n\n");
  print_table_header(out, {"mix", "dtype", "D", "seqs", "tokens", "ragged ms", "GFLOP/s", "loop ms",
                           "loop/ragged", "max diff", "others' cores"});
  for (const VarlenResult& r : results)
    std::fprintf(out, "| %s | %s | %lld | %lld | %lld | %.2f | %.1f | %.2f | %.2fx | %.1e | %.2f%s |\n",
                 r.mix.c_str(), fattn::to_string(r.dtype), static_cast<long long>(r.head_dim),
                 static_cast<long long>(r.sequences), static_cast<long long>(r.tokens),
                 r.backward_ragged_ms, gflops(2.5 * r.useful_flops, r.backward_ragged_ms),
                 r.backward_loop_ms, r.backward_loop_over_ragged, r.backward_max_abs_diff,
                 r.backward_others_cores, r.backward_others_cores > kBusyCores ? " (busy)" : "");
}

void write_varlen_json(const std::string& path, const VarlenConfig& c,
                       const std::vector<VarlenResult>& results) {
  nlohmann::json j;
  j["config"] = {{"q_heads", c.q_heads}, {"kv_heads", c.kv_heads}, {"causal", fattn::to_string(c.causal)},
                 {"threads", c.threads}, {"reps", c.reps}, {"warmup", c.warmup}, {"seed", c.seed},
                 {"backward", c.backward}, {"page", c.page},
                 {"date", iso8601_now()}};
  for (const VarlenResult& r : results)
    j["results"].push_back({{"mix", r.mix}, {"dtype", fattn::to_string(r.dtype)}, {"D", r.head_dim},
                            {"sequences", r.sequences}, {"tokens", r.tokens}, {"max_len", r.max_len},
                            {"useful_flops", r.useful_flops}, {"ragged_ms", r.ragged_ms},
                            {"loop_ms", r.loop_ms},
                            {"padded_ms", c.padded ? nlohmann::json(r.padded_ms) : nlohmann::json()},
                            {"loop_over_ragged", r.loop_over_ragged},
                            {"padded_over_ragged",
                             c.padded ? nlohmann::json(r.padded_over_ragged) : nlohmann::json()},
                            {"paged_ms", c.page ? nlohmann::json(r.paged_ms) : nlohmann::json()},
                            {"paged_over_ragged",
                             c.page ? nlohmann::json(r.paged_over_ragged) : nlohmann::json()},
                            {"paged_max_abs_diff",
                             c.page ? nlohmann::json(r.paged_max_abs_diff) : nlohmann::json()},
                            {"max_abs_diff", r.max_abs_diff}, {"others_cores", r.others_cores},
                            {"backward_ragged_ms", r.backward_ragged_ms},
                            {"backward_loop_ms", r.backward_loop_ms},
                            {"backward_loop_over_ragged", r.backward_loop_over_ragged},
                            {"backward_max_abs_diff", r.backward_max_abs_diff},
                            {"backward_others_cores", r.backward_others_cores}});
  std::ofstream(path) << j.dump(2) << "\n";
}

}  // namespace fattn_bench
