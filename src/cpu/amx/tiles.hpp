// fattn — the AMX tile configuration: eight tile registers of 16 rows × 64 bytes
// (palette 1), loaded per thread. Used by the AMX kernels (AmxOps::Scope) and by
// fattn-bench's tile peak loop (bench/amx_loops.cpp).
#pragma once

#if defined(__AMX_TILE__)
#include <immintrin.h>
#if defined(FATTN_AMX_EMULATION)
#include "cpu/amx/emulation.hpp"  // the tile instructions in software, for tests
#endif

#include <cstdint>

namespace fattn::cpu {

inline constexpr int kTileRegisters = 8;
inline constexpr int kTileRows = 16;
inline constexpr int kTileRowBytes = 64;

// Loads the configuration for the calling thread; _tile_release() undoes it.
inline void load_tile_config() {
  struct alignas(64) {
    std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
    std::uint16_t bytes_per_row[16] = {};
    std::uint8_t rows[16] = {};
  } config;
  for (int t = 0; t < kTileRegisters; ++t) {
    config.bytes_per_row[t] = kTileRowBytes;
    config.rows[t] = kTileRows;
  }
  // GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes of the config, so the
  // stores of the rest could be dropped as dead (seen: #GP on ldtilecfg once the
  // surrounding code changed); the fence makes them happen first.
  __asm__ volatile("" ::: "memory");
  _tile_loadconfig(&config);
}

}  // namespace fattn::cpu
#endif
