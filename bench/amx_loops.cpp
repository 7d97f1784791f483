// fattn-bench — the AMX peak loop (see amx_loops.hpp).
#include "amx_loops.hpp"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#endif

namespace fattn_bench {

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
namespace {

constexpr int kRows = 16, kRowBytes = 64;
constexpr int kProducts = 4;
constexpr std::int64_t kFlopsPerProduct = std::int64_t{16} * 16 * 32 * 2;

float tile_loop(std::int64_t iterations, float, float) {
  struct alignas(64) {
    std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
    std::uint16_t bytes_per_row[16] = {};
    std::uint8_t rows[16] = {};
  } config;
  for (int t = 0; t < 8; ++t) {
    config.bytes_per_row[t] = kRowBytes;
    config.rows[t] = kRows;
  }
  // Operands 2^-10 (bfloat16 0x3A80): each product adds 32·2^-20 an element, far from
  // overflow for any run length here; the values do not change the speed.
  alignas(64) std::uint16_t operand[kRows * kRowBytes / 2];
  for (std::uint16_t& x : operand) x = 0x3A80;
  alignas(64) float out[kRows * kRowBytes / 4];
  __asm__ volatile("" ::: "memory");  // the config stores first (amx_ops.hpp, Scope)
  _tile_loadconfig(&config);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, operand, kRowBytes);
  _tile_loadd(5, operand, kRowBytes);
  _tile_loadd(6, operand, kRowBytes);
  _tile_loadd(7, operand, kRowBytes);
  for (std::int64_t i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, kRowBytes);
  __asm__ volatile("" ::: "memory");
  _tile_release();
  return out[0];
}

}  // namespace

const AmxLoop amx_tile_loop = {tile_loop, kProducts * kFlopsPerProduct};
#else
const AmxLoop amx_tile_loop = {nullptr, 0};
#endif

}  // namespace fattn_bench
