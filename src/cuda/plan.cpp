// fattn — the CUDA backend's plan (plan.hpp): checks, kernel and tile choice, working
// memory, Params.
#include "cuda/plan.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/band.hpp"
#include "cuda/device.hpp"
#include "cuda/host_checks.hpp"
#include "cuda/kernels.hpp"
#include "cuda/refusal.hpp"
#include "cuda/tile_config.hpp"

namespace fattn::cuda {

Strides3 strides3(const TensorView& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

void expect_contiguous_rows(const char* name, const TensorView& t) {
  if (t.stride(3) != 1)
    fail(std::string(name) + ".stride(3) (head dim) must be 1 for CUDA tensors, got " +
         std::to_string(t.stride(3)) +
         ": the CUDA kernels read and write each row of head_dim elements contiguously "
         "(make the tensor contiguous in its last dimension)");
}

// Whether the fused kernels can read t with 16-byte cp.async chunks as it is.
bool cp_async_ready(const TensorView& t) {
  const int chunk = 16 / element_size(t.dtype);
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0 || t.size(3) % chunk != 0) return false;
  for (int d = 0; d < 3; ++d)
    if (t.size(d) > 1 && t.stride(d) % chunk != 0) return false;
  return true;
}

// Whether out takes 2-element vector stores (Params::out_pairs).
bool pair_stores_ok(const TensorView& t) {
  const int bytes = 2 * element_size(t.dtype);
  if (reinterpret_cast<std::uintptr_t>(t.data) % static_cast<unsigned>(bytes) != 0) return false;
  for (int d = 0; d < 3; ++d)
    if (t.size(d) > 1 && t.stride(d) % 2 != 0) return false;
  return true;
}

std::int64_t repacked_bytes(const TensorView& t, int row) {
  return checked_product({t.size(0), t.size(1), t.size(2), row, element_size(t.dtype)},
                         "a repacked input's size");
}

namespace {

// 128-row query tiles (two 16-row slices per warp, tile_config.hpp) load each K/V
// fragment once for twice the MMAs, but make half as many blocks. They are taken when
// their grid still fills every SM's kBlocksPerSm slots at least once. Measured on the
// H100 (2026-11-23, results/report/gpu/bench.json, fused_br64 vs fused_br128, all three
// dtypes): where B·H·tiles >= 264 (132 SMs x 2) 128 rows are 1.03-1.33x faster (one
// exception: causal S = 512, D = 64, 0.97x); where the grid is smaller (B=2, H=8,
// S <= 1024: 16-128 blocks) they are 0.63-0.96x.
constexpr int kBlocksPerSm = 2;  // registers (~230 per thread) allow two blocks per SM

bool tall_tiles_pay(const Params& p, int tall_rows, int device) {
  const long long blocks =
      static_cast<long long>(p.batch) * p.q_heads * ((p.q_len + tall_rows - 1) / tall_rows);
  return blocks >= static_cast<long long>(multiprocessors(device)) * kBlocksPerSm;
}

// Params::variants of a problem (make_params): what only some kernels take.
bool needs_variants(const detail::Problem& p) {
  return has_lower_edge(p) || p.mods.any();
}

// The problem as the kernels' rules see it (refusal.hpp): a left window that hides no pair
// is no window.
CudaCall call_of(const detail::Problem& p) {
  CudaCall call;
  call.dtype = p.dtype;
  call.head_dim = p.head_dim;
  call.window_left = has_lower_edge(p) ? p.window_left : -1;
  call.window_right = p.window_right;
  call.softcap = p.mods.softcap != 0.0;
  call.alibi = p.mods.alibi != nullptr;
  call.sinks = p.mods.sinks != nullptr;
  call.attn_mask = p.mods.mask != nullptr;
  return call;
}

}  // namespace

int tile_rows_for(const Plan& plan, const Params& p, int dim, int device) {
  if (plan.tile_rows) return plan.tile_rows;
  const SliceTiles tiles = slice_tiles(plan.kernel, dim);
  const int rows = tiles.tile_rows(1);
  if (tiles.max_slices < 2) return rows;
  return tall_tiles_pay(p, tiles.tile_rows(2), device) ? tiles.tile_rows(2) : rows;
}

Plan make_plan(const detail::Problem& p, const TensorView& q, const TensorView& k,
               const TensorView& v, Kernel kernel) {
  const DType dtype = q.dtype;
  Plan plan;
  plan.kernel = kernel == Kernel::automatic ? kernel_for(Impl::automatic, dtype) : kernel;
  // dtype, attn_mask (its one check on CUDA: api/attention.cpp and forward_with alike), the
  // variants, the head dims built
  if (const std::string why = forward_refusal(plan.kernel, call_of(p)); !why.empty()) fail(why);
  expect_int("q.size(0) (batch)", p.batch);
  expect_int("q.size(1) (query heads)", p.q_heads);
  expect_int("q.size(2) (query sequence)", p.q_len);
  expect_int("k.size(2) (kv sequence)", p.kv_len);
  const std::int64_t bh = checked_product({p.batch, p.q_heads}, "batch · heads");

  if (plan.kernel == Kernel::naive) {
    plan.scores_bytes = checked_product({bh, p.q_len, p.kv_len, 4},
                                         "the naive implementation's Sq×Sk score buffer");
  } else if (plan.kernel == Kernel::reference) {
    expect_int("batch · heads · query sequence / 8 (reference grid)",
               checked_product({bh, p.q_len}, "the reference grid") / 8);
  } else {
    // forward_refusal made sure the kernel is built for a head dim that holds the problem's
    plan.kernel_dim = compiled_dim_for(
        is_wgmma(plan.kernel) ? hopper_head_dims(plan.kernel) : supported_head_dims(), p.head_dim);
    const std::int64_t rows = smallest_tile_rows(plan.kernel, plan.kernel_dim);
    expect_int("the fused grid (batch · heads · query tiles)",
               checked_product({bh, (p.q_len + rows - 1) / rows}, "the fused grid"));
    const int chunk = 16 / element_size(dtype);
    plan.row = static_cast<int>(round_up(p.head_dim, chunk));
    const TensorView* views[3] = {&q, &k, &v};
    for (int i = 0; i < 3; ++i) {
      plan.repack[i] = !cp_async_ready(*views[i]);
      if (plan.repack[i]) plan.repack_bytes[i] = repacked_bytes(*views[i], plan.row);
    }
  }
  return plan;
}

void force_tile_rows(Plan& plan, int tile_rows, std::int64_t head_dim) {
  if (tile_rows == 0) return;
  const std::string not_a_height = "tile_rows = " + std::to_string(tile_rows) +
                                   " is not a tile height of the " + to_string(plan.kernel) +
                                   " CUDA kernel (0, or ";
  if (is_wgmma(plan.kernel)) {
    const int rows = hopper_tile_rows(plan.kernel, plan.kernel_dim);
    if (tile_rows != rows) fail(not_a_height + std::to_string(rows) + ")");
    return;
  }
  const SliceTiles tiles = slice_tiles(plan.kernel, plan.kernel_dim);
  const int rows = tiles.tile_rows(1), tall = tiles.tile_rows(2);
  if (!is_slice_kernel(plan.kernel) || (tile_rows != rows && tile_rows != tall))
    fail(not_a_height + std::to_string(rows) + " or " + std::to_string(tall) +
         " for the tensor-core kernels)");
  if (tile_rows == tall && tiles.max_slices < 2)
    fail("tile_rows = " + std::to_string(tile_rows) + " needs a head dim of at most " +
         std::to_string(max_tall_head_dim()) + ", got " + std::to_string(head_dim));
  plan.tile_rows = tile_rows;
}

void force_stages(Plan& plan, int stages, const detail::Problem& p) {
  if (stages == 0) return;
  const int table = tma_tiles(plan.kernel_dim).stages, other = tma_alternative_stages(plan.kernel_dim);
  const std::string asked = "stages = " + std::to_string(stages);
  if (!is_tma(plan.kernel))
    fail(asked + ": only the fused_tma CUDA kernel takes a ring depth, this plan runs " +
         to_string(plan.kernel));
  if (stages == table) return;
  if (plan.kernel != Kernel::fused_tma)
    fail(asked + ": the " + to_string(plan.kernel) + " CUDA kernel runs at its table's ring depth only (0 or " +
         std::to_string(table) + ")");
  if (stages != other)
    fail(asked + " is not a ring depth the fused_tma CUDA kernel is built with at head dim " +
         std::to_string(plan.kernel_dim) + " (0, " + std::to_string(table) +
         (other ? " or " + std::to_string(other) : std::string()) + ")");
  if (needs_variants(p))
    fail(asked + ": the fused_tma CUDA kernel takes the variants (" + variant_names(call_of(p)) +
         ") at its table's depth only (0 or " + std::to_string(table) + ")");
  plan.stages = stages;
}

void force_blocks(Plan& plan, int blocks) {
  if (blocks == 0) return;
  const bool persistent = plan.kernel == Kernel::fused_tma_persistent || plan.kernel == Kernel::fused_tma_pingpong;
  if (!persistent)
    fail("persistent_blocks = " + std::to_string(blocks) + ": only the persistent TMA CUDA kernels "
         "(fused_tma_persistent, fused_tma_pingpong) take a grid size, this plan runs " + to_string(plan.kernel));
  if (blocks < 0) fail("persistent_blocks must be >= 0, got " + std::to_string(blocks));
  plan.blocks = blocks;
}

detail::Problem validate(const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView* out, const TensorView* lse, const Options& options) {
  const detail::Problem p = detail::make_problem(q, k, v, out, lse, options);
  expect_contiguous_rows("q", q);
  expect_contiguous_rows("k", k);
  expect_contiguous_rows("v", v);
  if (out) expect_contiguous_rows("out", *out);
  return p;
}

Params make_params(const detail::Problem& pr, const TensorView& q, const TensorView& k,
                   const TensorView& v, const TensorView& out, const TensorView* lse) {
  Params p;
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.out = out.data;
  p.lse = lse ? static_cast<float*>(lse->data) : nullptr;
  p.q_stride = strides3(q);
  p.k_stride = strides3(k);
  p.v_stride = strides3(v);
  p.out_stride = strides3(out);
  if (lse) p.lse_stride = {lse->stride(0), lse->stride(1), lse->stride(2)};
  p.batch = static_cast<int>(pr.batch);
  p.q_heads = static_cast<int>(pr.q_heads);
  p.kv_heads = static_cast<int>(pr.kv_heads);
  p.group = static_cast<int>(pr.group_size());
  p.q_len = static_cast<int>(pr.q_len);
  p.kv_len = static_cast<int>(pr.kv_len);
  p.head_dim = static_cast<int>(pr.head_dim);
  set_band(p, pr);
  p.softcap = static_cast<float>(pr.mods.softcap);
  p.alibi = pr.mods.alibi;
  p.alibi_batch = pr.mods.alibi_batch;
  p.sinks = pr.mods.sinks;
  p.variants = needs_variants(pr);
  p.scale = pr.scale;
  p.scale_log2 = static_cast<float>(pr.scale * 1.4426950408889634);
  p.out_pairs = pair_stores_ok(out);
  return p;
}

}  // namespace fattn::cuda
