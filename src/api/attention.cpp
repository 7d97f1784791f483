// fattn — the entry points: validate, pick a backend and an implementation, run.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "model/checked.hpp"
#include "model/checks.hpp"
#include "api/diagnostics.hpp"
#include "api/dispatch.hpp"
#include "model/parallel.hpp"
#include "model/problem.hpp"
#include "model/ragged_schedule.hpp"
#include "api/workspace_cache.hpp"
#include "cpu/kernels.hpp"
#include "fattn/attention.hpp"
#ifdef FATTN_WITH_CUDA
#include "cuda/backend.hpp"
#endif

#ifndef FATTN_VERSION
#define FATTN_VERSION "0.0.0"
#endif

namespace fattn {
namespace {

// The kernels for the options' ISA. automatic: the forward runs automatic_cpu_isa; the
// backward the best ISA at every length (the AMX backward beat avx512's 1.25-1.47× from
// 128 to 512 keys, B=2 H=8 D=64/128: docs/perf-log.md, "AMX backward").
enum class Direction { forward, backward };
const cpu::Kernels& cpu_kernels(const Options& options, const detail::Problem& p,
                                Direction direction) {
  if (!cpu_supports(options.isa))
    throw Error(std::string("fattn: isa ") + to_string(options.isa) +
                " is not supported by this CPU" + cpu_unsupported_reason());
  const bool sixteen_bit = p.dtype == DType::bfloat16 || p.dtype == DType::float16;
  if (options.isa == Isa::amx && (sixteen_bit || p.kv_q8_0))
    throw Error(std::string("fattn: isa amx takes float32; ") + to_string(p.kv_dtype()) +
                " inputs run on avx512, avx2 or portable");
  if (options.isa == Isa::amx && p.dropout.on())
    throw Error("fattn: isa amx takes no dropout (its softmax runs among its tile products); "
                "dropout runs on avx512, avx2 or portable");
  Isa isa = options.isa;
  if (isa == Isa::automatic) {
    isa = direction == Direction::forward ? automatic_cpu_isa(p.kv_len) : best_cpu_isa();
    // Every AMX CPU has avx512: 16-bit inputs, q8_0 caches and dropout run there, and
    // ragged batches (the AMX kernels take them when isa amx is asked for, but are not
    // measured on them).
    if (isa == Isa::amx && (sixteen_bit || p.kv_q8_0 || p.is_ragged() || p.dropout.on()))
      isa = Isa::avx512;
  }
  if (options.bf16_products == Bf16Products::bf16_dot && p.dtype == DType::bfloat16 &&
      (isa != Isa::avx512 || !cpu_has_bf16_dot_products()))
    throw Error(std::string("fattn: bf16_products bf16_dot needs vdpbf16ps on isa avx512; this "
                            "call runs on isa ") + to_string(isa) +
                (cpu_has_bf16_dot_products() ? "" : " and this CPU or build has no AVX512-BF16") +
                cpu_unsupported_reason());
  return cpu::kernels_for(isa, p.dtype, options.bf16_products);
}

// Why bfloat16 inputs on avx512 take the products they take (ForwardPlan::products_reason).
std::string bf16_products_reason(const Options& options, const cpu::Kernels& kernels,
                                 const detail::Problem& p, Products products) {
  if (p.dtype != DType::bfloat16 || kernels.isa != Isa::avx512) return {};
  if (products == Products::fma && cpu::runs_bf16_dot(options.bf16_products))
    return "this kernel multiplies widened to float32 FMAs for this problem (its vdpbf16ps "
           "path takes the fused forward and a decode cache read in place)";
  if (options.bf16_products != Bf16Products::automatic)
    return std::string("bf16_products ") + to_string(options.bf16_products) + " asked for";
  return bf16_products_choice().reason;
}

void require_cpu(const TensorView& q) {
  detail::expect_cuda_backend(q);
  if (q.device != Device::cpu)
    throw Error(std::string("fattn: q is on ") + to_string(q.device) +
                ", but this entry point takes cpu tensors");
  if (q.dtype != DType::float32 && q.dtype != DType::bfloat16 && q.dtype != DType::float16 &&
      q.dtype != DType::float64)
    throw Error(std::string("fattn: the CPU kernels take float32, bfloat16 or float16 "
                            "(float64: reference only), got q.dtype = ") +
                to_string(q.dtype));
}

// Impl::automatic runs the decode kernel while a kv head's query rows (Sq · Hq/Hkv) are
// at most kDecodeMaxRows and Sq at most kDecodeMaxQueries; the fused kernel above. Fused
// time / decode time, 2 threads, B=1, Hq=32, Sk=4096 (docs/perf-log.md, "Decode kernel"):
//   dev-spr:  Hkv=8: Sq=32 (128 rows) 1.42x, Sq=48 (192 rows) 0.78-0.98x;
//             Hkv=32: Sq=64 1.40-1.60x, Sq=128 0.90x.
//   dev-zen5: Hkv=8: Sq=32 1.68-1.86x, Sq=48 1.12-1.20x, Sq=64 0.80-0.87x;
//             Hkv=32: Sq=64 1.10-1.38x, Sq=128 0.88-1.07x.
// 192 rows would gain 12-20 % on dev-zen5 and lose 2-22 % on dev-spr: the limit stays 128.
constexpr std::int64_t kDecodeMaxRows = 128;
constexpr std::int64_t kDecodeMaxQueries = 64;

// float64 problems run the float64 reference; the SIMD kernels compute in float32.
Impl reference_for_float64(Impl impl) {
  if (impl != Impl::automatic && impl != Impl::reference)
    throw Error(std::string("fattn: impl ") + to_string(impl) +
                " takes float32; float64 runs only the reference (impl auto or reference)");
  return Impl::reference;
}

// Dropout runs on the fused kernels and the reference (the decode kernel serves inference,
// the naive one is the unfused baseline).
void expect_dropout_kernel(Impl impl, const detail::Problem& p) {
  if (p.dropout.on() && (impl == Impl::naive || impl == Impl::decode))
    throw Error(std::string("fattn: dropout_p > 0 runs on impl auto, fused or reference, got "
                            "impl ") + to_string(impl));
}

Impl resolve(Impl impl, DType dtype, const detail::Problem& p) {
  if (dtype == DType::float64) return reference_for_float64(impl);
  expect_dropout_kernel(impl, p);
  if (p.dropout.on() && impl == Impl::automatic) return Impl::fused;
  if (impl != Impl::automatic) return impl;
  const bool short_queries =
      p.q_len <= kDecodeMaxQueries && p.group_size() * p.q_len <= kDecodeMaxRows;
  return short_queries ? Impl::decode : Impl::fused;
}

Impl resolve_backward(Impl impl, DType dtype) {
  if (impl == Impl::decode)
    throw Error("fattn: impl decode has no backward; the backward runs fused, naive or reference");
  if (dtype == DType::float64) return reference_for_float64(impl);
  return impl == Impl::automatic ? Impl::fused : impl;
}

// The CPU kernels of one direction (forward or backward) of a table: its naive and fused
// kernels and their working memory, and its fallback table's (cpu::Kernels::fallback: the
// AMX table's kernels return false on inputs that do not split into bfloat16 parts, and the
// AVX-512 ones run them in the same working memory, decided here, not inside the kernels).
struct DirectionKernels {
  struct Table {
    std::int64_t (*workspace_floats)(const detail::Problem& p, bool naive, int workers) = nullptr;
    cpu::KernelFn naive = nullptr, fused = nullptr;
  };
  const char* name;
  Table own, fallback;  // fallback: nulls where the table has none
  bool records_stages;  // the naive kernel's stage times go to fattn::last_naive_stage_seconds()

  // Floats of working memory for the table's kernel and its fallback's (-1: a size
  // overflowed).
  std::int64_t workspace_floats(const detail::Problem& p, bool naive, int workers) const {
    const std::int64_t floats = own.workspace_floats(p, naive, workers);
    if (!fallback.workspace_floats || floats < 0) return floats;
    const std::int64_t other = fallback.workspace_floats(p, naive, workers);
    return other < 0 ? -1 : std::max(floats, other);
  }
  // Runs the naive or fused kernel, and the fallback's where it returns false.
  void run(bool naive, const detail::Problem& p, const detail::Exec& exec, float* memory) const {
    if ((naive ? own.naive : own.fused)(p, exec, memory)) return;
    if (!fallback.fused)
      throw Error(std::string("fattn: internal error: a CPU ") + name +
                  " kernel declined its inputs and its table has no fallback");
    (naive ? fallback.naive : fallback.fused)(p, exec, memory);
  }
};
DirectionKernels::Table forward_table(const cpu::Kernels* k) {
  if (!k) return {};
  return {k->workspace_floats, k->naive, k->fused};
}
DirectionKernels::Table backward_table(const cpu::Kernels* k) {
  if (!k) return {};
  return {k->backward_workspace_floats, k->naive_backward, k->fused_backward};
}
DirectionKernels forward_kernels_of(const cpu::Kernels& k) {
  return {"forward", forward_table(&k), forward_table(k.fallback), true};
}
DirectionKernels backward_kernels_of(const cpu::Kernels& k) {
  return {"backward", backward_table(&k), backward_table(k.fallback), false};
}

// Floats of working memory; every size product is checked for overflow.
std::int64_t workspace_floats(const detail::Problem& p, const DirectionKernels& direction,
                              Impl impl, int workers) {
  if (impl == Impl::reference) return 0;
  const std::int64_t floats = direction.workspace_floats(p, impl == Impl::naive, workers);
  std::int64_t bytes = 0;
  if (floats < 0 || !detail::checked_mul(floats, sizeof(float), &bytes))
    throw Error(std::string("fattn: the ") + to_string(impl) + " " + direction.name +
                "'s working memory for this problem would overflow 64 bits");
  return floats;
}

// Runs the decode kernel in its leased working memory.
void run_decode(const detail::Problem& p, const detail::Exec& exec, const Options& options) {
  const cpu::Kernels& kernels = detail::forward_kernels(options, p);
  const detail::WorkspaceLease workspace(
      detail::decode_workspace_floats(kernels, p, exec, options), to_string(Impl::decode));
  kernels.decode(p, exec, workspace.get(), cpu::DecodeRequest::of(options));
}

// Runs the naive or fused kernel of a pass (not the reference) in its leased working memory.
void run(const detail::Problem& p, const detail::Exec& exec, const DirectionKernels& direction,
         Impl impl) {
  const detail::WorkspaceLease workspace(workspace_floats(p, direction, impl, exec.workers),
                                         to_string(impl));
  if (impl != Impl::naive) return direction.run(false, p, exec, workspace.get());
  // The naive kernels time their stages (fattn::last_naive_stage_seconds()).
  NaiveStageSeconds stages;
  detail::Problem timed = p;
  timed.naive_stages = &stages;
  direction.run(true, timed, exec, workspace.get());
  if (direction.records_stages) detail::record_naive_stage_seconds(stages);
}

#ifdef FATTN_WITH_CUDA
// What no CUDA kernel takes (an attn_mask is refused in the CUDA plan, naming the kernel).
void reject_what_cuda_lacks(const TensorView& q, const Options& options) {
  if (q.dtype == DType::float64)
    throw Error("fattn: float64 runs only on the CPU reference; q is a float64 cuda tensor");
  if (options.dropout_p != 0.0)
    throw Error("fattn: the CUDA C++ kernels take dropout_p = 0; dropout runs on the CPU "
                "kernels and on fattn's Triton kernels (torch.ops.fattn on CUDA tensors)");
}
#endif

}  // namespace

void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const TensorView* lse, const Options& options) {
#ifdef FATTN_WITH_CUDA
  if (q.device == Device::cuda) {
    reject_what_cuda_lacks(q, options);
    return cuda::attention_forward(q, k, v, out, lse, options);
  }
#endif
  require_cpu(q);
  const detail::Problem p = detail::make_problem(q, k, v, &out, lse, options);
  const detail::Exec exec = detail::make_exec(options);
  const Impl impl = resolve(options.impl, q.dtype, p);
  if (impl == Impl::reference) return cpu::reference_forward(p, exec);
  if (impl == Impl::decode) return run_decode(p, exec, options);
  run(p, exec, forward_kernels_of(cpu_kernels(options, p, Direction::forward)), impl);
}

ForwardPlan forward_plan(const TensorView& q, const TensorView& k, const TensorView& v,
                         const Options& options) {
  if (q.device == Device::cuda)
    throw Error("fattn: forward_plan describes the CPU kernels; q is on cuda");
  require_cpu(q);
  const detail::Problem p = detail::make_problem(q, k, v, nullptr, nullptr, options);
  const Impl impl = resolve(options.impl, q.dtype, p);
  if (impl == Impl::reference) return {impl, Isa::portable, Products::float64};
  return detail::cpu_forward_plan(detail::forward_kernels(options, p), p, impl, options);
}

std::int64_t extra_bytes(const TensorView& q, const TensorView& k, const TensorView& v,
                         const Options& options) {
#ifdef FATTN_WITH_CUDA
  if (q.device == Device::cuda) {
    reject_what_cuda_lacks(q, options);
    return cuda::extra_bytes(q, k, v, options);
  }
#endif
  require_cpu(q);
  const detail::Problem p = detail::make_problem(q, k, v, nullptr, nullptr, options);
  const Impl impl = resolve(options.impl, q.dtype, p);
  const detail::Exec exec = detail::make_exec(options);
  const int workers = exec.workers;
  if (impl == Impl::reference) {  // per worker: Sk scores and D outputs in float64
    // and a q8_0 cache's K and V widened to float32 first
    const std::int64_t widened = p.kv_q8_0 ? 2 * p.batch * p.kv_heads * p.kv_len * p.head_dim : 0;
    return workers * (p.kv_len + p.head_dim) * static_cast<std::int64_t>(sizeof(double)) +
           widened * static_cast<std::int64_t>(sizeof(float));
  }
  if (impl == Impl::decode)
    return detail::decode_workspace_floats(detail::forward_kernels(options, p), p, exec, options) *
           static_cast<std::int64_t>(sizeof(float));
  const DirectionKernels direction =
      forward_kernels_of(cpu_kernels(options, p, Direction::forward));
  return workspace_floats(p, direction, impl, workers) * static_cast<std::int64_t>(sizeof(float));
}

void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const TensorView& dout, const TensorView& lse,
                        const TensorView* dlse, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, const Options& options,
                        const TensorView* dsinks) {
#ifdef FATTN_WITH_CUDA
  if (q.device == Device::cuda) {
    reject_what_cuda_lacks(q, options);
    return cuda::attention_backward(q, k, v, out, dout, lse, dlse, dq, dk, dv, options, dsinks);
  }
#endif
  require_cpu(q);
  const detail::Problem p =
      detail::make_backward_problem(q, k, v, out, dout, lse, dlse, dq, dk, dv, options, dsinks);
  const detail::Exec exec = detail::make_exec(options);
  const Impl impl = resolve_backward(options.impl, q.dtype);
  expect_dropout_kernel(impl, p);
  if (impl == Impl::reference) return cpu::reference_backward(p, exec);
  run(p, exec, backward_kernels_of(cpu_kernels(options, p, Direction::backward)), impl);
  if (p.mods.sinks) cpu::sink_gradients(p, exec);
}

std::int64_t backward_extra_bytes(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const Options& options) {
  if (q.device == Device::cuda)
    throw Error("fattn: backward_extra_bytes describes the CPU kernels; q is on cuda");
  require_cpu(q);
  detail::expect_no_q8_0_cache("the backward", "q8_0 is a forward-only cache format", q, k, v);
  const detail::Problem p = detail::make_problem(q, k, v, nullptr, nullptr, options);
  const Impl impl = resolve_backward(options.impl, q.dtype);
  const int workers = detail::make_exec(options).workers;
  if (impl == Impl::reference)  // per worker: dk, dv of one kv head and a few rows, float64
    return workers * (2 * p.kv_len * p.head_dim + p.kv_len + 2 * p.head_dim) *
           static_cast<std::int64_t>(sizeof(double));
  const DirectionKernels direction =
      backward_kernels_of(cpu_kernels(options, p, Direction::backward));
  return workspace_floats(p, direction, impl, workers) * static_cast<std::int64_t>(sizeof(float));
}

double reference_row(const TensorView& q, const TensorView& k, const TensorView& v,
                     const Options& options, std::int64_t b, std::int64_t h, std::int64_t i,
                     double* out_row) {
  require_cpu(q);
  const detail::Problem p = detail::make_problem(q, k, v, nullptr, nullptr, options);
  if (b < 0 || b >= p.batch || h < 0 || h >= p.q_heads || i < 0 || i >= p.q_len)
    throw Error("fattn: reference_row index (" + std::to_string(b) + ", " + std::to_string(h) +
                ", " + std::to_string(i) + ") is outside q's (B, Hq, Sq) = (" +
                std::to_string(p.batch) + ", " + std::to_string(p.q_heads) + ", " +
                std::to_string(p.q_len) + ")");
  if (out_row == nullptr) throw Error("fattn: reference_row out_row must not be null");
  return cpu::reference_row(p, b, h, i, out_row);
}

const char* version() { return FATTN_VERSION; }

namespace detail {

const cpu::Kernels& forward_kernels(const Options& options, const Problem& p) {
  return cpu_kernels(options, p, Direction::forward);
}

ForwardPlan cpu_forward_plan(const cpu::Kernels& kernels, const Problem& p, Impl impl,
                             const Options& options) {
  const Products products = kernels.products(p, impl);
  ForwardPlan plan{impl, kernels.isa, products, bf16_products_reason(options, kernels, p, products), {}};
  if (impl == Impl::decode)
    plan.decode = kernels.decode_plan(p, make_exec(options).workers, cpu::DecodeRequest::of(options));
  return plan;
}

// run(b, one, memory) for each sequence b of `shared` in one parallel section, one worker
// each (Exec one), in that worker's slice of `slice` floats of one working-memory lease (a
// fresh allocation per sequence would be page-faulted in on every call). The first
// exception stops the other sequences and is rethrown here. what: the working memory's
// owner in the overflow error; lease: its name in the workspace cache.
template <class Run>
void run_side_by_side(const Exec& exec, const std::vector<std::int64_t>& shared,
                      std::int64_t slice, const char* what, const char* lease, Run&& run) {
  if (shared.empty()) return;
  std::int64_t floats = 0;
  if (!checked_mul(slice, exec.workers, &floats))
    throw Error(std::string("fattn: the ") + what +
                "'s working memory for this batch would overflow 64 bits");
  const WorkspaceLease memory(floats, lease);
  const Exec one{1, nullptr};
  std::exception_ptr failed;
  std::atomic<bool> stop{false};
  parallel_items(exec, static_cast<std::int64_t>(shared.size()), [&](std::int64_t i, int worker) {
    if (stop.load(std::memory_order_relaxed)) return;
    try {  // an exception must not leave the parallel section
      run(shared[static_cast<std::size_t>(i)], one, memory.get() + worker * slice);
    } catch (...) {
      if (!stop.exchange(true)) failed = std::current_exception();
    }
  });
  if (failed) std::rethrow_exception(failed);
}

// The fused kernel of `pass` over the sequences of ragged problem p that `elsewhere` leaves
// to it, in waves of consecutive sequences whose working memory, bytes(b) for sequence b,
// takes about the wave budget: a wave's pre-pass writes it (the forward: K and V packed as
// float32; the backward: those and the query tiles' operands and dQ partials), and its
// items read it back from L3. In one wave, 64 sequences of 16-512 tokens pack ~116 MB of
// K and V at D = 128 before the first item, which then reads them from DRAM. Measured on
// dev-zen5 (32 MiB L3), 2 threads, that mix, loop/ragged (the per-sequence loop's time
// over the ragged call's): forward, no waves 0.93-1.02×, waves of 4 MB 1.00-1.02×, 16 MB
// 0.98-1.00×, 64 MB 0.91-1.00× (docs/perf-log.md, 2026-11-27, "varlen in waves");
// backward, see "ragged backward" there (every sequence of the mix in waves then; now
// only those that need every thread). Each wave costs the kernel's fork-joins (two
// forward, three backward); 16 MiB made 7 forward waves of that mix. At least 2 MiB a
// worker (about 16 work items a worker at Hkv = 8, D = 128), so that on many cores a
// wave still keeps them busy (not measured beyond 2 threads).
constexpr double kWaveBytes = 16.0 * (1 << 20);
constexpr double kWaveBytesPerWorker = 2.0 * (1 << 20);

template <class Bytes>
void run_fused_in_waves(const Problem& p, const std::vector<std::uint8_t>& elsewhere,
                        const Exec& exec, const DirectionKernels& direction, Bytes&& bytes) {
  const double budget = std::max(kWaveBytes, kWaveBytesPerWorker * exec.workers);
  std::vector<std::uint8_t> outside(elsewhere.size());
  for (std::int64_t b = 0; b < p.batch;) {
    std::fill(outside.begin(), outside.end(), std::uint8_t{1});
    double wave_bytes = 0.0;
    bool any = false;  // a sequence with queries (one without gives no item)
    for (; b < p.batch && (!any || wave_bytes < budget); ++b) {
      if (elsewhere[static_cast<std::size_t>(b)]) continue;
      outside[static_cast<std::size_t>(b)] = 0;
      wave_bytes += bytes(b);
      any = any || p.queries_of(b) > 0;
    }
    if (!any) return;
    Problem wave = p;
    wave.ragged.elsewhere = outside.data();
    run(wave, exec, direction, Impl::fused);
  }
}

// A ragged problem (attention_varlen) under impl auto or fused runs its sequences as
// schedule_sequences puts them. Those with at least 1/workers of the work need every
// worker: on the fused kernel all at once, their items in one parallel section
// (model/ragged_schedule.hpp), in waves (run_fused_in_waves); on the decode kernel one
// after another, their keys split as in a call of their own (two sequences of one query
// and 32k keys on 16 threads must not take two threads). The others run side by side, one
// worker each, heaviest first, in one parallel section, each in its worker's caches. Under
// auto, a sequence that a call of its own would run on the decode kernel (resolve: few
// query rows) runs on it here too. Measured on dev-zen5, 2 threads (docs/perf-log.md,
// 2026-11-27, "varlen forward side by side"), the per-sequence loop's time over this
// call's: 64 sequences of 16-512 tokens 1.01-1.05× (every sequence's items in waves:
// 0.96-1.00×); 60 of 16-64 tokens and 4 of 256-1024 1.09-1.26× (1.04-1.21×). A sequence
// with queries and no keys goes to the fused kernel's items (rows 0, lse −inf or the
// sink). The fused kernels of every table take the ragged items (the AMX one when isa amx
// is asked for: isa auto runs avx512 for a ragged batch, cpu_kernels). The naive and
// decode impls run the sequences one after another; a sequence without keys goes to the
// reference there, a sequence without queries nowhere.
void ragged_forward(const Problem& p, const Exec& exec, const Options& options) {
  const Impl impl = p.dtype == DType::float64 ? reference_for_float64(options.impl) : options.impl;
  expect_dropout_kernel(impl, p);
  if (impl == Impl::reference) return cpu::reference_forward(p, exec);
  const cpu::Kernels& kernels = cpu_kernels(options, p, Direction::forward);
  const DirectionKernels direction = forward_kernels_of(kernels);
  if (impl == Impl::automatic || impl == Impl::fused) {
    std::vector<std::uint8_t> on_decode(static_cast<std::size_t>(p.batch), 0);
    if (impl == Impl::automatic)
      for (std::int64_t b = 0; b < p.batch; ++b) {
        const Problem s = p.sequence(b);
        on_decode[static_cast<std::size_t>(b)] =
            s.q_len > 0 && s.kv_len > 0 && resolve(Impl::automatic, p.dtype, s) == Impl::decode;
      }
    auto decoded = [&](std::int64_t b) { return on_decode[static_cast<std::size_t>(b)] != 0; };
    const SequenceSchedule schedule = schedule_sequences(p, exec.workers, [&](std::int64_t b) {
      return p.queries_of(b) > 0 && p.keys_of(b) > 0;
    });
    std::vector<std::uint8_t> not_fused_items(static_cast<std::size_t>(p.batch), 1);
    for (std::int64_t b = 0; b < p.batch; ++b)
      if (p.queries_of(b) > 0 && p.keys_of(b) == 0) not_fused_items[static_cast<std::size_t>(b)] = 0;
    for (std::int64_t b : schedule.alone)
      if (!decoded(b)) not_fused_items[static_cast<std::size_t>(b)] = 0;
    run_fused_in_waves(p, not_fused_items, exec, direction, [&](std::int64_t b) {
      return 2.0 * sizeof(float) * static_cast<double>(p.kv_heads) *
             static_cast<double>(p.keys_of(b)) * static_cast<double>(p.head_dim);
    });
    for (std::int64_t b : schedule.alone)
      if (decoded(b)) run_decode(p.sequence(b), exec, options);
    const Exec one{1, nullptr};
    std::int64_t slice = 0;  // floats of the largest shared sequence's working memory
    for (std::int64_t b : schedule.shared)
      slice = std::max(slice, decoded(b) ? decode_workspace_floats(kernels, p.sequence(b), one, options)
                                         : workspace_floats(p.sequence(b), direction, Impl::fused, 1));
    return run_side_by_side(exec, schedule.shared, slice, "forward", to_string(Impl::fused),
                            [&](std::int64_t b, const Exec& on_one, float* memory) {
                              if (decoded(b))
                                kernels.decode(p.sequence(b), on_one, memory, cpu::DecodeRequest::of(options));
                              else
                                direction.run(false, p.sequence(b), on_one, memory);
                            });
  }
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const Problem s = p.sequence(b);
    if (s.q_len == 0) continue;
    if (s.kv_len == 0) cpu::reference_forward(s, exec);
    else if (impl == Impl::decode) run_decode(s, exec, options);
    else run(s, exec, direction, impl);
  }
}

// The zero gradients of the sequences of ragged problem p without queries or keys (those
// `empty` marks), side by side through the reference; without the sinks, whose gradient
// the reference would write from every worker (cpu::sink_gradients computes it afterwards
// for every sequence's rows).
void zero_gradients(const Problem& p, const std::vector<std::int64_t>& empty, const Exec& exec) {
  run_side_by_side(exec, empty, 0, "backward", to_string(Impl::reference),
                   [&](std::int64_t b, const Exec& one, float*) {
                     Problem s = p.sequence(b);
                     s.mods.sinks = nullptr;
                     s.dsinks = nullptr;
                     cpu::reference_backward(s, one);
                   });
}

// The backward of a ragged batch: the reference over all sequences at once; the kernels as
// schedule_sequences puts the sequences. Those with at least 1/workers of the work run on
// every worker: on the fused kernels all at once, their items in one parallel section
// (cpu/backward/ragged.hpp, in waves: run_fused_in_waves); on the naive kernels one after
// another. The others run side by side, one worker
// each, in one parallel section: a sequence's working memory stays in its worker's caches
// from its pre-pass to its last item. Measured on dev-zen5, 2 threads, 64 sequences of
// 16-512 tokens (none with 1/2 of the work), the per-sequence loop's time over this call's:
// side by side 0.92-1.22×, every sequence's items in waves 0.86-0.93× (docs/perf-log.md,
// 2026-11-27, "ragged backward"). A sequence without (query, key) pairs gets zero gradients
// (zero_gradients); with sinks, dsinks is summed over every sequence's rows afterwards
// (cpu::sink_gradients reads a ragged problem).
void ragged_backward(const Problem& p, const Exec& exec, const Options& options) {
  const Impl impl = resolve_backward(options.impl, p.dtype);
  expect_dropout_kernel(impl, p);
  if (impl == Impl::reference) return cpu::reference_backward(p, exec);
  const cpu::Kernels& kernels = cpu_kernels(options, p, Direction::backward);
  const DirectionKernels direction = backward_kernels_of(kernels);
  std::vector<std::int64_t> empty;
  for (std::int64_t b = 0; b < p.batch; ++b)
    if (p.queries_of(b) == 0 || p.keys_of(b) == 0) empty.push_back(b);
  zero_gradients(p, empty, exec);
  const SequenceSchedule schedule = schedule_sequences(p, exec.workers, [&](std::int64_t b) {
    return p.queries_of(b) > 0 && p.keys_of(b) > 0;
  });
  if (impl == Impl::fused) {
    std::vector<std::uint8_t> not_alone(static_cast<std::size_t>(p.batch), 1);
    for (std::int64_t b : schedule.alone) not_alone[static_cast<std::size_t>(b)] = 0;
    run_fused_in_waves(p, not_alone, exec, direction, [&](std::int64_t b) {
      return static_cast<double>(workspace_floats(p.sequence(b), direction, impl, 1)) *
             sizeof(float);
    });
  } else {
    for (std::int64_t b : schedule.alone) run(p.sequence(b), exec, direction, impl);
  }
  std::int64_t slice = 0;  // floats of the largest shared sequence's working memory
  for (std::int64_t b : schedule.shared)
    slice = std::max(slice, workspace_floats(p.sequence(b), direction, impl, 1));
  run_side_by_side(exec, schedule.shared, slice, "backward", to_string(impl),
                   [&](std::int64_t b, const Exec& one, float* memory) {
                     direction.run(impl == Impl::naive, p.sequence(b), one, memory);
                   });
  if (p.mods.sinks) cpu::sink_gradients(p, exec);
}

std::int64_t decode_workspace_floats(const cpu::Kernels& kernels, const Problem& p,
                                     const Exec& exec, const Options& options) {
  const std::int64_t floats = kernels.decode_workspace_floats(p, exec.workers, cpu::DecodeRequest::of(options));
  std::int64_t bytes = 0;
  if (floats < 0 || !checked_mul(floats, sizeof(float), &bytes))
    throw Error(
        "fattn: the decode kernel's working memory for this problem would overflow 64 bits");
  return floats;
}

void expect_cuda_backend(const TensorView& q) {
#ifndef FATTN_WITH_CUDA
  if (q.device == Device::cuda)
    throw Error("fattn: q is on cuda, but this build of fattn has no CUDA backend "
                "(rebuild with -DFATTN_CUDA=ON)");
#else
  (void)q;
#endif
}

}  // namespace detail

}  // namespace fattn
