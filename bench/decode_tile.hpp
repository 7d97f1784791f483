// fattn-decode-tile — the decode kernel's key tile, piece by piece, with its rows in cache:
// what a tile's scores, online softmax, P·V and the next tile's prefetch each cost a key
// (src/cpu/decode/ops.hpp, one worker's loop without the work items around it). The
// timed loops are compiled once per ISA (decode_tile_isa.cpp), like the library's kernels.
#pragma once

#include <cstdint>

namespace fattn_bench {

enum class TileElement { float32, float16, bfloat16 };

struct DecodeTileRequest {
  TileElement element = TileElement::float32;
  int rows = 4;                // query rows of one kv head (GQA group × queries)
  int tiles = 4;               // key tiles cycled: 4 (in L2) or more (L3)
  std::int64_t head_dim = 128;
  int keys = 0;                // keys of each tile the pieces take (0: the whole tile)
  int rounds = 7;              // the best of these rounds
};

// Nanoseconds a key, each the best round.
struct DecodeTileTimes {
  int key_tile = 0, keys = 0;  // the kernel's keys a tile, and those taken
  double scores = 0, softmax = 0, values = 0, whole = 0;
  double scores_prefetching = 0, whole_prefetching = 0;  // with the next tile asked for
};

struct DecodeTileLoops {
  const char* isa;
  DecodeTileTimes (*run)(const DecodeTileRequest& request);
};

// avx512 and avx2 exist only on x86-64 builds.
extern const DecodeTileLoops avx512_decode_tile;
extern const DecodeTileLoops avx2_decode_tile;
extern const DecodeTileLoops portable_decode_tile;

}  // namespace fattn_bench
