// fattn-bench — the AMX tile unit's peak: a register-resident TDPBF16PS loop.
//
// amx_loops.cpp is compiled with the AMX flags where the compiler has them (the library's
// FATTN_HAVE_AMX); elsewhere its loop is null.
#pragma once

#include <cstdint>

namespace fattn_bench {

struct AmxLoop {
  // Runs `iterations` rounds of four independent TDPBF16PS (four accumulator tiles, the
  // operand tiles loaded once) and returns a checksum; the caller has asked Linux for
  // the tile state (fattn::cpu_supports(Isa::amx)). Null without AMX in the build.
  float (*loop)(std::int64_t iterations, float unused_multiplier, float unused_addend);
  std::int64_t bf16_flops_per_iteration;  // 4 × 16·16·32 multiply-adds × 2
};

extern const AmxLoop amx_tile_loop;

}  // namespace fattn_bench
