// fattn-bench — FLOP count, traffic and arithmetic-intensity models (see model.hpp).
#include "model.hpp"

#include <algorithm>

namespace fattn_bench {
namespace {

// Each query and output row is D elements; each K and V head is Sk rows of D elements.
std::int64_t q_elements(const Shape& s) { return s.batch * s.q_heads * s.q_len * s.head_dim; }
std::int64_t kv_elements(const Shape& s) { return s.batch * s.kv_heads * s.kv_len * s.head_dim; }
std::int64_t lse_bytes(const Shape& s) {
  return s.lse_written ? kLseBytes * s.batch * s.q_heads * s.q_len : 0;
}

// Passes over the N visible scores of each naive stage (model.hpp): stage 1 writes S;
// the softmax reads S (max), reads S and writes P (exp), reads and writes P (normalise);
// stage 3 reads P.
constexpr std::int64_t kQkScorePasses = 1;
constexpr std::int64_t kSoftmaxScorePasses = 5;
constexpr std::int64_t kPvScorePasses = 1;

// Softmax FLOPs per visible score, by kind (model.hpp).
constexpr std::int64_t kMaxFlopsPerScore = 1;    // compare
constexpr std::int64_t kExpFlopsPerScore = 2;    // subtract the max, exponentiate
constexpr std::int64_t kSumFlopsPerScore = 1;    // add
constexpr std::int64_t kScaleFlopsPerScore = 2;  // × 1/sqrt(D), × 1/rowsum
// Q·Kᵀ or P·V: a multiply and an add per pair and dimension.
constexpr std::int64_t kGemmFlopsPerPairPerDim = 2;

double ratio(std::int64_t numerator, std::int64_t denominator) {
  return static_cast<double>(numerator) / static_cast<double>(denominator);
}

std::int64_t gemm_flops(const Shape& s) {
  return kGemmFlopsPerPairPerDim * visible_scores(s) * s.head_dim;
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

std::int64_t visible_scores(const Shape& s) { return s.batch * s.q_heads * visible_pairs(s); }

std::int64_t flops(const Shape& s) { return 2 * gemm_flops(s); }  // Q·Kᵀ and P·V

SoftmaxFlops softmax_flops(const Shape& s) {
  const std::int64_t n = visible_scores(s);
  return {kMaxFlopsPerScore * n, kExpFlopsPerScore * n, kSumFlopsPerScore * n,
          kScaleFlopsPerScore * n};
}

const char* to_string(NaiveStage stage) {
  switch (stage) {
    case NaiveStage::qk_gemm: return "qk_gemm";
    case NaiveStage::softmax: return "softmax";
    case NaiveStage::pv_gemm: return "pv_gemm";
  }
  return "?";
}

Traffic naive_stage_traffic(const Shape& s, NaiveStage stage) {
  const std::int64_t e = s.element_bytes, n = visible_scores(s);
  Traffic t;
  switch (stage) {
    case NaiveStage::qk_gemm:
      t.q = e * q_elements(s);
      t.k = e * kv_elements(s);
      t.scores = e * kQkScorePasses * n;
      break;
    case NaiveStage::softmax:
      t.scores = e * kSoftmaxScorePasses * n;
      t.lse = lse_bytes(s);
      break;
    case NaiveStage::pv_gemm:
      t.scores = e * kPvScorePasses * n;
      t.v = e * kv_elements(s);
      t.o = e * q_elements(s);
      break;
  }
  return t;
}

std::int64_t naive_stage_flops(const Shape& s, NaiveStage stage) {
  return stage == NaiveStage::softmax ? softmax_flops(s).total() : gemm_flops(s);
}

double naive_stage_ai(const Shape& s, NaiveStage stage) {
  return ratio(naive_stage_flops(s, stage), naive_stage_traffic(s, stage).total());
}

Traffic fused_traffic(const Shape& s) {
  const std::int64_t e = s.element_bytes;
  Traffic t;
  t.q = t.o = e * q_elements(s);
  t.k = t.v = e * kv_elements(s);
  t.lse = lse_bytes(s);
  return t;
}

std::int64_t fused_bytes(const Shape& s) { return fused_traffic(s).total(); }

std::int64_t fused_bytes_kv_reread(const Shape& s, int query_tile_rows) {
  std::int64_t keys_per_head = 0;  // Σ over query tiles of the keys each visits
  for (std::int64_t first = 0; first < s.q_len; first += query_tile_rows) {
    const std::int64_t last = std::min<std::int64_t>(first + query_tile_rows, s.q_len) - 1;
    keys_per_head += keys_for_tile(s, last);
  }
  const std::int64_t kv_reads = s.batch * s.q_heads * 2 * keys_per_head * s.head_dim;  // K and V
  return s.element_bytes * (2 * q_elements(s) + kv_reads) + lse_bytes(s);
}

std::int64_t naive_bytes(const Shape& s) {
  std::int64_t bytes = 0;
  for (NaiveStage stage : kNaiveStages) bytes += naive_stage_traffic(s, stage).total();
  return bytes;
}

double fused_ai(const Shape& s) { return ratio(flops(s), fused_bytes(s)); }
double fused_ai_kv_reread(const Shape& s, int query_tile_rows) {
  return ratio(flops(s), fused_bytes_kv_reread(s, query_tile_rows));
}
double naive_ai(const Shape& s) { return ratio(flops(s), naive_bytes(s)); }

int query_tile_rows(fattn::Isa isa) { return fattn::cpu_query_tile(isa); }

const char* model_help() {
  return "Model (fp32; FLOPs = 4*B*Hq*pairs*D, pairs = visible (query,key) pairs,\n"
         "counted exactly for the causal alignment in use; the softmax's 6 FLOPs per\n"
         "score - max 1, exp 2, sum 1, scale 2 - are stated apart). Arithmetic\n"
         "intensity = FLOPs / DRAM bytes, each tensor read or written once:\n"
         "  fused: 4*(|Q|+|K|+|V|+|O| [+|LSE|]); assumes K/V tiles are re-read from\n"
         "         cache. JSON fused_ai_kv_reread instead re-reads K and V from DRAM\n"
         "         once per query tile of Br rows (fattn::cpu_query_tile: 64 avx512).\n"
         "  naive: fused bytes + 4*7*N, N = B*Hq*pairs scores, per stage: qk_gemm\n"
         "         writes S (1 pass), softmax reads S (max), reads S + writes P (exp),\n"
         "         reads + writes P (normalise) (5 passes), pv_gemm reads P (1 pass).\n"
         "         Each stage is timed apart (JSON \"stages\", fattn::last_naive_stage_seconds).\n"
         "JSON \"model\" tabulates every stage for fp32 and 16-bit at S = 128..4096.\n"
         "Error: max |out - float64 reference| over the whole output when\n"
         "B*Hq*Sq*Sk <= 2^26, else over 32 rows sampled across batch, heads and rows.";
}

}  // namespace fattn_bench
