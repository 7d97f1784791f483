// fattn — the AMX tile instructions the kernels use, in software, for a build that tests
// the AMX kernels on a CPU without AMX (cmake -DFATTN_AMX_EMULATION=ON; the CPU needs the
// kernels' other instructions, AVX-512BW and AVX512-BF16). Every other instruction of the
// AMX kernels runs as it is: only the tile registers and their five instructions are
// emulated, per thread, as the hardware keeps them.
//
// TDPBF16PS as Intel's pseudo-code states it: C[m][n] += A[m][2k]·B[k][2n], then
// += A[m][2k+1]·B[k][2n+1], for k in order; bfloat16 products are exact in float32, each
// sum rounds to nearest even; denormal inputs read as zero and denormal sums flush to zero.
// The emulation is slow (scalar products) and for tests only: cpu_supports(Isa::amx) says
// yes, but best_cpu_isa() never picks the emulated AMX.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace fattn::cpu::amx_emulation {

struct TileState {
  alignas(64) unsigned char data[8][16][64];
  std::uint16_t row_bytes[8];
  std::uint8_t rows[8];
};
inline thread_local TileState tile_state;

inline void load_config(const void* config) {
  const auto* c = static_cast<const unsigned char*>(config);
  for (int t = 0; t < 8; ++t) {
    std::memcpy(&tile_state.row_bytes[t], c + 16 + 2 * t, 2);
    tile_state.rows[t] = c[48 + t];
  }
}
inline void release() { std::memset(&tile_state, 0, sizeof tile_state); }

inline void load(int t, const void* base, long stride) {
  for (int r = 0; r < tile_state.rows[t]; ++r)
    std::memcpy(tile_state.data[t][r], static_cast<const char*>(base) + r * stride,
                tile_state.row_bytes[t]);
}
inline void store(int t, void* base, long stride) {
  for (int r = 0; r < tile_state.rows[t]; ++r)
    std::memcpy(static_cast<char*>(base) + r * stride, tile_state.data[t][r],
                tile_state.row_bytes[t]);
}
inline void zero(int t) { std::memset(tile_state.data[t], 0, sizeof tile_state.data[t]); }

inline float bf16_at(const unsigned char* row, int i) {
  std::uint16_t h;
  std::memcpy(&h, row + 2 * i, 2);
  if ((h & 0x7F80u) == 0) h &= 0x8000u;  // a denormal reads as zero
  const std::uint32_t bits = std::uint32_t{h} << 16;
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}
inline float flush(float x) { return std::fabs(x) < 1.17549435e-38f ? 0.0f * x : x; }

inline void dpbf16ps(int c, int a, int b) {
  const int m_rows = tile_state.rows[c], n_cols = tile_state.row_bytes[c] / 4;
  const int k_pairs = tile_state.row_bytes[a] / 4;
  for (int m = 0; m < m_rows; ++m) {
    const unsigned char* a_row = tile_state.data[a][m];
    for (int n = 0; n < n_cols; ++n) {
      float acc;
      std::memcpy(&acc, tile_state.data[c][m] + 4 * n, 4);
      for (int k = 0; k < k_pairs; ++k) {
        const unsigned char* b_row = tile_state.data[b][k];
        acc = flush(acc + bf16_at(a_row, 2 * k) * bf16_at(b_row, 2 * n));
        acc = flush(acc + bf16_at(a_row, 2 * k + 1) * bf16_at(b_row, 2 * n + 1));
      }
      std::memcpy(tile_state.data[c][m] + 4 * n, &acc, 4);
    }
  }
}

}  // namespace fattn::cpu::amx_emulation

#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbf16ps
#define _tile_loadconfig(config) ::fattn::cpu::amx_emulation::load_config(config)
#define _tile_release() ::fattn::cpu::amx_emulation::release()
#define _tile_loadd(t, base, stride) ::fattn::cpu::amx_emulation::load(t, base, stride)
#define _tile_stored(t, base, stride) ::fattn::cpu::amx_emulation::store(t, base, stride)
#define _tile_zero(t) ::fattn::cpu::amx_emulation::zero(t)
#define _tile_dpbf16ps(c, a, b) ::fattn::cpu::amx_emulation::dpbf16ps(c, a, b)
