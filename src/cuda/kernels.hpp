// fattn — the CUDA kernel families in one table: name, method and the inputs each takes.
// The dispatcher's dtype checks, the plan's tile heights, to_string and the
// benchmark's kernel names all read it (backend.hpp's Kernel names the rows).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>

#include "cuda/backend.hpp"
#include "cuda/tile_config.hpp"

namespace fattn::cuda {

// How a family computes; it decides the tiles (tile_config.hpp) and the launcher.
enum class Method : std::uint8_t {
  chosen_per_call,  // Kernel::automatic: resolved by kernel_for before anything runs
  reference,        // float64, one warp per query row
  naive,            // three kernels, the score matrix in global memory
  mma_slices,       // mma.sync m16n8k16 in 16-row warp slices (fused_mma.cuh)
  tf32_slices,      // mma.sync m16n8k8 in 16-row warp slices (fused_tf32.cuh)
  fma,              // float32 FMAs, no tensor cores (fused_fma.cuh)
  wgmma,            // Hopper warpgroup MMA, sm_90a (fused_wgmma.cuh)
  wgmma_tma,        // the same fed by the bulk tensor copy engine, warp-specialized (fused_tma.cuh)
};

enum class Inputs : std::uint8_t { any, sixteen_bit, float32 };

// Which problems a family takes beyond the plain forward. Every kernel takes the band's
// upper edge (the causal limit, a right window); Params::variants (a left window, softcap,
// ALiBi, sinks) only the kernels that read score_mods.cuh or compute them in float64.
enum class Takes : std::uint8_t { upper_edge, variants };

struct KernelFamily {
  Kernel kernel;
  const char* name;
  Method method;
  Inputs inputs;
  Takes takes;
};

inline constexpr KernelFamily kKernelFamilies[] = {
    {Kernel::automatic, "automatic", Method::chosen_per_call, Inputs::any, Takes::upper_edge},
    {Kernel::reference, "reference", Method::reference, Inputs::any, Takes::variants},
    {Kernel::naive, "naive", Method::naive, Inputs::any, Takes::upper_edge},
    {Kernel::fused_mma, "fused_mma", Method::mma_slices, Inputs::sixteen_bit, Takes::upper_edge},
    {Kernel::fused_wgmma, "fused_wgmma", Method::wgmma, Inputs::sixteen_bit, Takes::upper_edge},
    {Kernel::fused_wgmma_pipelined, "fused_wgmma_pipelined", Method::wgmma, Inputs::sixteen_bit,
     Takes::upper_edge},
    {Kernel::fused_tma, "fused_tma", Method::wgmma_tma, Inputs::sixteen_bit, Takes::variants},
    {Kernel::fused_tf32x3, "fused_tf32x3", Method::tf32_slices, Inputs::float32, Takes::upper_edge},
    {Kernel::fused_tf32, "fused_tf32", Method::tf32_slices, Inputs::float32, Takes::upper_edge},
    {Kernel::fused_fma, "fused_fma", Method::fma, Inputs::float32, Takes::upper_edge},
    {Kernel::fused_tma_persistent, "fused_tma_persistent", Method::wgmma_tma, Inputs::sixteen_bit,
     Takes::upper_edge},
    {Kernel::fused_tma_pingpong, "fused_tma_pingpong", Method::wgmma_tma, Inputs::sixteen_bit,
     Takes::upper_edge},
};

constexpr bool every_kernel_has_one_row() {
  for (std::size_t i = 0; i < std::size(kKernelFamilies); ++i)
    if (static_cast<std::size_t>(kKernelFamilies[i].kernel) != i) return false;
  return true;
}
static_assert(every_kernel_has_one_row(), "kKernelFamilies lists Kernel's values in order");

// A Kernel's row: its value indexes the table (the static_assert above).
constexpr const KernelFamily& family(Kernel kernel) {
  return kKernelFamilies[static_cast<std::size_t>(kernel)];
}

// The Hopper kernels (sm_90a, compute capability 9.0 only, head dims 64 and 128, one tile
// height): the wgmma kernels and the TMA kernel.
constexpr bool is_wgmma(Kernel kernel) {
  return family(kernel).method == Method::wgmma || family(kernel).method == Method::wgmma_tma;
}
constexpr bool is_tma(Kernel kernel) { return family(kernel).method == Method::wgmma_tma; }
constexpr bool takes_variants(Kernel kernel) { return family(kernel).takes == Takes::variants; }
constexpr bool is_tf32(Kernel kernel) { return family(kernel).method == Method::tf32_slices; }
// The warp-slice kernels: 64- or 128-row tiles (one or two slices per warp).
constexpr bool is_slice_kernel(Kernel kernel) {
  return family(kernel).method == Method::mma_slices || is_tf32(kernel);
}
constexpr SliceTiles slice_tiles(Kernel kernel, int dim) {
  return is_tf32(kernel) ? tf32_tiles(dim) : mma_tiles(dim);
}
// Tile rows of the wgmma kernels (one 64-row warpgroup each) and of the TMA kernel (one
// 64-row consumer warpgroup each).
constexpr int wgmma_tile_rows(int dim) { return 64 * wgmma_tiles(dim).warpgroups; }
constexpr int tma_tile_rows(int dim) { return 64 * tma_tiles(dim).consumers; }
constexpr int hopper_tile_rows(Kernel kernel, int dim) {
  return is_tma(kernel) ? tma_tile_rows(dim) : wgmma_tile_rows(dim);
}

// The fewest query rows per block the kernel may use (its largest grid); 1 for the
// per-row kernels.
constexpr int smallest_tile_rows(Kernel kernel, int dim) {
  switch (family(kernel).method) {
    case Method::wgmma: return wgmma_tile_rows(dim);
    case Method::wgmma_tma: return tma_tile_rows(dim);
    case Method::mma_slices:
    case Method::tf32_slices: return slice_tiles(kernel, dim).tile_rows(1);
    case Method::fma: return fma_tiles(dim).br;
    default: return 1;
  }
}

}  // namespace fattn::cuda
