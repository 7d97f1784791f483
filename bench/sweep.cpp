// fattn-bench — the sweep (see sweep.hpp).
#include "sweep.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "fattn/diagnostics.hpp"

#include "accuracy.hpp"
#include "contention.hpp"
#include "inputs.hpp"
#include "timing.hpp"

namespace fattn_bench {
namespace {

// One line on stderr per step: rewritten in place on a terminal, appended in a log.
class Progress {
 public:
  explicit Progress(int steps) : steps_(steps), in_place_(isatty(STDERR_FILENO) != 0) {}
  ~Progress() {
    if (in_place_ && step_ > 0) std::fputc('\n', stderr);
  }
  void step(const Shape& s, fattn::Impl impl) {
    ++step_;
    std::fprintf(stderr, "%s[%d/%d] Sq=%lld Sk=%lld causal=%s %s ...%s", in_place_ ? "\r" : "",
                 step_, steps_, static_cast<long long>(s.q_len), static_cast<long long>(s.kv_len),
                 fattn::to_string(s.causal), fattn::to_string(impl),
                 in_place_ ? "\033[K" : "\n");  // \033[K clears the rest of the line
    std::fflush(stderr);
  }

 private:
  int steps_, step_ = 0;
  bool in_place_;
};

// Minor page faults and kernel CPU time of this process so far.
struct KernelUse {
  std::int64_t minor_faults;
  double system_ms;

  static KernelUse now() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    constexpr double kMsPerSecond = 1e3, kMsPerMicrosecond = 1e-3;
    return {usage.ru_minflt, static_cast<double>(usage.ru_stime.tv_sec) * kMsPerSecond +
                                 static_cast<double>(usage.ru_stime.tv_usec) * kMsPerMicrosecond};
  }
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

// The naive stages' median times over the timed runs (seconds per run, warm-ups first).
void add_stages(Result& r, const std::vector<fattn::NaiveStageSeconds>& runs, int warmup) {
  constexpr double kMsPerSecond = 1e3, kGigaPerMilli = 1e-6;
  std::vector<double> prepare, scores, softmax, output;
  for (std::size_t i = static_cast<std::size_t>(warmup); i < runs.size(); ++i) {
    prepare.push_back(runs[i].prepare * kMsPerSecond);
    scores.push_back(runs[i].scores * kMsPerSecond);
    softmax.push_back(runs[i].softmax * kMsPerSecond);
    output.push_back(runs[i].output * kMsPerSecond);
  }
  r.prepare_ms_median = median(prepare);
  const double stage_ms[] = {median(scores), median(softmax), median(output)};
  int index = 0;
  for (NaiveStage stage : kNaiveStages) {
    StageResult s;
    s.stage = stage;
    s.ms_median = stage_ms[index++];
    s.flops = naive_stage_flops(r.shape, stage);
    s.traffic = naive_stage_traffic(r.shape, stage);
    s.gflops = static_cast<double>(s.flops) / s.ms_median * kGigaPerMilli;
    r.stages.push_back(s);
  }
}

std::int64_t kv_len_for(const SweepConfig& c, std::size_t index) {
  if (c.kv_lens.empty()) return c.q_lens[index];
  return c.kv_lens.size() == 1 ? c.kv_lens[0] : c.kv_lens[index];
}

Result measure(const SweepConfig& c, const Ceilings& ceilings, const Inputs& in, const Shape& s,
               fattn::Impl impl, const ReferenceCheck& check) {
  fattn::Options options;
  options.causal = s.causal;
  options.impl = impl;
  options.isa = c.isa_automatic ? fattn::Isa::automatic : c.isa;
  options.num_threads = c.threads;

  Outputs out = make_outputs(s, c.dtype);
  poison(out);
  const KernelUse kernel_before = KernelUse::now();
  const CpuSharing sharing;
  std::vector<fattn::NaiveStageSeconds> stage_seconds;  // every run's, naive only
  const Timing t = time_runs(
      [&] {
        fattn::attention_forward(in.q_in, in.k_in, in.v_in, out.out_view, out.lse_or_null,
                                 options);
        if (impl == fattn::Impl::naive) stage_seconds.push_back(fattn::last_naive_stage_seconds());
      },
      c.warmup, c.reps);
  const KernelUse kernel_after = KernelUse::now();
  const double others_cores = sharing.others_cores();

  Result r;
  r.impl = impl;
  r.dtype = c.dtype;
  r.shape = s;
  r.ms_median = t.median_ms;
  r.ms_min = t.min_ms;
  r.ms_max = t.max_ms;
  r.flops = flops(s);
  constexpr double kGigaPerMilli = 1e-6;  // FLOP/ms → GFLOP/s
  r.gflops = static_cast<double>(r.flops) / t.median_ms * kGigaPerMilli;
  r.pct_fma_peak = 100.0 * r.gflops / ceilings.fma_peak_gflops;
  const fattn::ForwardPlan plan = fattn::forward_plan(in.q_in, in.k_in, in.v_in, options);
  r.isa = plan.isa;
  const Roof roof = roof_for(plan, ceilings);
  r.roof = roof.name;
  r.pct_roof = 100.0 * r.gflops / roof.gflops;
  r.others_cores = others_cores;
  const int runs = c.warmup + c.reps;
  r.page_faults_per_run = (kernel_after.minor_faults - kernel_before.minor_faults) / runs;
  r.sys_ms_per_run = (kernel_after.system_ms - kernel_before.system_ms) / runs;
  r.max_abs_err = check.max_abs_err(out.out_values());
  r.err_all_rows = check.all_rows();
  r.extra_bytes = fattn::extra_bytes(in.q_in, in.k_in, in.v_in, options);
  r.query_tile_rows = query_tile_rows(r.isa);
  r.fused_ai_kv_reread = fused_ai_kv_reread(s, r.query_tile_rows);
  // The reference is modelled like fused: it reads each input once and keeps no scores.
  const bool naive = impl == fattn::Impl::naive;
  r.model_bytes = naive ? naive_bytes(s) : fused_bytes(s);
  r.ai_model = naive ? naive_ai(s) : fused_ai(s);
  if (naive) add_stages(r, stage_seconds, c.warmup);
  return r;
}

}  // namespace

std::vector<Result> run_sweep(const SweepConfig& c, const Ceilings& ceilings) {
  std::vector<Result> results;
  Progress progress(static_cast<int>(c.q_lens.size() * c.causal.size() * c.impls.size()));
  for (std::size_t n = 0; n < c.q_lens.size(); ++n) {
    Shape shape{c.batch,          c.q_heads,  c.kv_heads,          c.q_lens[n],
                kv_len_for(c, n), c.head_dim, fattn::Causal::none, c.lse,
                c.dtype == fattn::DType::float32 ? kFloatBytes : kHalfBytes};
    const Inputs inputs = make_inputs(shape, c.seed + n, c.dtype);
    for (fattn::Causal causal : c.causal) {
      shape.causal = causal;
      fattn::Options reference_options;
      reference_options.causal = causal;
      reference_options.num_threads = c.threads;
      std::optional<ReferenceCheck> check;
      for (fattn::Impl impl : c.impls) {
        progress.step(shape, impl);
        if (!check) check.emplace(inputs, shape, reference_options);
        results.push_back(measure(c, ceilings, inputs, shape, impl, *check));
      }
    }
  }
  return results;
}

}  // namespace fattn_bench
