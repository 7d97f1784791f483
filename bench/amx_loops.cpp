// fattn-bench — the AMX peak loop (see amx_loops.hpp).
#include "amx_loops.hpp"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include "cpu/amx/tiles.hpp"
#endif

namespace fattn_bench {

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
namespace {

using fattn::cpu::kTileRowBytes;
using fattn::cpu::kTileRows;
constexpr int kProducts = 4;
// 16×16 outputs, each a dot product over a row of 32 bfloat16 (64 bytes): 2 FLOPs a term.
constexpr std::int64_t kFlopsPerProduct =
    std::int64_t{kTileRows} * kTileRows * (kTileRowBytes / 2) * 2;

float tile_loop(std::int64_t iterations, float, float) {
  // Operands 2^-10 (bfloat16 0x3A80): each product adds 32·2^-20 an element, far from
  // overflow for any run length here; the values do not change the speed.
  alignas(64) std::uint16_t operand[kTileRows * kTileRowBytes / 2];
  for (std::uint16_t& x : operand) x = 0x3A80;
  alignas(64) float out[kTileRows * kTileRowBytes / 4];
  fattn::cpu::load_tile_config();
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, operand, kTileRowBytes);
  _tile_loadd(5, operand, kTileRowBytes);
  _tile_loadd(6, operand, kTileRowBytes);
  _tile_loadd(7, operand, kTileRowBytes);
  for (std::int64_t i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, kTileRowBytes);
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
