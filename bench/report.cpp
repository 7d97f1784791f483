// fattn-bench — table, JSON and CSV output (see report.hpp).
#include "report.hpp"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "accuracy.hpp"
#include "contention.hpp"
#include "model_table.hpp"

namespace fattn_bench {
namespace {

using Cells = std::vector<std::string>;

template <class... Args>
std::string format(const char* fmt, Args... args) {
  char buffer[128];
  std::snprintf(buffer, sizeof buffer, fmt, args...);
  return buffer;
}

// What bfloat16 inputs on avx512 multiply on in this process, and why (an invalid
// FATTN_CPU_BF16 is reported as the reason: float32 runs do not need it).
std::pair<std::string, std::string> bf16_products_chosen() {
  try {
    const fattn::Bf16ProductsChoice& choice = fattn::bf16_products_choice();
    return {fattn::to_string(choice.products), choice.reason};
  } catch (const fattn::Error& e) {
    return {"error", e.what()};
  }
}

std::string bytes_label(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  constexpr double kStep = 1024;
  while (value >= kStep && unit < 4) {
    value /= kStep;
    ++unit;
  }
  return unit == 0 ? format("%lld B", static_cast<long long>(bytes))
                   : format("%.1f %s", value, units[unit]);
}

std::string seq_label(const Shape& s) {
  return s.q_len == s.kv_len ? format("%lld", static_cast<long long>(s.q_len))
                             : format("%lld/%lld", static_cast<long long>(s.q_len),
                                      static_cast<long long>(s.kv_len));
}

// Right-aligned columns, two spaces apart.
void print_cells(std::FILE* out, const std::vector<Cells>& rows) {
  std::vector<std::size_t> width;
  for (const Cells& row : rows) {
    width.resize(std::max(width.size(), row.size()));
    for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  for (const Cells& row : rows) {
    for (std::size_t c = 0; c < row.size(); ++c)
      std::fprintf(out, "%s%*s", c ? "  " : "", static_cast<int>(width[c]), row[c].c_str());
    std::fputc('\n', out);
  }
}

bool is_causal(const Shape& s) { return s.causal != fattn::Causal::none; }

nlohmann::ordered_json result_json(const Result& r) {
  nlohmann::ordered_json j;
  j["impl"] = fattn::to_string(r.impl);
  j["dtype"] = fattn::to_string(r.dtype);
  j["B"] = r.shape.batch;
  j["Hq"] = r.shape.q_heads;
  j["Hkv"] = r.shape.kv_heads;
  j["Sq"] = r.shape.q_len;
  j["Sk"] = r.shape.kv_len;
  j["D"] = r.shape.head_dim;
  j["causal"] = is_causal(r.shape);
  j["causal_alignment"] = fattn::to_string(r.shape.causal);
  j["ms_median"] = r.ms_median;
  j["ms_min"] = r.ms_min;
  j["ms_max"] = r.ms_max;
  j["gflops"] = r.gflops;
  j["isa"] = fattn::to_string(r.isa);
  j["max_abs_err"] = r.max_abs_err;  // NaN is written as null
  j["err_rows"] = r.err_all_rows ? "all" : "sampled";
  j["extra_bytes"] = r.extra_bytes;
  j["page_faults_per_run"] = r.page_faults_per_run;
  j["sys_ms_per_run"] = r.sys_ms_per_run;
  j["other_processes_cores"] = r.others_cores;
  j["ai_model"] = r.ai_model;
  j["flops"] = r.flops;
  j["model_bytes"] = r.model_bytes;
  j["pct_fma_peak"] = r.pct_fma_peak;
  j["roof"] = r.roof;
  j["pct_roof"] = r.pct_roof;
  j["lse_written"] = r.shape.lse_written;
  if (r.impl == fattn::Impl::fused) {
    j["fused_ai_kv_reread"] = r.fused_ai_kv_reread;
    j["query_tile_rows"] = r.query_tile_rows;
  }
  if (!r.stages.empty()) {
    j["prepare_ms_median"] = r.prepare_ms_median;
    j["stages"] = nlohmann::ordered_json::array();
    for (const StageResult& s : r.stages) {
      const std::int64_t bytes = s.traffic.total();
      j["stages"].push_back({{"stage", to_string(s.stage)},
                             {"ms_median", s.ms_median},
                             {"flops", s.flops},
                             {"model_bytes", bytes},
                             {"ai_model", static_cast<double>(s.flops) / static_cast<double>(bytes)},
                             {"gflops", s.gflops}});
    }
  }
  return j;
}

nlohmann::ordered_json roofline_json(const Machine& m) {
  const Ceilings& c = m.ceilings;
  nlohmann::ordered_json peaks = nlohmann::ordered_json::array();
  for (const Ceilings::IsaPeak& p : c.fma_peaks) peaks.push_back({{"isa", p.isa}, {"gflops", p.gflops}});
  nlohmann::ordered_json levels = nlohmann::ordered_json::array();
  for (const LevelBandwidth& l : c.bandwidth_levels)
    levels.push_back({{"level", l.level},
                      {"cache_bytes", l.cache_bytes},
                      {"shared_by_cpus", l.shared_by_cpus},
                      {"working_set_bytes", l.working_set_bytes},
                      {"bandwidth_gbs", l.bandwidth_gbs},
                      {"distinct", l.distinct}});
  nlohmann::ordered_json roof = {{"fma_peaks", peaks}};
  if (c.amx_bf16_peak_gflops > 0)
    roof["amx"] = {{"bf16_gflops", c.amx_bf16_peak_gflops},
                   {"fp32_split_gflops", c.amx_fp32_roof_gflops()},
                   {"partial_products", Ceilings::kAmxPartialProducts}};
  if (c.bf16_dot_peak_gflops > 0) roof["bf16_dot_gflops"] = c.bf16_dot_peak_gflops;
  roof["bandwidth_levels"] = levels;
  roof["bytes_counted"] = "triad: read b, read c, write a (no write-allocate)";
  roof["hardware_counters"] = m.hardware_counters;
  roof["hardware_counters_detail"] = m.hardware_counters_detail;
  return roof;
}

}  // namespace

std::string iso8601_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buffer;
}

void print_machine(std::FILE* out, const Machine& m) {
  const Ceilings& c = m.ceilings;
  std::fprintf(out, "fattn %s on %s (%s), isa %s%s, %d threads, %s\n", m.fattn_version.c_str(),
               m.device.c_str(), m.cpu.c_str(), m.kernel_isa.c_str(), m.kernel_isa_note.c_str(),
               c.threads, m.date.c_str());
  std::fprintf(out, "ceilings (best of several runs, all %d threads):\n", c.threads);
  std::fprintf(out, "  fp32 FMA peak   %8.1f GFLOP/s  (%s vectors; scalar %.1f GFLOP/s)\n",
               c.fma_peak_gflops, c.isa.c_str(), c.scalar_fma_peak_gflops);
  std::fprintf(out,
               "  bandwidth       %8.1f GB/s     (triad a = b + s*c, 3 x %.0f MiB of double;\n"
               "                                     24 B/element: read b, c, write a; %.1f GB/s"
               " with write-allocate)\n",
               c.bandwidth_gbs, c.triad_array_mib, c.bandwidth_with_write_allocate_gbs);
  std::fprintf(out,
               "  read bandwidth  %8.1f GB/s     (read-only stream over %.0f MiB of float, %s loads,\n"
               "                                     4 B/float; 1 thread %.1f GB/s: decode's roof)\n",
               c.read_bandwidth_gbs, c.read_bandwidth_buffer_mib, c.read_bandwidth_isa.c_str(),
               c.read_bandwidth_one_thread_gbs);
  std::fprintf(out, "  ridge point     %8.1f FLOP/byte\n", c.fma_peak_gflops / c.bandwidth_gbs);
  for (const Ceilings::IsaPeak& p : c.fma_peaks)
    std::fprintf(out, "  peak %-10s %8.1f GFLOP/s\n", p.isa.c_str(), p.gflops);
  if (c.amx_bf16_peak_gflops > 0)
    std::fprintf(out,
                 "  AMX tiles       %8.1f GFLOP/s  (bfloat16 TDPBF16PS in registers; the amx\n"
                 "                                     kernels' float32 roof, 1/%d of it: %.1f)\n",
                 c.amx_bf16_peak_gflops, Ceilings::kAmxPartialProducts, c.amx_fp32_roof_gflops());
  if (c.bf16_dot_peak_gflops > 0)
    std::fprintf(out, "  bf16 dot peak   %8.1f GFLOP/s  (VDPBF16PS in registers: the roof of bfloat16\n"
                      "                                     inputs on the fused and decode kernels)\n",
                 c.bf16_dot_peak_gflops);
  const auto [bf16_products, bf16_reason] = bf16_products_chosen();
  std::fprintf(out, "  bfloat16 products on avx512: %s (%s)\n", bf16_products.c_str(),
               bf16_reason.c_str());
  const fattn::DecodePrefetchLevelChoice& prefetch = fattn::decode_prefetch_level_choice();
  std::fprintf(out, "  decode prefetch level: %d (%s)\n", prefetch.level, prefetch.reason.c_str());
  for (const LevelBandwidth& l : c.bandwidth_levels)
    std::fprintf(out, "  triad %-9s %8.1f GB/s     (working set %s%s)\n", l.level.c_str(),
                 l.bandwidth_gbs, bytes_label(l.working_set_bytes).c_str(),
                 l.distinct ? "" : ", not beyond the level below");
  std::fprintf(out, "  hardware counters: %s\n\n", m.hardware_counters_detail.c_str());
}

namespace {

// The results of one (Sq, Sk, causal) point, one per impl.
using Point = std::vector<const Result*>;

struct Grouped {
  std::vector<fattn::Impl> impls;  // in the order they first appear
  std::vector<Point> points;       // likewise
};

Grouped group_by_point(const std::vector<Result>& results) {
  Grouped g;
  std::map<std::tuple<std::int64_t, std::int64_t, int>, std::size_t> index;
  for (const Result& r : results) {
    if (std::find(g.impls.begin(), g.impls.end(), r.impl) == g.impls.end())
      g.impls.push_back(r.impl);
    const auto key =
        std::make_tuple(r.shape.q_len, r.shape.kv_len, static_cast<int>(r.shape.causal));
    const auto [it, fresh] = index.try_emplace(key, g.points.size());
    if (fresh) g.points.emplace_back();
    g.points[it->second].push_back(&r);
  }
  return g;
}

const Result* find(const Point& point, fattn::Impl impl) {
  for (const Result* r : point)
    if (r->impl == impl) return r;
  return nullptr;
}

}  // namespace

void print_table(std::FILE* out, const Machine& m, const std::vector<Result>& results) {
  if (results.empty()) return;
  const auto [impls, points] = group_by_point(results);
  const bool speedup = std::count(impls.begin(), impls.end(), fattn::Impl::naive) &&
                       std::count(impls.begin(), impls.end(), fattn::Impl::fused);

  // One column per impl for each quantity; the speedup follows the times.
  using Cell = std::string (*)(const Result&);
  struct Quantity {
    const char* name;
    Cell cell;
  };
  const Quantity quantities[] = {
      {"ms",
       [](const Result& r) {
         const char* busy = r.others_cores > kBusyCores ? "!" : "";
         return format("%s%.2f (%.2f-%.2f)", busy, r.ms_median, r.ms_min, r.ms_max);
       }},
      {"GF/s", [](const Result& r) { return format("%.1f", r.gflops); }},
      {"%pk", [](const Result& r) {  // of the peak of the instructions it runs
         return format("%.1f%%%s", r.pct_roof, roof_mark(r.roof));
       }},
      {"AI", [](const Result& r) { return format("%.1f", r.ai_model); }},
      {"extra", [](const Result& r) { return bytes_label(r.extra_bytes); }},
      {"err", [](const Result& r) { return format("%.1e", r.max_abs_err); }},
  };
  const Quantity& time_quantity = quantities[0];

  std::vector<Cells> rows;
  Cells header{"S", "causal"};
  for (const Quantity& q : quantities) {
    for (fattn::Impl impl : impls)
      header.push_back(std::string(fattn::to_string(impl)) + " " + q.name);
    if (speedup && &q == &time_quantity) header.push_back("fused/naive");
  }
  header.push_back("err rows");
  rows.push_back(header);

  for (const Point& point : points) {
    const Shape& s = point.front()->shape;
    Cells row{seq_label(s), fattn::to_string(s.causal)};
    for (const Quantity& q : quantities) {
      for (fattn::Impl impl : impls) {
        const Result* r = find(point, impl);
        row.push_back(r ? q.cell(*r) : "-");
      }
      if (speedup && &q == &time_quantity) {
        const Result *naive = find(point, fattn::Impl::naive),
                     *fused = find(point, fattn::Impl::fused);
        row.push_back(naive && fused ? format("%.2fx", naive->ms_median / fused->ms_median) : "-");
      }
    }
    row.push_back(point.front()->err_all_rows ? "all" : "sampled");
    rows.push_back(row);
  }

  const Shape& s = results.front().shape;
  std::fprintf(out, "B=%lld Hq=%lld Hkv=%lld D=%lld %s, %d timed runs (+%d warm-up)%s\n",
               static_cast<long long>(s.batch), static_cast<long long>(s.q_heads),
               static_cast<long long>(s.kv_heads), static_cast<long long>(s.head_dim),
               fattn::to_string(results.front().dtype), m.reps, m.warmup,
               s.lse_written ? ", logsumexp written" : "");
  print_cells(out, rows);
  std::fprintf(
      out,
      "\nms = median (min-max) wall time, ! = other processes used > %.1f core meanwhile;\n"
      "fused/naive = naive median / fused median.\n"
      "GF/s = 4*B*Hq*visible_pairs*D / median time; %%pk = share of the measured peak of the\n"
      "instructions the kernel runs (fattn::forward_plan): fp32 FMA, \"dot\": the bf16 dot-product\n"
      "peak (VDPBF16PS), \"amx\": the amx kernels' float32 roof (the ceilings' AMX line).\n"
      "AI = FLOP per DRAM byte (model.hpp): fused counts Q, K, V, O once; "
      "naive adds 7 passes over the scores.\nextra = fattn::extra_bytes. err rows: "
      "all = whole output vs Impl::reference (B*Hq*Sq*Sk <= 2^26);\n"
      "sampled = %d rows spread over batch/heads/rows vs fattn::reference_row.\n"
      "JSON/CSV add page_faults_per_run and sys_ms_per_run (kernel time per call): fattn keeps\n"
      "its working memory between calls, so a fault count well above 0 means the OS reclaimed it.\n",
      kBusyCores, kSampledRows);
}

void print_table_header(std::FILE* out, const std::vector<std::string>& columns) {
  std::string header = "|", separator = "|";
  for (const std::string& column : columns) {
    header += " " + column + " |";
    separator += " --- |";
  }
  std::fprintf(out, "%s\n%s\n", header.c_str(), separator.c_str());
}

void print_contention(std::FILE* out, const Machine& m) {
  std::fprintf(out,
               "other processes used %.2f cores during the ceilings, %.2f during the sweep; "
               "hypervisor steal %.2f cores\n",
               m.others_cores_ceilings, m.others_cores_sweep, m.steal_cores);
  if (std::max({m.others_cores_ceilings, m.others_cores_sweep, m.steal_cores}) > kBusyCores)
    std::fprintf(stderr,
                 "fattn-bench: warning: the machine was not quiet (see the line above); "
                 "the timings and ceilings are inflated — run again when it is idle\n");
}

nlohmann::ordered_json machine_json(const Machine& m) {
  const Ceilings& c = m.ceilings;
  const auto [bf16_products, bf16_reason] = bf16_products_chosen();
  const fattn::DecodePrefetchLevelChoice& prefetch = fattn::decode_prefetch_level_choice();
  return {
      {"device", m.device},
      {"cpu", m.cpu},
      {"isa", m.kernel_isa},
      {"fma_peak_isa", c.isa},
      {"threads", c.threads},
      {"fma_peak_gflops", c.fma_peak_gflops},
      {"bf16_dot_peak_gflops", c.bf16_dot_peak_gflops},
      {"bf16_products", bf16_products},
      {"bf16_products_reason", bf16_reason},
      {"decode_prefetch_level", prefetch.level},
      {"decode_prefetch_level_reason", prefetch.reason},
      {"bandwidth_gbs", c.bandwidth_gbs},
      {"date", m.date},
      {"scalar_fma_peak_gflops", c.scalar_fma_peak_gflops},
      {"bandwidth_bytes_counted", "24 per element: read b, read c, write a (no write-allocate)"},
      {"bandwidth_with_write_allocate_gbs", c.bandwidth_with_write_allocate_gbs},
      {"triad_array_mib", c.triad_array_mib},
      {"read_bandwidth_gbs", c.read_bandwidth_gbs},
      {"read_bandwidth_one_thread_gbs", c.read_bandwidth_one_thread_gbs},
      {"read_bandwidth_bytes_counted", "4 per float read (read-only stream, no writes)"},
      {"read_bandwidth_buffer_mib", c.read_bandwidth_buffer_mib},
      {"read_bandwidth_isa", c.read_bandwidth_isa},
      {"fattn_version", m.fattn_version},
      {"reps", m.reps},
      {"warmup", m.warmup},
      {"other_processes_cores_ceilings", m.others_cores_ceilings},
      {"other_processes_cores_sweep", m.others_cores_sweep},
      {"steal_cores", m.steal_cores},
      {"roofline", roofline_json(m)},
  };
}

void write_json(const std::string& path, const Machine& m, const std::vector<Result>& results) {
  nlohmann::ordered_json doc;
  doc["machine"] = machine_json(m);
  doc["results"] = nlohmann::ordered_json::array();
  for (const Result& r : results) doc["results"].push_back(result_json(r));
  if (!results.empty())
    doc["model"] = model_table(results.front().shape.head_dim, results.front().query_tile_rows);
  std::ofstream file(path);
  file << doc.dump(2) << '\n';
  if (!file) throw std::runtime_error("cannot write " + path);
}

void write_csv(const std::string& path, const std::vector<Result>& results) {
  std::ofstream file(path);
  file << "impl,dtype,B,Hq,Hkv,Sq,Sk,D,causal,causal_alignment,ms_median,ms_min,ms_max,gflops,"
          "max_abs_err,err_rows,extra_bytes,ai_model,flops,model_bytes,pct_fma_peak,lse_written,"
          "page_faults_per_run,sys_ms_per_run,other_processes_cores,fused_ai_kv_reread,isa,roof,"
          "pct_roof\n";
  file.precision(9);
  for (const Result& r : results) {
    const Shape& s = r.shape;
    file << fattn::to_string(r.impl) << ',' << fattn::to_string(r.dtype) << ',' << s.batch << ',' << s.q_heads << ','
         << s.kv_heads << ',' << s.q_len << ',' << s.kv_len << ',' << s.head_dim << ','
         << (is_causal(s) ? "true" : "false") << ',' << fattn::to_string(s.causal) << ','
         << r.ms_median << ',' << r.ms_min << ',' << r.ms_max << ',' << r.gflops << ','
         << r.max_abs_err << ',' << (r.err_all_rows ? "all" : "sampled") << ',' << r.extra_bytes
         << ',' << r.ai_model << ',' << r.flops << ',' << r.model_bytes << ',' << r.pct_fma_peak
         << ',' << (s.lse_written ? "true" : "false") << ',' << r.page_faults_per_run << ','
         << r.sys_ms_per_run << ',' << r.others_cores << ',';
    if (r.impl == fattn::Impl::fused) file << r.fused_ai_kv_reread;
    file << ',' << fattn::to_string(r.isa) << ',' << r.roof << ',' << r.pct_roof << '\n';
  }
  if (!file) throw std::runtime_error("cannot write " + path);
}

}  // namespace fattn_bench
