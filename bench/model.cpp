// fattn-bench — FLOP count and arithmetic-intensity models (see model.hpp).
#include "model.hpp"

#include <algorithm>

namespace fattn_bench {
namespace {

// Each query and output row is D floats; each K and V head is Sk rows of D floats.
std::int64_t q_elements(const Shape& s) { return s.batch * s.q_heads * s.q_len * s.head_dim; }
std::int64_t kv_elements(const Shape& s) { return s.batch * s.kv_heads * s.kv_len * s.head_dim; }
std::int64_t lse_elements(const Shape& s) {
  return s.lse_written ? s.batch * s.q_heads * s.q_len : 0;
}

// Score-matrix traffic of the naive path, in passes over the N visible scores:
// stage 1 write (1) + max read (1) + exp read/write (2) + normalise read/write (2)
// + stage 3 read (1).
constexpr std::int64_t kNaiveScorePasses = 7;

double ratio(std::int64_t numerator, std::int64_t denominator) {
  return static_cast<double>(numerator) / static_cast<double>(denominator);
}

}  // namespace

std::int64_t visible_keys(const Shape& s, std::int64_t query_row) {
  switch (s.causal) {
    case fattn::Causal::none: return s.kv_len;
    case fattn::Causal::top_left: return std::min(s.kv_len, query_row + 1);
    case fattn::Causal::bottom_right:
      return std::clamp<std::int64_t>(query_row + 1 + (s.kv_len - s.q_len), 0, s.kv_len);
  }
  return s.kv_len;
}

std::int64_t keys_for_tile(const Shape& s, std::int64_t last_row) {
  // Visible keys grow with the row under both alignments, so the last row's count
  // is the tile's causal limit.
  return visible_keys(s, last_row);
}

std::int64_t visible_pairs(const Shape& s) {
  if (s.causal == fattn::Causal::none) return s.q_len * s.kv_len;
  std::int64_t pairs = 0;
  for (std::int64_t i = 0; i < s.q_len; ++i) pairs += visible_keys(s, i);
  return pairs;
}

std::int64_t flops(const Shape& s) {
  // Q·Kᵀ and P·V: 2·D FLOPs each per visible pair.
  constexpr std::int64_t kFlopsPerPairPerDim = 4;
  return kFlopsPerPairPerDim * s.batch * s.q_heads * visible_pairs(s) * s.head_dim;
}

std::int64_t fused_bytes(const Shape& s) {
  const std::int64_t elements = 2 * q_elements(s) + 2 * kv_elements(s) + lse_elements(s);
  return kFloatBytes * elements;
}

std::int64_t fused_bytes_kv_reread(const Shape& s, int query_tile_rows) {
  std::int64_t keys_per_head = 0;  // Σ over query tiles of the keys each visits
  for (std::int64_t first = 0; first < s.q_len; first += query_tile_rows) {
    const std::int64_t last = std::min<std::int64_t>(first + query_tile_rows, s.q_len) - 1;
    keys_per_head += keys_for_tile(s, last);
  }
  const std::int64_t kv_reads = s.batch * s.q_heads * 2 * keys_per_head * s.head_dim;  // K and V
  return kFloatBytes * (2 * q_elements(s) + lse_elements(s) + kv_reads);
}

std::int64_t naive_bytes(const Shape& s) {
  const std::int64_t scores = s.batch * s.q_heads * visible_pairs(s);
  return fused_bytes(s) + kFloatBytes * kNaiveScorePasses * scores;
}

double fused_ai(const Shape& s) { return ratio(flops(s), fused_bytes(s)); }
double fused_ai_kv_reread(const Shape& s, int query_tile_rows) {
  return ratio(flops(s), fused_bytes_kv_reread(s, query_tile_rows));
}
double naive_ai(const Shape& s) { return ratio(flops(s), naive_bytes(s)); }

int query_tile_rows(fattn::Isa isa) { return fattn::cpu_query_tile(isa); }

const char* model_help() {
  return "Model (fp32; FLOPs = 4*B*Hq*pairs*D, pairs = visible (query,key) pairs,\n"
         "counted exactly for the causal alignment in use). Arithmetic intensity =\n"
         "FLOPs / DRAM bytes, each tensor read or written once:\n"
         "  fused: 4*(|Q|+|K|+|V|+|O| [+|LSE|]); assumes K/V tiles are re-read from\n"
         "         cache. JSON fused_ai_kv_reread instead re-reads K and V from DRAM\n"
         "         once per query tile of Br rows (fattn::cpu_query_tile: 64 avx512).\n"
         "  naive: fused bytes + 4*7*N, N = B*Hq*pairs scores: stage 1 writes S,\n"
         "         softmax reads S (max), reads S + writes P (exp), reads + writes P\n"
         "         (normalise), stage 3 reads P.\n"
         "Error: max |out - float64 reference| over the whole output when\n"
         "B*Hq*Sq*Sk <= 2^26, else over 32 rows sampled across batch, heads and rows.";
}

}  // namespace fattn_bench
