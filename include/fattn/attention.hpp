// fattn — exact scaled-dot-product attention: O = softmax(Q Kᵀ · scale) V.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "fattn/tensor.hpp"

namespace fattn {

// Every error fattn reports is this exception. Invalid arguments are found before
// any memory is touched; the message names the argument, the expected and the
// actual value, e.g. "fattn: k.size(3) (head dim) must equal q.size(3) = 64, got 32".
// A working-memory allocation that fails is reported with it too.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Which keys a query may see.
//   top_left:     query i sees keys j <= i                (PyTorch's is_causal)
//   bottom_right: query i sees keys j <= i + (Sk - Sq)    (FlashAttention's causal)
// With bottom_right and Sq > Sk the first Sq - Sk queries see no key at all:
// their output row is 0 and their logsumexp is -inf.
enum class Causal : std::uint8_t { none, top_left, bottom_right };

// The implementation to run. All of them are reached through attention_forward,
// so tests and benchmarks compare them through the same call.
//   reference: plain loops, float64 accumulation (for tests; slow)
//   naive:     3 stages — scores = Q·Kᵀ·scale to an Sq×Sk buffer, softmax, O = P·V
//   fused:     tiled, online softmax; the Sq×Sk matrix never leaves cache
//   decode:    for short queries (decode, chunked prefill): the query rows of every head
//              sharing a kv head form one tile, K and V are read in place (a KV cache),
//              keys split across threads when there are few rows (cpu/decode/decode.hpp); CPU only
//   automatic: the best for this device and problem: decode for short queries (Sq ≤ 64
//              and Sq·Hq/Hkv ≤ 128 on the CPU, measured), else fused
enum class Impl : std::uint8_t { automatic, reference, naive, fused, decode };

// CPU instruction set for the naive and fused kernels. automatic picks the fastest this
// CPU supports for the problem (the forward: automatic_cpu_isa; the backward: the best);
// asking for one it lacks is an Error.
//   amx:      AVX-512, AVX512-BF16 and AMX bfloat16 tiles (Sapphire Rapids and later,
//             Linux): the products (Q·Kᵀ, P·V; in the backward all five) from six bfloat16
//             partial products of each float32 split in three parts, float32 accumulation
//             — float32 accuracy (cpu/amx/ops.hpp). Inputs with NaN/Inf run the avx512
//             kernels.
//   avx512, avx2: float32 FMA micro-kernels.   portable: compiler-vectorised, any CPU.
enum class Isa : std::uint8_t { automatic, amx, avx512, avx2, portable };

// The instructions a CPU forward's products (Q·Kᵀ, P·V) run on: the peak its speed is
// measured against (fattn-bench's roof) and the rounding to expect.
//   float64:  the reference's float64 loops
//   fma:      float32 FMAs; 16-bit elements are widened to float32 as they are loaded
//   bf16_dot: AVX512-BF16's vdpbf16ps on pairs of bfloat16, float32 sums; P is rounded
//             to bfloat16 for P·V (the float32 P·V runs instead for inputs or tiles with
//             NaN/Inf values, and in the decode kernel's items of under 48 query rows for
//             the tiles some row does not see whole)
//   amx:      AMX tiles (TDPBF16PS) on float32 split into bfloat16 parts (inputs with
//             NaN/Inf run the avx512 kernels: fma)
enum class Products : std::uint8_t { float64, fma, bf16_dot, amx };

// What bfloat16 inputs on avx512 multiply on in the fused forward and the decode kernel
// (the naive kernels and the backward widen them to float32 FMAs always; other dtypes and
// ISAs ignore it):
//   automatic: the faster of the two on this CPU (bf16_products_choice())
//   bf16_dot:  vdpbf16ps (Products::bf16_dot; an Error where this CPU or build has no
//              AVX512-BF16, or the call runs on another ISA)
//   fma:       widened to float32 as they are loaded, float32 FMAs (Products::fma)
enum class Bf16Products : std::uint8_t { automatic, bf16_dot, fma };

const char* to_string(Causal causal);
const char* to_string(Impl impl);
const char* to_string(Isa isa);
const char* to_string(Products products);
const char* to_string(Bf16Products products);
Impl parse_impl(const std::string& name);  // throws Error on an unknown name
Isa parse_isa(const std::string& name);    // throws Error on an unknown name
Bf16Products parse_bf16_products(const std::string& name);  // auto, bf16_dot, fma

// How CPU work items are spread over threads. By default fattn uses its own
// OpenMP team; a host framework (e.g. PyTorch) can pass its own pool instead so
// that the two do not oversubscribe the cores. run() must call
// worker(arg, w) exactly once for every w in [0, workers), concurrently or not.
struct ParallelRunner {
  void (*run)(void* context, int workers, void (*worker)(void* arg, int worker_index),
              void* arg) = nullptr;
  void* context = nullptr;
};

// Device working memory for the CUDA backend (the naive path's Sq×Sk buffer, repacked
// inputs). By default fattn takes it with cudaMallocAsync on the call's stream; a host
// framework can pass its own allocator instead, so that the memory comes from (and is
// counted by) its pool. allocate may throw; it must return memory usable on `stream`
// until deallocate(ptr) is called, which fattn does after enqueueing its last kernel.
struct DeviceAllocator {
  void* (*allocate)(void* context, std::int64_t bytes, void* stream) = nullptr;
  void (*deallocate)(void* context, void* ptr, void* stream) = nullptr;
  void* context = nullptr;
};

struct Options {
  std::optional<double> scale;  // default 1/sqrt(head_dim); must be finite
  Causal causal = Causal::none;
  Impl impl = Impl::automatic;
  Isa isa = Isa::automatic;
  int num_threads = 0;                        // 0: all cores (OMP_NUM_THREADS is honoured)
  const ParallelRunner* runner = nullptr;     // nullptr: fattn's OpenMP team
  void* cuda_stream = nullptr;                // for the CUDA backend (cudaStream_t)
  const DeviceAllocator* device_allocator = nullptr;  // nullptr: cudaMallocAsync
  // float32 on CUDA: allow TF32 tensor-core products (Q·Kᵀ in TF32, P·V with V kept
  // near float32: half the tensor-core work, errors up to ~1e-3 instead of ~1e-5), as
  // torch.backends.cuda.matmul.allow_tf32 allows for matmuls. Off: 3xTF32, float32-
  // level accuracy. The CPU ignores it (always float32).
  bool allow_tf32 = false;
  // The decode kernel's key splits (flash-decoding): 0 picks them from the problem and
  // the thread count; n > 0 asks for n chunks per sequence (1: no split). Results are
  // the same bits on every run with the same threads and splits.
  int kv_splits = 0;
  // The CPU decode kernel's software prefetch distance, in key tiles: while it computes a
  // key tile it asks memory for the rows of the tile this many ahead (every kv head of its
  // item, K then V, in address order). -1 chooses (DecodePlan::prefetch_tiles says what
  // and why); 0 leaves the streaming to the hardware prefetchers; 1 to 4 for the
  // benchmark that measures the choice. The results are the same bits for every value.
  int decode_prefetch_tiles = -1;
  // The cache level that software prefetch fills: 1 (PREFETCHT0: L1 and the levels below
  // it), 2 (PREFETCHT1: L2, where the core keeps the hint apart, as Zen 4 does; on Zen 3
  // every hint fills L1). A tile's lines asked for a tile ahead do not fit L1
  // beside the tile being computed, so a fill of L1 is fetched into it again by the loads
  // (docs/perf-log.md, 2026-12-07). -1 takes decode_prefetch_level_choice() (the core
  // probed); 1 and 2 for the benchmark that measures the choice. The results are the same
  // bits for both.
  int decode_prefetch_level = -1;
  // The CUDA decode kernel's cp.async ring depth per warp: 0 chooses (the deepest of 3
  // the device's shared memory takes); 2 to 4 for the benchmark that measures the choice.
  int decode_stages = 0;
  // bfloat16 inputs on avx512: vdpbf16ps or float32 FMAs (Bf16Products; automatic: the
  // faster on this CPU, bf16_products_choice()).
  Bf16Products bf16_products = Bf16Products::automatic;

  // --- Variants (CPU: every kernel and ISA, the decode kernel forward only; not CUDA) ----
  // Applied in this order to the scaled scores s = scale · q·k of each (query i, key j):
  //   softcap:      s ← softcap · tanh(s / softcap)            (Gemma 2); 0: off
  //   alibi_slopes: s ← s − slope[b][h] · |i + Sk − Sq − j|     (FlashAttention's ALiBi)
  //   attn_mask:    boolean: the pair takes part where true; additive: s ← s + mask
  //                 (s ← s + attn_mask_scale[h] · mask where a scale is given: ggml's ALiBi)
  //   window, causal: keys outside [i + offset − window_left, i + offset + window_right]
  //                 take no part (−1: unbounded on that side); offset is the causal
  //                 alignment's (0 for top_left, Sk − Sq otherwise: bottom-right)
  //   sinks:        one logit per query head joins every row's softmax denominator
  //                 (gpt-oss): out = Σ_j e^(s_j) v_j / (e^sink + Σ_j e^(s_j))
  // A row with no visible key gives out 0 and lse −inf (with sinks: lse = sink).
  // attn_mask: boolean (true: takes part) or additive in float32, float16 or bfloat16
  // whatever q's dtype (float64 too for float64 problems; torch SDPA's rule, bool or q's
  // dtype, is a special case), sizes (B or 1, Hq or 1, Sq or 1, Sk or 1), read through its
  // strides; a size-1 dimension is broadcast. alibi_slopes: float32 (Hq) or (B, Hq).
  // sinks: float32 (Hq). attn_mask_scale: float32 (Hq), every value finite and > 0, with
  // an additive attn_mask only: head h adds attn_mask_scale[h] · mask (ggml's
  // FLASH_ATTN_EXT ALiBi: the mask holds −|distance|, the per-head slope scales it;
  // a −inf element stays −inf).
  const TensorView* attn_mask = nullptr;
  std::int64_t window_left = -1, window_right = -1;
  double softcap = 0.0;
  const TensorView* alibi_slopes = nullptr;
  const TensorView* sinks = nullptr;
  const TensorView* attn_mask_scale = nullptr;

  // --- Attention dropout (training; CPU forward and backward) -----------------------------
  // dropout_p in [0, 1): each normalized probability P[b,h,i,j] is kept with probability
  // 1 − p and scaled by 1/(1 − p), or dropped, before P·V (torch's SDPA semantics); the lse
  // is the undropped one. Which are kept is a function of (dropout_seed, dropout_offset,
  // b, h, i, j) (Philox4x32-10, src/model/dropout.hpp): the backward given the same seed
  // and offset regenerates the forward's mask, on any thread count. b counts sequences
  // (attention_varlen: the packed sequence), i and j are within the sequence. Runs on the
  // fused kernels (impl auto or fused, isa avx512, avx2 or portable) and the reference.
  double dropout_p = 0.0;
  std::uint64_t dropout_seed = 0;
  std::uint32_t dropout_offset = 0;
};

// The dropout mask the options' dropout_p, dropout_seed and dropout_offset give a call of
// batch (attention_varlen: sequences) × q_heads × q_len × kv_len: keep[((b·Hq + h)·Sq + i)·Sk
// + j] = 1 where P[b,h,i,j] survives (every element 1 with dropout_p 0). For tests, and for
// callers that reproduce fattn's dropout elsewhere (src/model/dropout.hpp defines it).
void dropout_mask(const Options& options, std::int64_t batch, std::int64_t q_heads,
                  std::int64_t q_len, std::int64_t kv_len, std::uint8_t* keep);

// The head dims attention_forward and attention_backward take: D in [kMinHeadDim, kMaxHeadDim].
inline constexpr std::int64_t kMinHeadDim = 16;
inline constexpr std::int64_t kMaxHeadDim = 256;
// The farthest Options::decode_prefetch_tiles takes.
inline constexpr int kMaxDecodePrefetchTiles = 4;
// The deepest cache level Options::decode_prefetch_level names.
inline constexpr int kMaxDecodePrefetchLevel = 2;

// q: (B, Hq, Sq, D)   k, v: (B, Hkv, Sk, D)   out: (B, Hq, Sq, D)   lse: (B, Hq, Sq) float32
// Hq must be a multiple of Hkv (GQA; Hkv = 1 is MQA). D in [16, 256]. lse may be null.
// dtype: float32, bfloat16 or float16, one for q, k, v and out (the CPU computes in
// float32 and rounds out once; on the CPU a 16-bit forward may write a float32 out,
// unrounded; isa amx takes float32 only); float64 on the CPU runs the
// float64 reference (Impl::automatic or Impl::reference) and takes a float64 lse.
// lse is the natural-log logsumexp of the scaled, masked scores of each query row.
void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const TensorView* lse, const Options& options = {});

// Gradients of attention_forward (FlashAttention-2's backward): given the forward's
// out and lse and the gradient dout of out, writes dq, dk, dv. dlse, the gradient of
// the lse output, may be null (no gradient flows through lse).
//   q, dq: (B, Hq, Sq, D)   k, v, dk, dv: (B, Hkv, Sk, D)   out, dout: (B, Hq, Sq, D)
//   lse, dlse: (B, Hq, Sq), float32 (float64 for float64 problems)
//   q, k, v, out, dout, dq, dk, dv share one dtype: float32, bfloat16 or float16
//   (float32 accumulation, the gradients rounded once), or float64 (the reference)
// With GQA, dk and dv sum the contributions of every query head sharing a kv head.
//   fused:     scores recomputed tile by tile from q, k and lse (no Sq×Sk storage);
//              deterministic: the same bits on every run with the same thread count
//   naive:     P, dP and dS materialised as Sq×Sk matrices, as a framework would
//   reference: float64 loops (also the float64 path, for gradient checks)
// The options (scale, causal, variants, impl, threads) must be those of the forward call.
// dsinks: float32 (Hq), the sinks' gradient, required when options.sinks is set.
void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const TensorView& dout, const TensorView& lse,
                        const TensorView* dlse, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, const Options& options = {},
                        const TensorView* dsinks = nullptr);

// On CUDA views the Hopper backward runs (compute capability 9.0, float16/bfloat16, head dims
// up to 128, causal either alignment, windows, softcap, ALiBi, sinks, GQA; no attn_mask:
// cuda_backward_refusal), enqueued on options.cuda_stream without synchronising, and
// deterministic (no atomics: the same bits on every run).
std::string cuda_backward_refusal(const TensorView& q, const TensorView& k, const Options& options = {});
// The head dims the Hopper backward is compiled for (empty without it); smaller ones run on
// the next one.
std::vector<int> cuda_backward_head_dims();

// Bytes of working memory attention_backward allocates for this problem, for a dout
// laid out like q (a dout with strided dims adds a copy of it).
std::int64_t backward_extra_bytes(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const Options& options = {});

// Bytes of working memory the chosen implementation allocates for this problem
// (the naive path's Sq×Sk buffer, per-thread tiles, packed operands).
std::int64_t extra_bytes(const TensorView& q, const TensorView& k, const TensorView& v,
                         const Options& options = {});

// How the decode kernel cuts and reads one call (ForwardPlan::decode where impl is decode).
struct DecodePlan {
  // How a key tile's scores are computed: "direct" (each key row multiplied where it lies,
  // for a few query rows), "transposed" (the tile transposed first), "query_lanes" (the
  // query rows along the vector lanes, for many rows); "bf16_dot " before it where a
  // bfloat16 cache runs on vdpbf16ps.
  std::string scores;
  bool reads_in_place = false;      // K and V read where they lie (else staged as float32)
  std::int64_t key_tile = 0;        // keys per tile
  std::int64_t rows = 0;            // query rows per kv head: Sq × (Hq / Hkv)
  std::int64_t heads_per_item = 0;  // kv heads a work item takes each key tile for
  std::int64_t splits = 0;          // key chunks per sequence (split-KV)
  int prefetch_tiles = 0;           // key tiles ahead its software prefetch asks for (0: none)
  int prefetch_level = 0;           // the cache level that prefetch fills (1: L1, 2: L2; 0: none)
  std::int64_t items = 0;           // work items: batch × head groups × row tiles × splits
  std::string reason;               // the rules and the numbers behind the fields above
};

// What attention_forward runs for these inputs and options on this CPU: the kernel
// (automatic resolved), the instruction set of its table (the reference: portable) and
// what its products run on. Checks its arguments as attention_forward does; CPU tensors
// only (a cuda q is an Error).
struct ForwardPlan {
  Impl impl;
  Isa isa;
  Products products;
  // Why bfloat16 inputs on avx512 take these products (bf16_products_choice()'s reason,
  // or the option that forced them); empty for other inputs.
  std::string products_reason;
  DecodePlan decode;  // where impl is decode (scores empty otherwise)
};
ForwardPlan forward_plan(const TensorView& q, const TensorView& k, const TensorView& v,
                         const Options& options = {});

// The CPU kernels keep their working memory between calls (the naive path's Sq×Sk
// buffer would otherwise be page-faulted in on every call). This frees it; a call
// running meanwhile keeps its block.
void release_cached_memory();

// Float64 reference for one query row (b, h, i), for checking sampled rows of long
// problems: writes head_dim values to out_row and returns the row's logsumexp
// (-inf for a row that sees no key). Same arguments and validation as attention_forward,
// without the output.
double reference_row(const TensorView& q, const TensorView& k, const TensorView& v,
                     const Options& options, std::int64_t b, std::int64_t h, std::int64_t i,
                     double* out_row);

// What this machine offers. best_cpu_isa: the fastest ISA it supports for long
// sequences (and what Isa::automatic runs for the backward); automatic_cpu_isa: what
// Isa::automatic runs for a forward with kv_len keys (the amx forward needs ~512 keys to
// repay its fixed costs per query tile; below, avx512). The environment variable
// FATTN_CPU_ISA (amx, avx512, avx2, portable) caps all three: the process runs as on a
// CPU without the wider units; an unknown name makes them throw Error.
Isa best_cpu_isa();
Isa automatic_cpu_isa(std::int64_t kv_len);
// The head dims this build's Hopper TMA kernel (fused_tma, compute capability 9.0) is
// compiled for, ascending; empty without the CUDA backend or its sm_90a kernels. A forward
// at a head dim up to the largest runs on it zero-padded (the torch operators' dispatch
// asks before it sends a call there).
std::vector<int> cuda_tma_head_dims();
bool cpu_supports(Isa isa);
// The environment variable that caps them (read once per process).
inline constexpr const char* kCpuIsaCapVariable = "FATTN_CPU_ISA";
// Why cpu_supports(isa) is false, for an error message: " (best: avx2)", and where
// FATTN_CPU_ISA is set, " (best: avx2; FATTN_CPU_ISA=avx2 caps it)".
std::string cpu_unsupported_reason();
// Whether bfloat16 inputs on avx512 can run on bfloat16 dot products here (AVX512-BF16's
// vdpbf16ps, in this CPU and this build, avx512 not capped by FATTN_CPU_ISA): the fused
// forward and the decode kernel (a cache read in place), with P rounded to bfloat16 for
// P·V as FlashAttention does on GPUs. Whether they do: bf16_products_choice().
bool cpu_has_bf16_dot_products();

// What Bf16Products::automatic runs on this CPU, and why; decided once per process, at the
// first call that asks:
//   FATTN_CPU_BF16 (bf16_dot or fma) where set (bf16_dot where the CPU cannot: an Error
//   at every call that asks);
//   fma where cpu_has_bf16_dot_products() is false;
//   else the faster of vdpbf16ps and float32 FMAs, each timed on the calling thread in a
//   register-resident loop (measure_product_rates(), a few milliseconds): bf16_dot where
//   its multiply-adds per second are at least the FMAs'. Measured both ways: on Zen 5
//   vdpbf16ps ran 2.0x the FMA rate and the bfloat16 forward on it 1.9x the float32 one;
//   on an Emerald Rapids VM 0.49x, and bfloat16 on it 0.6x float16 widened to FMAs
//   (docs/16bit.md).
struct Bf16ProductsChoice {
  Bf16Products products = Bf16Products::fma;  // bf16_dot or fma
  std::string reason;
  double bf16_dot_gflops = 0.0;  // one core, as timed (0: not timed)
  double fma_gflops = 0.0;
};
const Bf16ProductsChoice& bf16_products_choice();
inline constexpr const char* kCpuBf16Variable = "FATTN_CPU_BF16";

// The peak multiply-add rates of one core (the calling thread), in GFLOP/s (a multiply-add
// is 2 FLOPs; vdpbf16ps does 2 per lane): register-resident chains of AVX-512 FMAs and of
// vdpbf16ps, the best of a few timed runs of about a millisecond each. 0 for an instruction
// this CPU or build lacks.
struct ProductRates {
  double fma_gflops = 0.0;
  double bf16_dot_gflops = 0.0;
};
ProductRates measure_product_rates();

// Nanoseconds a load of a line that lies in L2 (not L1) takes on the calling thread: with
// no hint before it, after PREFETCHT0 and after PREFETCHT1 asked for it (the fastest of a
// few rounds of a 128-line pointer chase).
struct PrefetchLatencies {
  double unhinted_ns = 0.0;
  double t0_ns = 0.0;
  double t1_ns = 0.0;
};
// The probe sees L1 apart from L2 where a line PREFETCHT0 asked for loads in under this
// share of an unhinted line's time (L1 hits take a third to half of L2's on the cores
// measured: Zen 4 1.2-1.8 against 2.9-3.0 ns, docs/perf-log.md 2026-12-07).
inline constexpr double kPrefetchProbeL1Share = 0.8;
bool prefetch_probe_tells_levels(const PrefetchLatencies& latencies);
// 2 where PREFETCHT1 leaves the line in L2 (its load nearer an unhinted one's time than
// PREFETCHT0's), else 1 (also where the probe cannot tell the levels apart).
int decode_prefetch_level_for(const PrefetchLatencies& latencies);

// The cache level the CPU decode kernel's software prefetch fills where
// Options::decode_prefetch_level is -1, and why; probed once per process, at the first
// call that asks (under a millisecond): 2 (PREFETCHT1) where this core keeps PREFETCHT1 in
// L2, else 1 (PREFETCHT0); the measurements behind the rule: src/cpu/prefetch_level.cpp.
struct DecodePrefetchLevelChoice {
  int level = 1;
  std::string reason;
  PrefetchLatencies latencies;  // as timed (zero where not probed)
};
const DecodePrefetchLevelChoice& decode_prefetch_level_choice();
// Query rows per work item (Br) of the CPU kernels for an ISA (automatic: the best).
int cpu_query_tile(Isa isa);
int default_num_threads();
const char* version();

}  // namespace fattn
