// fattn — Hopper's bulk tensor copy engine (TMA), the mbarrier it completes on, and wgmma
// operands in the 128-byte swizzled layout it writes (sm_90; wgmma and setmaxnreg sm_90a).
// Used by fused_tma.cuh; tests/cuda/tma_probe.cu checks every assumption below on its own
// on a Hopper GPU (docs/cuda.md, "The TMA kernel").
//
// The swizzled tile ("panel" layout). A tile of kRows rows × kD 16-bit columns (rows: queries
// or keys; columns: the head dim) is cut into kD/64 panels of 64 columns. Panel p holds
// columns 64p..64p+63 of every row, 128 bytes per row, rows one after the other
// (kRows·128 bytes per panel). Inside each 1024-byte group of 8 rows the 16-byte chunk c of
// row r is stored at chunk c ^ (r % 8):
//   element (r, c) at byte (c/64)·kRows·128 + r·128 + (((c%64)/8) ^ (r%8))·16 + (c%8)·2.
// That is what a TMA load with CU_TENSOR_MAP_SWIZZLE_128B writes for a box of 64 columns ×
// kRows rows into a 1024-byte aligned destination (the swizzle XORs address bits 4-6 with
// bits 7-9), and what wgmma reads through a descriptor with layout type 1 ("128B"), CUTLASS's
// Swizzle<3,4,3> atoms (cute/atom/mma_traits_sm90_gmma.hpp, Layout_K_SW128_Atom and
// Layout_MN_SW128_Atom). The XOR spreads the 8 rows of a core matrix over the 8 16-byte bank
// groups, so neither the copy engine's writes nor the tensor cores' reads conflict.
//
// Descriptors for this layout (bits 62-63 = 1; base offset 0: every tile starts 1024-aligned):
//   K-major (Q and K in S = Q·Kᵀ; rows = M or N, columns = K):
//     SBO = 1024 (between 8-row groups), LBO = 16 (unused: a k16 slice, 32 bytes, never
//     leaves its 128-byte row); slice kk (16 columns) starts at (kk/4)·panel + (kk%4)·32.
//   MN-major (V in O += P·V; rows = K, the keys; columns = N, the head dim):
//     SBO = 1024 (between 8-key groups along K), LBO = kRows·128 (between 64-column panels
//     along N); slice kk (16 keys) starts at kk·2048.
#pragma once

#include <cuda.h>  // CUtensorMap (the type only: nothing here calls the driver)

#include <cstdint>

#include "cuda/wgmma.cuh"

namespace fattn::cuda {

// ---- the swizzled panel layout -------------------------------------------------------------
constexpr int kPanelCols = 64;         // 16-bit columns per panel (128 bytes per row)
constexpr int kSwizzleRowBytes = 128;  // one row of a panel
constexpr int kSwizzleAtomBytes = 1024;  // 8 rows: the period of the XOR pattern

// Byte offset of element (r, c) in a swizzled tile of kRows rows (header comment).
template <int kRows>
__host__ __device__ constexpr int sw128_offset(int r, int c) {
  return (c / kPanelCols) * kRows * kSwizzleRowBytes + r * kSwizzleRowBytes +
         ((((c % kPanelCols) / 8) ^ (r % 8)) * 16) + (c % 8) * 2;
}
static_assert(sw128_offset<128>(0, 0) == 0 && sw128_offset<128>(1, 0) == 128 + 16 &&
                  sw128_offset<128>(7, 63) == 7 * 128 + 0 * 16 + 14 &&
                  sw128_offset<128>(8, 8) == 8 * 128 + 16 && sw128_offset<64>(3, 64) == 64 * 128 + 3 * 128 + 48,
              "swizzled panel layout");

// wgmma's layout-type field (bits 62-63 of the descriptor) on sm_90.
enum class SmemLayout : std::uint32_t { interleave = 0, swizzle_128b = 1, swizzle_64b = 2, swizzle_32b = 3 };

// The descriptor with the swizzle fields: wgmma_desc_encode's address, LBO and SBO, plus the
// base offset (bits 49-51) and the layout type (bits 62-63).
__host__ __device__ constexpr std::uint64_t wgmma_desc_encode_swizzled(std::uint32_t smem_addr,
                                                                       std::uint32_t lbo_bytes,
                                                                       std::uint32_t sbo_bytes,
                                                                       std::uint32_t base_offset,
                                                                       SmemLayout layout) {
  return wgmma_desc_encode(smem_addr, lbo_bytes, sbo_bytes) |
         static_cast<std::uint64_t>(base_offset & 7u) << 49 |
         static_cast<std::uint64_t>(static_cast<std::uint32_t>(layout) & 3u) << 62;
}
static_assert(wgmma_desc_encode_swizzled(0x400, 16, 1024, 0, SmemLayout::swizzle_128b) ==
                  (0x40ull | 1ull << 16 | 64ull << 32 | 1ull << 62),
              "swizzled descriptor fields");

constexpr std::uint32_t kSw128Sbo = kSwizzleAtomBytes;  // 8-row groups, both majors
constexpr std::uint32_t kSw128KMajorLbo = 16;           // unused by the hardware; CUTLASS's 1

template <int kRows>
__host__ __device__ constexpr std::uint32_t sw128_panel_bytes() {
  return kRows * kSwizzleRowBytes;
}

// The byte offset of 16-column slice kk of a K-major operand with kRows rows (slices 0-3 in
// panel 0, 4-7 in panel 1).
template <int kRows>
__host__ __device__ constexpr std::uint32_t sw128_k_slice_bytes(int kk) {
  return (kk / 4) * sw128_panel_bytes<kRows>() + (kk % 4) * 32;
}
// ... and of 16-row slice kk of an MN-major operand: 16 rows of 128 bytes.
__host__ __device__ constexpr std::uint32_t sw128_mn_slice_bytes(int kk) {
  return kk * 16 * kSwizzleRowBytes;
}

__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// Descriptors of a swizzled tile whose panels hold kRows rows (header comment). Moving by
// b bytes (a slice) is adding b >> 4: the address field cannot overflow (shared < 256 KB).
template <int kRows>
__device__ __forceinline__ std::uint64_t sw128_k_major_desc(const void* tile) {
  return wgmma_desc_encode_swizzled(smem_u32(tile), kSw128KMajorLbo, kSw128Sbo, 0,
                                    SmemLayout::swizzle_128b);
}
template <int kRows>
__device__ __forceinline__ std::uint64_t sw128_mn_major_desc(const void* tile) {
  return wgmma_desc_encode_swizzled(smem_u32(tile), sw128_panel_bytes<kRows>(), kSw128Sbo, 0,
                                    SmemLayout::swizzle_128b);
}

// The slice steps of the swizzled layout for issue_qk / issue_pv (wgmma.cuh): a K-major
// operand's panels hold kRows rows; an MN-major slice is 16 rows of 128 bytes whatever the
// columns.
struct Sw128Slices {
  template <int kRows>
  __host__ __device__ static constexpr std::uint64_t k_major(int kk) {
    return sw128_k_slice_bytes<kRows>(kk) >> 4;
  }
  template <int kCols>
  __host__ __device__ static constexpr std::uint64_t mn_major(int kk) {
    return sw128_mn_slice_bytes(kk) >> 4;
  }
  // Where column c (a multiple of 64) of an MN-major operand with kRows rows starts: its
  // panel of 64 columns.
  template <int kRows>
  __host__ __device__ static constexpr std::uint64_t mn_columns(int c) {
    return ((c / kPanelCols) * sw128_panel_bytes<kRows>()) >> 4;
  }
};

// The dynamic shared window rounded up to 1024 bytes (the swizzle's period): its start is
// not promised aligned, so the kernels' shared-memory sizes hold the slack.
__device__ __forceinline__ unsigned char* aligned_smem(unsigned char* raw) {
  const std::uint32_t at = smem_u32(raw);
  return raw + (((at + kSwizzleAtomBytes - 1) & ~std::uint32_t(kSwizzleAtomBytes - 1)) - at);
}

// ---- mbarrier ----------------------------------------------------------------------------
// A 64-bit barrier in shared memory with an arrival count and a transaction (byte) count. A
// phase completes when `count` arrivals have been made and every byte announced by
// arrive.expect_tx has landed; then the next phase starts, with the opposite parity. A
// waiter names the parity of the phase it waits for: phase 0 (parity 0) first, then 1, 0, ...
// Waiting for parity 1 on a fresh barrier returns at once (the phase "before" phase 0 counts
// as complete), which is how a producer passes its first round of empty stages.
__device__ __forceinline__ void mbar_init(std::uint64_t* bar, std::uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
}
// After the inits, before the barrier that publishes them to the other threads and to the
// copy engine (CUTLASS's fence_barrier_init).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` more bytes for the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint64_t* bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Whether the phase of parity `parity` has completed, asked with try_wait, which may block
// for a while (a hardware time limit) before it says no, or with test_wait, which does not
// block. One function for both: they differ in the instruction's name only, and an asm
// template cannot be spliced from strings.
enum class MbarPoll { try_wait, test_wait };
template <MbarPoll kPoll>
__device__ __forceinline__ bool mbar_phase_done(std::uint64_t* bar, std::uint32_t parity) {
  std::uint32_t done;
  if constexpr (kPoll == MbarPoll::try_wait)
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
  else
    asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
  return done != 0;
}
__device__ __forceinline__ bool mbar_try_wait(std::uint64_t* bar, std::uint32_t parity) {
  return mbar_phase_done<MbarPoll::try_wait>(bar, parity);
}
__device__ __forceinline__ bool mbar_test_wait(std::uint64_t* bar, std::uint32_t parity) {
  return mbar_phase_done<MbarPoll::test_wait>(bar, parity);
}
// Waits for the phase. No time limit: a trap after ~10 s in this loop (so that a phase
// that never completes fails the launch instead of hanging) made ptxas spill 424 bytes and
// serialize every wgmma of fused_tma at D = 128 (C7512, nvcc 13.0), with or without a clock
// read; the probe's own waits are bounded instead (tests/cuda/tma_probe.cu).
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, std::uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// ---- the copy engine -----------------------------------------------------------------------
// A box of the 4-d tensor map (element coordinates c0..c3, innermost first; boxes reaching
// past the tensor are zero-filled, and still count in full towards the transaction bytes)
// into shared memory at dst (1024-aligned for the 128-byte swizzle); completes on `bar`.
// `map` is the tensor map's generic address: a __grid_constant__ kernel parameter.
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, std::uint64_t* bar,
                                            int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(map))
               : "memory");
}

// ---- warp specialization -------------------------------------------------------------------
// setmaxnreg (sm_90a): the warpgroup's registers per thread from here on. Takes effect only
// when the kernel has a register cap at entry (__launch_bounds__(threads, 1)); every thread
// of the warpgroup executes it.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
#if FATTN_WGMMA_ENABLED
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
#if FATTN_WGMMA_ENABLED
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

// Named barrier `id` (1-15; 0 is __syncthreads) among `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives at named barrier `id` without waiting: the barrier completes when `threads`
// threads have arrived or synced there (a producer's half of a handshake).
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// ... that also returns whether any of them passed true.
__device__ __forceinline__ bool named_sync_or(int id, int threads, bool pred) {
  std::uint32_t any;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.or.pred q, %2, %3, p;\n"
      "selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(any)
      : "r"(static_cast<std::uint32_t>(pred)), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
}

}  // namespace fattn::cuda
