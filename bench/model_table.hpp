// fattn-bench — the FLOP/traffic/AI model tabulated for the report (JSON "model").
//
// For S = 128, 512, 1024, 4096 (B = Hq = Hkv = 1: the AI of multi-head attention does
// not depend on B or H), the run's head dim, fp32 and 16-bit, no mask, no logsumexp:
// one row per naive stage and for the naive total, fused and fused with K/V re-read.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

namespace fattn_bench {

inline constexpr std::int64_t kModelSeqLens[] = {128, 512, 1024, 4096};

// query_tile_rows: Br of the fused K/V re-read model.
nlohmann::ordered_json model_table(std::int64_t head_dim, int query_tile_rows);

}  // namespace fattn_bench
