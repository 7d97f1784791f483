// fattn CUDA tests — the TMA probe's device side (tma_probe.cu, compiled for sm_90a only) as
// plain host functions, and the layout models the test checks its results against (plain
// C++: tma_probe.cu static_asserts that src/cuda/tma.cuh's helpers agree with them).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <vector>

namespace fattn_cuda_test::tma_probe {

constexpr int kThreads = 128;  // one warpgroup
constexpr int kBoxRows = 128;  // the kernel's K/V box (and Q's at 2 consumer warpgroups)
constexpr int kARows = 64;     // the probes' A operand: one warpgroup's query rows
constexpr int kKeys = 128;     // the kernel's Bc: N of S = Q·Kᵀ, K of O += P·V

// ---- layout models ------------------------------------------------------------------------
// Where 16-byte chunk `stored` of row r of a swizzled box holds data from, under each
// swizzle width: the chunk index XOR (address bits 7..) of the row, 3 bits for 128 B, 2 for
// 64 B, 1 for 32 B, none without swizzle.
enum class Swizzle : int { b128 = 0, b64 = 1, b32 = 2, none = 3 };
constexpr const char* kSwizzleNames[] = {"128B", "64B", "32B", "none"};
constexpr int swizzle_bits(Swizzle s) {
  return s == Swizzle::b128 ? 3 : s == Swizzle::b64 ? 2 : s == Swizzle::b32 ? 1 : 0;
}
// XOR of address bits [7, 7 + bits) into bits [4, 4 + bits): what both the copy engine and
// wgmma apply to a shared-memory byte address.
constexpr std::uint32_t swizzle_address(std::uint32_t a, Swizzle s) {
  const std::uint32_t mask = (1u << swizzle_bits(s)) - 1u;
  return a ^ (((a >> 7) & mask) << 4);
}
// The kernel's layout (src/cuda/tma.cuh, sw128_offset): byte of element (r, c) of a tile of
// `rows` rows in 64-column panels, swizzled with `s` (the kernel: 128 B).
constexpr std::uint32_t panel_offset(int rows, int r, int c, Swizzle s = Swizzle::b128) {
  const std::uint32_t linear = static_cast<std::uint32_t>((c / 64) * rows * 128 + r * 128 + (c % 64) * 2);
  return swizzle_address(linear, s);
}

// Where wgmma reads element (mn, k) of one k16 slice starting at byte `start`, for a
// descriptor with layout `s` and byte offsets lbo / sbo (CUTLASS's canonical layouts,
// cute/atom/mma_traits_sm90_gmma.hpp, in bytes of 16-bit elements). K-major: rows of the
// swizzle width W (or 16-byte core-matrix rows without swizzle), 8-row groups SBO apart;
// MN-major: W/2 consecutive mn in a W-byte row, the 8 k of a group one row apart, k groups
// SBO apart and W/2-wide mn blocks LBO apart (no swizzle: 8 mn per 16-byte row, k groups
// LBO apart, mn blocks SBO apart).
constexpr std::uint32_t wgmma_read_address(bool mn_major, std::uint32_t start, int mn, int k,
                                           Swizzle s, std::uint32_t lbo, std::uint32_t sbo) {
  const int w = 16 << swizzle_bits(s);  // swizzle width in bytes: 128, 64, 32 (16: none)
  std::uint32_t linear = start;
  if (!mn_major) {
    linear += (mn / 8) * sbo + (mn % 8) * (s == Swizzle::none ? 16 : w);
    linear += s == Swizzle::none ? (k / 8) * lbo + (k % 8) * 2 : k * 2;
  } else if (s == Swizzle::none) {
    linear += (mn % 8) * 2 + (mn / 8) * sbo + (k % 8) * 16 + (k / 8) * lbo;
  } else {
    linear += (mn / (w / 2)) * lbo + (mn % (w / 2)) * 2 + (k % 8) * w + (k / 8) * sbo;
  }
  return swizzle_address(linear, s);
}
// The kernel's slice starts (tma.cuh): K-major slice kk of an operand with `rows`-row panels,
// MN-major slice kk (16 rows of 128 bytes).
constexpr std::uint32_t k_slice_start(int rows, int kk) {
  return static_cast<std::uint32_t>((kk / 4) * rows * 128 + (kk % 4) * 32);
}
constexpr std::uint32_t mn_slice_start(int kk) { return static_cast<std::uint32_t>(kk * 2048); }

// ---- 1. TMA load under an mbarrier ------------------------------------------------------------
// A (B, H, S, head_dim) tensor of 16-bit values (row stride `row` elements >= head_dim, BHSD
// or BSHD order), loaded as two 128-row boxes with the kernel's own tensor map
// (src/cuda/tensor_map.hpp) and TMA call, each of `panels` 64-column copies completing on one
// mbarrier: phase 0 the first box, phase 1 the second.
struct LoadSetup {
  int batch = 1, heads = 1, seq = 1, head_dim = 64, row = 64;
  bool bshd = false;
  int panels = 1;                // 64-column copies per box: 1 (D <= 64) or 2 (D = 128)
  std::array<int, 3> box[2] = {};  // (seq start, head, batch) of each phase's box
  std::int64_t batch_stride() const { return bshd ? std::int64_t(seq) * heads * row : std::int64_t(heads) * seq * row; }
  std::int64_t head_stride() const { return bshd ? row : std::int64_t(seq) * row; }
  std::int64_t seq_stride() const { return bshd ? std::int64_t(heads) * row : row; }
  std::int64_t elements() const { return std::int64_t(batch) * heads * seq * row; }
  std::uint32_t box_bytes() const { return static_cast<std::uint32_t>(panels * kBoxRows * 128); }
};
struct BarrierPhase {
  bool completed = false;          // the bounded wait saw the phase complete
  long long polls = 0;             // try_wait calls that returned false first
  bool test_same = false;          // test_wait.parity(phase parity) right after: expected true
  bool test_other = false;         // test_wait.parity(other parity): expected false
  std::uint64_t raw_before = 0;    // the barrier's 64-bit word before the arrive (opaque)
  std::uint64_t raw_after = 0;     // ... after the wait
};
struct LoadResult {
  int encode_status = -1;          // cuTensorMapEncodeTiled's CUresult (0: success)
  BarrierPhase phase[2];
  std::vector<std::uint16_t> smem[2];  // each box's shared memory as it landed
};
// `tensor` holds setup.elements() values. Returns the first CUDA error.
cudaError_t run_load(const LoadSetup& setup, const std::vector<std::uint16_t>& tensor,
                     LoadResult& result);

// ---- 2. wgmma on the swizzled tiles --------------------------------------------------------
// Descriptor fields for the operand(s) under test. `kernel` = true: the kernel's own
// descriptors and issue functions (tma.cuh: sw128_*_desc; wgmma.cuh: issue_qk, issue_pv with
// tma.cuh's Sw128Slices);
// else these fields with the kernel's slice starts.
struct DescFields {
  bool kernel = true;
  int layout = 1;  // bits 62-63: 0 interleave, 1 128B, 2 64B, 3 32B (sm_90)
  std::uint32_t lbo = 0, sbo = 0;
  int base_offset = 0;
};
struct WgmmaResult {
  int encode_status = -1;
  bool loaded = false;                     // the mbarrier phase completed
  std::vector<float> raw;                  // thread·regs + i: every thread's accumulators
  std::vector<std::uint16_t> smem_a, smem_b;  // the operands' shared memory (A: QK only)
};
// S = A·Bᵀ as the kernel's Q·Kᵀ: a is 64×D (row-major), b is keys×D (row-major), both
// TMA-loaded into swizzled tiles (64- and keys-row panels), D/16 SS wgmma m64n<keys>k16.
// raw: keys/2 accumulators per thread. D and keys are 64 or 128 (the forward's key tile:
// 128; the backward's 64-row B tiles: 64).
cudaError_t run_qk(const std::vector<__half>& a, const std::vector<__half>& b, int D,
                   const DescFields& desc, WgmmaResult& result, int keys = kKeys);
// O = P·V as the kernel's: p is 64×keys (row-major), each thread's RS A fragments loaded from
// it by the layout of src/cuda/wgmma.cuh; v is keys×D (row-major), TMA-loaded swizzled;
// keys/16 RS wgmma m64nDk16 with V MN-major (LBO: keys·128 bytes). raw: D/2 accumulators
// per thread.
cudaError_t run_pv(const std::vector<__half>& p, const std::vector<__half>& v, int D,
                   const DescFields& desc, WgmmaResult& result, int keys = kKeys);

// The swizzled descriptor encoding (src/cuda/tma.cuh), callable without a GPU.
std::uint64_t encode_descriptor(std::uint32_t smem_addr, std::uint32_t lbo, std::uint32_t sbo,
                                int base_offset, int layout);

}  // namespace fattn_cuda_test::tma_probe
