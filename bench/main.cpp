// fattn-bench — measures this machine's ceilings, then times the attention kernels
// over a sweep of sequence lengths and causal modes, and reports each against them.
#include <algorithm>
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "ceilings.hpp"
#include "contention.hpp"
#include "decode_sweep.hpp"
#include "hw_counters.hpp"
#include "model.hpp"
#include "report.hpp"
#include "sweep.hpp"
#include "dropout_sweep.hpp"
#include "varlen_sweep.hpp"

namespace {

using fattn_bench::SweepConfig;

constexpr int kMinTimedRuns = 5;  // the median needs at least this many
constexpr int kMaxTimedRuns = 1000;
const std::vector<std::int64_t> kQuickSeqLens{128, 256};

const char* kCeilingsHelp =
    "Ceilings, measured at start-up on all threads, best of 5: fp32 FMA peak = independent\n"
    "FMA chains in registers (vector for the ISA in use, and scalar); bandwidth = STREAM\n"
    "triad a = b + s*c over 3 x 256 MiB of double, counting 24 B/element (read b, c; write\n"
    "a; the write-allocate read of a is not counted: JSON gives both); read bandwidth = a\n"
    "read-only stream (sums of floats in the kernels' vectors) over max(1 GiB, 8 x LLC), at\n"
    "most half of MemAvailable, 4 B/float, on 1 thread and on all: decode's roof; on CPUs\n"
    "with AMX, the tile unit's bfloat16 peak (TDPBF16PS in registers) and the amx kernels'\n"
    "float32 roof, a sixth of it (six partial products per float32 product); on CPUs with\n"
    "AVX512-BF16, the bfloat16 dot-product peak (VDPBF16PS chains in registers), the roof of\n"
    "the fused and decode kernels on bfloat16 inputs.";

const char* kJsonSchema =
    "--json FILE writes {\"machine\": {device, cpu, isa, threads, fma_peak_gflops,\n"
    "bf16_dot_peak_gflops (0: none), bandwidth_gbs, read_bandwidth_gbs,\n"
    "read_bandwidth_one_thread_gbs, date, ...}, \"results\": [{impl, dtype,\n"
    "B, Hq, Hkv, Sq, Sk, D, causal, causal_alignment, ms_median, ms_min, ms_max, gflops,\n"
    "max_abs_err, err_rows, extra_bytes, ai_model, flops, model_bytes, pct_fma_peak, roof\n"
    "(fma|bf16_dot|amx), pct_roof, lse_written,\n"
    "fused_ai_kv_reread (fused only), stages (naive only: qk_gemm, softmax, pv_gemm, each\n"
    "{ms_median, flops, model_bytes, ai_model, gflops}), ...}], \"model\": [the AI model at\n"
    "S = 128..4096, fp32 and 16-bit, per stage]}; machine.roofline: FMA peak per ISA and\n"
    "triad bandwidth per cache level (not with --quick), amx {bf16_gflops,\n"
    "fp32_split_gflops, partial_products} where measured. --csv FILE writes the results flat.\n"
    "--decode --json FILE writes {\"machine\": {the same}, \"decode\": [{impl, ..., gbs,\n"
    "pct_read_bandwidth (of read_bandwidth_gbs), pct_bandwidth (of the triad), ...}]}.";

// "both" is none + top_left; the other names are fattn's.
std::vector<fattn::Causal> parse_causal(const std::vector<std::string>& names) {
  std::vector<fattn::Causal> modes;
  for (const std::string& name : names) {
    if (name == "both") {
      modes.push_back(fattn::Causal::none);
      modes.push_back(fattn::Causal::top_left);
      continue;
    }
    bool known = false;
    for (fattn::Causal c :
         {fattn::Causal::none, fattn::Causal::top_left, fattn::Causal::bottom_right})
      if (name == fattn::to_string(c)) {
        modes.push_back(c);
        known = true;
      }
    if (!known) throw CLI::ValidationError("--causal", "unknown mode '" + name + "'");
  }
  return modes;
}

std::vector<fattn::Impl> parse_impls(const std::vector<std::string>& names) {
  std::vector<fattn::Impl> impls;
  for (const std::string& name : names) {
    const fattn::Impl impl = fattn::parse_impl(name);
    if (impl == fattn::Impl::automatic)
      throw CLI::ValidationError("--impls", "name naive, fused or reference, not auto");
    impls.push_back(impl);
  }
  return impls;
}

fattn::Isa resolve_isa(const std::string& name) {
  fattn::Isa isa = fattn::parse_isa(name);
  if (isa == fattn::Isa::automatic) isa = fattn::best_cpu_isa();
  if (!fattn::cpu_supports(isa))
    throw CLI::ValidationError(
        "--isa", std::string(fattn::to_string(isa)) + " is not supported by this CPU" +
                     fattn::cpu_unsupported_reason());
  return isa;
}

// --quick --decode: one small point of each kind, for CI smoke tests.
fattn_bench::DecodeConfig quick_decode(fattn_bench::DecodeConfig c) {
  c.batches = {1};
  c.kv_heads = {2};
  c.head_dims = {64};
  c.q_lens = {1, 4};
  c.kv_lens = {1024};
  c.q_heads = 8;
  return c;
}

// The run options a side sweep (--varlen, --dropout) takes from the command line: one
// causal mode (where given), threads, repetitions, warm-up runs, seed; then the header
// lines of its report.
template <class Config>
void take_run_options(Config& config, const SweepConfig& sweep,
                      const std::vector<std::string>& causal_names, const char* mode) {
  const std::vector<fattn::Causal> causal = parse_causal(causal_names);
  if (causal_names != std::vector<std::string>{"both"}) {
    if (causal.size() != 1) throw CLI::ValidationError("--causal", std::string(mode) + " takes one mode");
    config.causal = causal.front();
  }
  config.threads = sweep.threads;
  config.reps = sweep.reps;
  config.warmup = sweep.warmup;
  config.seed = sweep.seed;
  std::printf("cpu: %s\ndate: %s\nfattn: %s\n", fattn_bench::cpu_model_name().c_str(),
              fattn_bench::iso8601_now().c_str(), fattn::version());
}

// --varlen: the packed variable-length sweep, before (and without) the ceilings, which it
// does not report against; the other processes' CPU use is in each row.
int run_varlen(fattn_bench::VarlenConfig config, const SweepConfig& sweep, bool heads_given,
               bool kv_heads_given, const std::vector<std::string>& causal_names,
               const std::string& json_path) {
  if (heads_given) config.q_heads = sweep.q_heads;
  config.kv_heads = kv_heads_given ? sweep.kv_heads : config.q_heads;
  take_run_options(config, sweep, causal_names, "--varlen");
  const auto results = fattn_bench::run_varlen_sweep(config);
  fattn_bench::print_varlen_table(stdout, config, results);
  if (!json_path.empty()) fattn_bench::write_varlen_json(json_path, config, results);
  return 0;
}

// --dropout: dropout_p > 0 against 0 on the fused forward and backward, same run.
int run_dropout(fattn_bench::DropoutConfig config, const SweepConfig& sweep, bool shape_given,
                const std::vector<std::string>& causal_names, const std::string& json_path) {
  if (shape_given) {
    config.batch = sweep.batch;
    config.q_heads = sweep.q_heads;
    config.kv_heads = sweep.kv_heads;
    config.head_dims = {sweep.head_dim};
    config.seq_lens = sweep.q_lens;
  }
  take_run_options(config, sweep, causal_names, "--dropout");
  if (!sweep.isa_automatic) config.isa = sweep.isa;
  const auto results = fattn_bench::run_dropout_sweep(config);
  fattn_bench::print_dropout_table(stdout, config, results);
  if (!json_path.empty()) fattn_bench::write_dropout_json(json_path, config, results);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  SweepConfig config;
  std::vector<std::string> causal_names{"both"}, impl_names{"naive", "fused"};
  std::string isa_name = "auto", json_path, csv_path;
  bool quick = false, decode = false, varlen = false;
  fattn_bench::DecodeConfig decode_config;
  fattn_bench::VarlenConfig varlen_config;

  CLI::App app{
      "fattn-bench: attention kernels against this machine's measured peaks (fp32 FMA,\n"
      "bfloat16 dot products) and memory bandwidth, with FLOPs, arithmetic intensity and\n"
      "accuracy."};
  app.footer(std::string("\n") + kCeilingsHelp + "\n\n" + fattn_bench::model_help() + "\n\n" +
             kJsonSchema);
  app.add_option("--batch", config.batch, "batch size B")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  auto* heads = app.add_option("--heads", config.q_heads, "query heads Hq (--decode: 32)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  auto* kv_heads =
      app.add_option("--kv-heads", config.kv_heads, "key/value heads Hkv (default: Hq)")
          ->check(CLI::PositiveNumber);
  app.add_option("--head-dim", config.head_dim, "head dimension D")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  auto* seq = app.add_option("--seq", config.q_lens, "query lengths Sq to sweep")
                  ->capture_default_str()
                  ->check(CLI::PositiveNumber)
                  ->delimiter(',');
  app.add_option("--seq-kv", config.kv_lens,
                 "key lengths Sk: one for all, or one per --seq (default: Sk = Sq)")
      ->check(CLI::PositiveNumber)
      ->delimiter(',');
  app.add_option("--causal", causal_names,
                 "none|top_left|bottom_right|both (both = none and top_left)")
      ->capture_default_str()
      ->delimiter(',');
  app.add_option("--threads", config.threads, "threads (0: fattn's default, all cores)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--impls", impl_names, "implementations: naive,fused,reference")
      ->capture_default_str()
      ->delimiter(',');
  app.add_option("--isa", isa_name, "auto|amx|avx512|avx2|portable")->capture_default_str();
  const std::map<std::string, fattn::DType> dtypes{{"float32", fattn::DType::float32},
                                                   {"bfloat16", fattn::DType::bfloat16},
                                                   {"float16", fattn::DType::float16},
                                                   {"q8_0", fattn::DType::q8_0}};
  app.add_option("--dtype", config.dtype,
                 "float32|bfloat16|float16: of q, k, v and the output (both sweeps; the "
                 "reference reads the same values in float32); %pk is against the peak of the "
                 "instructions the kernel runs (\"dot\": VDPBF16PS); q8_0 (--decode only): the "
                 "cache's, with float32 q and output")
      ->transform(CLI::CheckedTransformer(dtypes))
      ->capture_default_str();
  app.add_option("--reps", config.reps, "timed runs per point (median, min, max)")
      ->capture_default_str()
      ->check(CLI::Range(kMinTimedRuns, kMaxTimedRuns));
  app.add_option("--warmup", config.warmup, "untimed runs before them")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--json", json_path, "write the machine and results as JSON");
  app.add_option("--csv", csv_path, "write the results as CSV");
  app.add_flag("--lse", config.lse, "also write the logsumexp (counted in the AI models)");
  app.add_option("--seed", config.seed, "seed of the random-normal inputs")->capture_default_str();
  app.add_flag("--quick", quick, "tiny sweep for CI smoke tests: S in {128, 256} unless --seq");
  app.add_flag("--decode", decode,
               "the decode sweep instead: short queries against a (B, S, Hkv, D) KV cache, "
               "decode and fused kernels, causal bottom-right, GB/s against the read bandwidth "
               "(all threads), a read stream over the point's own K and V (alternated with the "
               "decode, run by run) and the triad");
  app.add_option("--decode-batch", decode_config.batches, "--decode: batch sizes")
      ->capture_default_str()->check(CLI::PositiveNumber)->delimiter(',');
  app.add_option("--decode-kv-heads", decode_config.kv_heads, "--decode: kv heads Hkv")
      ->capture_default_str()->check(CLI::PositiveNumber)->delimiter(',');
  app.add_option("--decode-head-dim", decode_config.head_dims, "--decode: head dims D")
      ->capture_default_str()->check(CLI::PositiveNumber)->delimiter(',');
  app.add_option("--decode-seq", decode_config.q_lens, "--decode: query lengths Sq")
      ->capture_default_str()->check(CLI::PositiveNumber)->delimiter(',');
  app.add_option("--decode-seq-kv", decode_config.kv_lens, "--decode: cache lengths Sk")
      ->capture_default_str()->check(CLI::PositiveNumber)->delimiter(',');
  app.add_option("--max-kv-gib", decode_config.max_kv_gib,
                 "--decode: skip points whose K and V exceed this many GiB")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--decode-page", decode_config.page,
                 "--decode: the cache on shuffled pages of this many keys (a paged KV cache through "
                 "attention_kvcache's block table, a multiple of 16; the decode kernel alone); 0: "
                 "contiguous")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--decode-prefetch-tiles", decode_config.prefetch_tiles,
                 "--decode: the decode kernel's software prefetch distance in key tiles, each a "
                 "point of the sweep (Options::decode_prefetch_tiles; -1: its choice, 0: none)")
      ->capture_default_str()->check(CLI::Range(-1, fattn::kMaxDecodePrefetchTiles))->delimiter(',');
  app.add_option("--decode-prefetch-level", decode_config.prefetch_levels,
                 "--decode: the cache level the decode kernel's software prefetch fills, each a "
                 "point of the sweep (Options::decode_prefetch_level; -1: its choice, 1: L1 "
                 "(PREFETCHT0), 2: L2 (PREFETCHT1))")
      ->capture_default_str()
      ->check(CLI::IsMember(std::vector<int>{-1, 1, fattn::kMaxDecodePrefetchLevel}))
      ->delimiter(',');
  app.add_option("--decode-kv-splits", decode_config.kv_splits,
                 "--decode: the decode kernel's key chunks per sequence, each a point of the sweep "
                 "(Options::kv_splits; 0: its choice)")
      ->capture_default_str()->check(CLI::NonNegativeNumber)->delimiter(',');
  app.add_option("--fused-max-keys", decode_config.fused_max_keys,
                 "--decode: run the fused kernel beside decode up to this many keys")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_flag("--varlen", varlen,
               "the packed variable-length sweep instead: attention_varlen (one ragged call) "
               "beside attention_forward once per sequence and the tokens padded into one "
               "dense batch (Hq 8 unless --heads; causal bottom_right unless --causal)");
  app.add_option("--varlen-mix", varlen_config.mixes,
                 "--varlen: uniform (64 sequences of 16-512 tokens), longtail (60 of 16-64, "
                 "4 of 256-1024)")
      ->capture_default_str()->delimiter(',');
  app.add_option("--varlen-head-dim", varlen_config.head_dims, "--varlen: head dims D")
      ->capture_default_str()->check(CLI::PositiveNumber)->delimiter(',');
  app.add_option("--varlen-dtype", varlen_config.dtypes, "--varlen: dtypes")
      ->transform(CLI::CheckedTransformer(dtypes))->delimiter(',');
  app.add_flag("--varlen-no-padded", [&](std::int64_t) { varlen_config.padded = false; },
               "--varlen: skip the padded dense batch");
  app.add_option("--varlen-page", varlen_config.page,
                 "--varlen: also time the keys on shuffled pages of this many keys (a paged KV "
                 "cache, a multiple of 16; 0: not timed)")
      ->capture_default_str();
  app.add_flag("--varlen-no-backward", [&](std::int64_t) { varlen_config.backward = false; },
               "--varlen: skip the backward (attention_varlen_backward against the per-sequence loop)");
  bool dropout = false;
  fattn_bench::DropoutConfig dropout_config;
  app.add_flag("--dropout", dropout,
               "the dropout sweep instead: the fused forward and backward with --dropout-p "
               "against p = 0 (B 2, H 8, S 512/2048, D 64/128 unless --batch/--heads/--seq/"
               "--head-dim are given; float32 and bfloat16, or --dropout-dtype)");
  app.add_option("--dropout-p", dropout_config.p, "--dropout: the dropout probability")
      ->capture_default_str();
  app.add_option("--dropout-dtype", dropout_config.dtypes, "--dropout: dtypes")
      ->transform(CLI::CheckedTransformer(dtypes))->delimiter(',');
  CLI11_PARSE(app, argc, argv);

  try {
    if (kv_heads->count() == 0) config.kv_heads = config.q_heads;
    if (quick && seq->count() == 0) config.q_lens = kQuickSeqLens;
    if (!config.kv_lens.empty() && config.kv_lens.size() != 1 &&
        config.kv_lens.size() != config.q_lens.size())
      throw CLI::ValidationError("--seq-kv", "give one length, or as many as --seq");
    const auto is_q8_0 = [](fattn::DType d) { return d == fattn::DType::q8_0; };
    if ((is_q8_0(config.dtype) && !decode) ||
        std::any_of(varlen_config.dtypes.begin(), varlen_config.dtypes.end(), is_q8_0))
      throw CLI::ValidationError("--dtype", "q8_0 is a cache format: --decode only");
    config.causal = parse_causal(causal_names);
    config.impls = parse_impls(impl_names);
    config.isa = resolve_isa(isa_name);
    config.isa_automatic = fattn::parse_isa(isa_name) == fattn::Isa::automatic;
    if (config.threads == 0) config.threads = fattn::default_num_threads();
    if (dropout)
      return run_dropout(dropout_config, config, seq->count() > 0, causal_names, json_path);
    if (varlen)
      return run_varlen(varlen_config, config, heads->count() > 0, kv_heads->count() > 0,
                        causal_names, json_path);

    fattn_bench::Machine machine;
    machine.cpu = fattn_bench::cpu_model_name();
    machine.date = fattn_bench::iso8601_now();
    machine.fattn_version = fattn::version();
    machine.kernel_isa = fattn::to_string(config.isa);
    if (config.isa_automatic && fattn::automatic_cpu_isa(1) != config.isa)
      machine.kernel_isa_note = std::string(" (auto: short key sequences run ") +
                                fattn::to_string(fattn::automatic_cpu_isa(1)) +
                                "; each result's isa in the JSON/CSV)";
    machine.reps = config.reps;
    machine.warmup = config.warmup;
    const fattn_bench::CounterProbe counters = fattn_bench::probe_hardware_counters();
    machine.hardware_counters = counters.available;
    machine.hardware_counters_detail = counters.detail;
    std::fprintf(stderr, "measuring ceilings ...\n");
    const fattn_bench::CpuSharing whole_run;
    {
      const fattn_bench::CpuSharing ceilings_phase;
      machine.ceilings = fattn_bench::measure_ceilings(config.isa, config.threads, !quick);
      machine.others_cores_ceilings = ceilings_phase.others_cores();
    }
    fattn_bench::print_machine(stdout, machine);
    std::fflush(stdout);

    const fattn_bench::CpuSharing sweep_phase;
    if (decode) {
      decode_config.q_heads = heads->count() ? config.q_heads : 32;
      decode_config.threads = config.threads;
      decode_config.reps = config.reps;
      decode_config.warmup = config.warmup;
      decode_config.isa = config.isa_automatic ? fattn::Isa::automatic : config.isa;
      decode_config.read_isa = config.isa;
      decode_config.seed = config.seed;
      decode_config.dtype = config.dtype;
      if (quick) decode_config = quick_decode(decode_config);
      const auto results = fattn_bench::run_decode_sweep(decode_config, machine.ceilings);
      machine.others_cores_sweep = sweep_phase.others_cores();
      machine.steal_cores = whole_run.steal_cores();
      fattn_bench::print_decode_table(stdout, machine, results);
      fattn_bench::print_contention(stdout, machine);
      if (!json_path.empty()) fattn_bench::write_decode_json(json_path, machine, results);
      return 0;
    }
    const auto results = fattn_bench::run_sweep(config, machine.ceilings);
    machine.others_cores_sweep = sweep_phase.others_cores();
    machine.steal_cores = whole_run.steal_cores();
    fattn_bench::print_table(stdout, machine, results);
    fattn_bench::print_contention(stdout, machine);
    if (!json_path.empty()) fattn_bench::write_json(json_path, machine, results);
    if (!csv_path.empty()) fattn_bench::write_csv(csv_path, results);
  } catch (const CLI::Error& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fattn-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
