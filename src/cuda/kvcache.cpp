// fattn — the CUDA backend's KV-cache attention (decode.hpp): what the decode kernels take,
// the dispatch table's choice for a KV-cache call (table_choice.hpp: kvcache_kernel), the plan
// (compiled head dim, ring depth, key splits), their parameters and launch.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/decode.hpp"
#include "cuda/decode_tiles.hpp"
#include "cuda/device.hpp"
#include "cuda/host_checks.hpp"
#include "cuda/launchers.hpp"
#include "cuda/refusal.hpp"
#include "cuda/table_choice.hpp"
#include "cuda/work_memory.hpp"
#include "model/kv_cache_problem.hpp"

namespace fattn::cuda {
namespace {

constexpr const char* kName = "decode";
// Each warp's ring depth when the caller does not choose: the deepest of these the
// device's shared memory takes (3 at D = 128 on an H100/H200, 2 on an A100; decode_tiles.hpp).
constexpr int kDefaultStages = 3;
constexpr int kLeastStages = 2;
constexpr int kMaxGridYZ = 65535;  // CUDA's limit on grid.y and grid.z

// The compiled head dim a call runs on (0: none).
int decode_kernel_dim(std::int64_t head_dim) { return compiled_dim_for(decode_head_dims(), head_dim); }

// Whether the kernels can copy t's rows in 16-byte chunks as they are: contiguous rows
// of head_dim elements starting on 16 bytes.
bool chunk_rows(const TensorView& t) {
  constexpr int kChunk = 8;  // 16-bit elements per 16 bytes
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0 || t.stride(3) != 1) return false;
  for (int d = 0; d < 3; ++d)
    if (t.size(d) > 1 && t.stride(d) % kChunk != 0) return false;
  return true;
}

int device_attribute(cudaDeviceAttr attribute, int device, const char* what) {
  int value = 0;
  check_cuda(cudaDeviceGetAttribute(&value, attribute, device), what);
  return value;
}

// Why `stages` ring stages at compiled head dim `dim` do not fit a device with `limit` bytes
// of shared memory per block ("" when they do).
std::string smem_shortfall(int dim, int stages, std::int64_t limit, int device) {
  const std::int64_t needs = decode_smem_bytes(dim, stages);
  if (needs <= limit) return {};
  return "the CUDA decode kernel with " + std::to_string(stages) + " stages at head dim " +
         std::to_string(dim) + " needs " + std::to_string(needs) +
         " bytes of shared memory per block; CUDA device " + std::to_string(device) + " has " +
         std::to_string(limit);
}

std::int64_t smem_limit(int device) {
  return device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device,
                          "cudaDeviceGetAttribute(maxSharedMemoryPerBlockOptin)");
}

struct DecodePlan {
  int kernel_dim = 0;
  int stages = 0;
  int splits = 1;
  std::int64_t part_rows = 0;  // splits · B · Hq · Sq with more than one split, else 0
  std::int64_t part_bytes() const {
    return part_rows == 0 ? 0
                          : round_up(part_rows * 4, kWorkAlignment) +
                                round_up(part_rows * 4 * head_dim, kWorkAlignment);
  }
  std::int64_t head_dim = 0;
};

// Splits and ring depth for a validated call on `device` (stages, kv_splits: Options', the
// caller's choice or 0).
DecodePlan plan_decode(const detail::Problem& p, int stages, int kv_splits, int device) {
  DecodePlan plan;
  plan.head_dim = p.head_dim;
  plan.kernel_dim = decode_kernel_dim(p.head_dim);
  const std::int64_t limit = smem_limit(device);
  if (stages != 0) {
    if (stages < kLeastStages || stages > DecodeTiles::kMaxStages)
      fail("decode_stages (the CUDA decode kernel's ring depth) must be 0 (chosen) or " +
           std::to_string(kLeastStages) + " to " + std::to_string(DecodeTiles::kMaxStages) +
           ", got " + std::to_string(stages));
    const std::string shortfall = smem_shortfall(plan.kernel_dim, stages, limit, device);
    if (!shortfall.empty()) fail(shortfall);
    plan.stages = stages;
  } else {  // the deepest that fits (decode_refusal made sure the least does)
    plan.stages = kLeastStages;
    for (int s = kDefaultStages; s > kLeastStages; --s)
      if (smem_shortfall(plan.kernel_dim, s, limit, device).empty()) {
        plan.stages = s;
        break;
      }
  }

  const std::int64_t row_tiles =
      (p.q_len * (p.q_heads / p.kv_heads) + DecodeTiles::kRows - 1) / DecodeTiles::kRows;
  if (p.kv_heads * row_tiles > kMaxGridYZ || p.batch > kMaxGridYZ)
    fail("the decode grid is too large: k_cache.size(1) (kv heads) x query rows / 16 = " +
         std::to_string(p.kv_heads * row_tiles) + " and q.size(0) (batch) = " +
         std::to_string(p.batch) + " must be at most " + std::to_string(kMaxGridYZ));
  if (kv_splits > DecodeTiles::kMaxSplits)
    fail("kv_splits must be at most " + std::to_string(DecodeTiles::kMaxSplits) +
         " on CUDA (the decode kernel's combine step), got " + std::to_string(kv_splits));
  if (kv_splits > 0) {
    plan.splits = kv_splits;
  } else {
    const std::int64_t smem = decode_smem_bytes(plan.kernel_dim, plan.stages);
    const std::int64_t per_sm =
        device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor, device,
                         "cudaDeviceGetAttribute(maxSharedMemoryPerMultiprocessor)");
    constexpr std::int64_t kReservedPerBlock = 1024;  // the runtime's share of each block
    const std::int64_t blocks_per_sm = std::max<std::int64_t>(1, per_sm / (smem + kReservedPerBlock));
    const DecodeTiles tiles = DecodeTiles::at(plan.kernel_dim);
    const std::int64_t min_keys = 2LL * DecodeTiles::kWarps * tiles.keys;
    plan.splits = choose_decode_splits(p.batch * p.kv_heads * row_tiles,
                                       multiprocessors(device) * blocks_per_sm, p.kv_len,
                                       min_keys);
  }
  if (plan.splits > 1)
    plan.part_rows = checked_product({plan.splits, p.batch, p.q_heads, p.q_len},
                                     "the decode kernel's partial rows");
  return plan;
}

void strides_of(const TensorView& t, std::int64_t (&s)[3]) {
  for (int d = 0; d < 3; ++d) s[d] = t.stride(d);
}

DecodeParams decode_params(const detail::KvCacheProblem& call, const TensorView& q,
                           const KvCache& cache, const TensorView* k_new,
                           const TensorView* v_new, const TensorView& out,
                           const TensorView* lse, const Options& options) {
  const detail::Problem& pr = call.p;
  DecodeParams p;
  p.q = q.data;
  p.k_cache = cache.k.data;
  p.v_cache = cache.v.data;
  p.out = out.data;
  p.lse = lse ? static_cast<float*>(lse->data) : nullptr;
  strides_of(q, p.q_stride);
  strides_of(cache.k, p.k_stride);
  strides_of(cache.v, p.v_stride);
  strides_of(out, p.out_stride);
  if (lse) strides_of(*lse, p.lse_stride);
  if (k_new) {
    p.k_new = k_new->data;
    p.v_new = v_new->data;
    strides_of(*k_new, p.kn_stride);
    strides_of(*v_new, p.vn_stride);
  }
  p.batch = static_cast<int>(pr.batch);
  p.q_heads = static_cast<int>(pr.q_heads);
  p.kv_heads = static_cast<int>(pr.kv_heads);
  p.group = static_cast<int>(pr.q_heads / pr.kv_heads);
  p.q_len = static_cast<int>(pr.q_len);
  p.head_dim = static_cast<int>(pr.head_dim);
  p.capacity = static_cast<int>(pr.kv_len);
  p.new_len = static_cast<int>(call.new_len);
  p.seqlens = cache.seqlens ? static_cast<const std::int32_t*>(cache.seqlens->data) : nullptr;
  if (cache.block_table) {
    p.block_table = static_cast<const std::int32_t*>(cache.block_table->data);
    p.table_stride = cache.block_table->stride(0);
    p.block_size = static_cast<int>(cache.k.size(2));
    p.num_blocks = static_cast<int>(cache.k.size(0));
  }
  p.causal = options.causal != Causal::none;
  // A window wider than any int hides nothing more than one of kMaxInt keys.
  p.window_left = static_cast<int>(std::min<std::int64_t>(options.window_left, kMaxInt));
  p.window_right = static_cast<int>(std::min<std::int64_t>(options.window_right, kMaxInt));
  p.scale = static_cast<float>(pr.scale);
  p.scale_log2 = static_cast<float>(pr.scale * 1.4426950408889634);
  p.softcap = static_cast<float>(pr.mods.softcap);
  p.alibi = pr.mods.alibi;
  p.alibi_batch = pr.mods.alibi_batch;
  p.sinks = pr.mods.sinks;
  return p;
}

void expect_int_sizes(const detail::KvCacheProblem& call, const KvCache& cache) {
  const detail::Problem& p = call.p;
  expect_int("q.size(0) (batch)", p.batch);
  expect_int("q.size(1) (query heads)", p.q_heads);
  expect_int("q.size(2) x query heads per kv head (the decode kernel's rows)",
             p.q_len * (p.q_heads / p.kv_heads));
  expect_int("the cache's capacity (keys per sequence)", p.kv_len);
  expect_int("k_new.size(2) (new keys)", call.new_len);
  expect_int("k_cache.size(0)", cache.k.size(0));
}

}  // namespace

std::string decode_refusal(const TensorView& q, const KvCache& cache, const TensorView* k_new,
                           const TensorView* v_new, const Options& options) {
  if (options.impl != Impl::automatic && options.impl != Impl::decode)
    return std::string("impl ") + to_string(options.impl) +
           ": the CUDA KV cache runs the decode kernel (impl auto or decode)";
  const std::int64_t head_dim = q.size(3);
  // dtype, head dim, attn_mask: the call's rules (refusal.hpp), then what only the views say
  const CudaCall call = call_of("kvcache", q.dtype, head_dim, options);
  if (std::string why = refusal_on_any_device(TableKernel::decode, call); !why.empty()) return why;
  if (options.causal == Causal::top_left)
    return "the CUDA decode kernel aligns causal bottom-right (each sequence's last query "
           "with its last key), got top_left";
  const std::pair<const char*, const TensorView*> rows[] = {
      {"q", &q}, {"k_cache", &cache.k}, {"v_cache", &cache.v}, {"k_new", k_new}, {"v_new", v_new}};
  for (const auto& [name, t] : rows)
    if (t && !chunk_rows(*t))
      return std::string(name) +
             " must start on 16 bytes, with stride(3) 1 and the other strides in multiples of 8 "
             "elements, for the CUDA decode kernel (it copies rows in 16-byte chunks)";
  // The current device: its compute capability, and the ring's least depth must fit its
  // shared memory (not so on the GPUs of 99 KB per block, compute capability 8.6 and 8.9, at
  // D > 64).
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // no device: the call itself says so
    return {};
  }
  const std::string why = capability_refusal(TableKernel::decode, compute_capability(device));
  if (!why.empty()) return why + " (CUDA device " + std::to_string(device) + ")";
  return smem_shortfall(decode_kernel_dim(head_dim), kLeastStages, smem_limit(device), device);
}

std::string kvcache_kernel(const TensorView& q, const KvCache& cache, const TensorView* k_new,
                           const TensorView* v_new, const Options& options) {
  constexpr int kRank = 4;  // (B, Hq, Sq, D): the head dim is q.size(3)
  if (q.rank != kRank) return {};  // the validation's error, not a choice
  CudaCall call = call_of("kvcache", q.dtype, q.size(3), options);
  const ComputeCapability cc = current_capability();
  call.major = cc.major;
  call.minor = cc.minor;
  return first_candidate(call, true, [&](TableKernel kernel) {
    // The decode kernel's own refusal adds what only the views say (alignment, causal
    // alignment, the device's shared memory) to the call's rules.
    return kernel == TableKernel::decode ? decode_refusal(q, cache, k_new, v_new, options)
                                         : refusal(kernel, call);
  });
}

void attention_kvcache(const TensorView& q, const KvCache& cache, const TensorView* k_new,
                       const TensorView* v_new, const TensorView& out, const TensorView* lse,
                       const Options& options) {
  const detail::KvCacheProblem call(q, cache, k_new, v_new, &out, lse, options);
  const std::string refusal = decode_refusal(q, cache, k_new, v_new, options);
  if (!refusal.empty()) fail(refusal);
  if (out.stride(3) != 1)
    fail("out.stride(3) (head dim) must be 1 for the CUDA decode kernel, got " +
         std::to_string(out.stride(3)));
  expect_int_sizes(call, cache);
  const int device = usable_device();
  const std::pair<const char*, const TensorView*> views[] = {
      {"q", &q},          {"k_cache", &cache.k},   {"v_cache", &cache.v},
      {"k_new", k_new},   {"v_new", v_new},        {"out", &out},
      {"lse", lse},       {"cache_seqlens", cache.seqlens}, {"block_table", cache.block_table},
      {"alibi_slopes", options.alibi_slopes},      {"sinks", options.sinks}};
  for (const auto& [name, t] : views)
    if (t) expect_device_memory(name, t->data, device);

  const DecodePlan plan = plan_decode(call.p, options.decode_stages, options.kv_splits, device);
  DecodeParams p = decode_params(call, q, cache, k_new, v_new, out, lse, options);
  p.splits = plan.splits;
  const cudaStream_t stream = static_cast<cudaStream_t>(options.cuda_stream);
  StreamBuffer work(plan.part_bytes(), stream, kName, options.device_allocator);
  if (plan.splits > 1) {
    p.lse_part = static_cast<float*>(work.take(plan.part_rows * 4));
    p.o_part = static_cast<float*>(work.take(plan.part_rows * 4 * plan.head_dim));
  }
  launch_decode(p, q.dtype, plan.kernel_dim, plan.stages, stream);
}

std::int64_t kvcache_extra_bytes(const TensorView& q, const KvCache& cache,
                                 const TensorView* k_new, const Options& options) {
  const detail::KvCacheProblem call(q, cache, k_new, k_new, nullptr, nullptr, options);
  const std::string refusal = decode_refusal(q, cache, k_new, k_new, options);
  if (!refusal.empty()) fail(refusal);
  return plan_decode(call.p, options.decode_stages, options.kv_splits, usable_device())
      .part_bytes();
}

}  // namespace fattn::cuda
