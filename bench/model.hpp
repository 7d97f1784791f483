// fattn-bench — FLOP count, memory traffic and arithmetic intensity of each implementation.
//
// Notation: B batch, Hq/Hkv query/key-value heads, Sq/Sk lengths, D head dim,
// N = B·Hq·pairs the visible scores (pairs: the (query, key) pairs a causal mask leaves
// visible, counted exactly for the alignment in use; Sq·Sk without a mask), e the bytes
// of one element of Q, K, V, O and the S×S scores/probabilities (4 for fp32, 2 for a
// 16-bit type), and 4 bytes for each logsumexp (LSE is float32 always).
//
// FLOPs
//   Matrix products: Q·Kᵀ and P·V, 2·D FLOPs each per visible pair (multiply + add):
//   flops = 4·B·Hq·pairs·D. This is the figure GFLOP/s and the AI columns use.
//   Softmax, stated apart (softmax_flops), per visible score: max 1 (compare), exp 2
//   (subtract the max, exponentiate: exp counted as one FLOP), sum 1, scale 2 (by
//   1/sqrt(D), by 1/rowsum). 6·N in all: at D = 64 it is 6/(4·64) = 2.3 % of the
//   matmul FLOPs, so it never moves a kernel on the roofline except the softmax stage.
//
// Traffic: bytes moved to and from DRAM, each tensor counted once per read or write.
//   |Q| = |O| = B·Hq·Sq·D   |K| = |V| = B·Hkv·Sk·D   |LSE| = B·Hq·Sq (only if written)
//
//   naive, stage by stage (src/cpu/forward/naive.hpp; tile_ops.hpp softmax_update,
//   normalize_rows); the S×S buffer is far larger than any cache from S ≈ 1024 on:
//     qk_gemm   read Q, K; write S                                e·(|Q| + |K| + N)
//     softmax   max pass reads S (N); exp pass reads S, writes P   e·5·N [+ 4·|LSE|]
//               in place (2N); normalise pass reads, writes P (2N)
//     pv_gemm   read P, V; write O                                e·(N + |V| + |O|)
//     total     e·(|Q| + |K| + |V| + |O| + 7·N) [+ 4·|LSE|]
//   Causal: only the visible scores are counted; the kernel also computes the masked
//   part of each diagonal tile (at most Br·Sk per head — ignored).
//
//   fused   e·(|Q| + |K| + |V| + |O|) [+ 4·|LSE|]
//           Assumes what a query tile needs stays in cache: its Br query rows and
//           output accumulators (Br·D each), one Bc×D tile of K and of V, the Bc×Br
//           score tile (Br = 64, Bc = 96 with AVX-512: 16 + 24 + 24 KiB at D = 64), and
//           that the K and V of one head (2·Sk·D·e: 2 MiB at Sk = 4096, D = 64, fp32),
//           which every query tile of that head streams again, are re-read from L2/L3,
//           not DRAM. The scores never leave the tile.
//   fused, K/V re-read (pessimistic, JSON field fused_ai_kv_reread)
//           e·(|Q| + |O| + B·Hq·Σ_tiles 2·keys(tile)·D) [+ 4·|LSE|]: every query tile
//           of Br rows reads the K and V rows it visits from DRAM; keys(tile) = Sk, or
//           the tile's causal limit. Br = fattn::cpu_query_tile(isa).
// Neither model counts the K pre-pass both kernels share (K re-laid into panels).
#pragma once

#include <cstdint>

#include "fattn/attention.hpp"

namespace fattn_bench {

inline constexpr std::int64_t kFloatBytes = 4;  // fp32
inline constexpr std::int64_t kHalfBytes = 2;   // fp16 / bf16
inline constexpr std::int64_t kLseBytes = 4;    // the logsumexp is float32 always

struct Shape {
  std::int64_t batch = 1, q_heads = 1, kv_heads = 1, q_len = 1, kv_len = 1, head_dim = 64;
  fattn::Causal causal = fattn::Causal::none;
  bool lse_written = false;  // whether the logsumexp (B·Hq·Sq floats) is stored
  std::int64_t element_bytes = kFloatBytes;  // e: of Q, K, V, O, scores, probabilities
};

// Keys query row i sees: Sk, min(Sk, i+1) (top_left) or clamp(i+1+Sk−Sq, 0, Sk)
// (bottom_right).
std::int64_t visible_keys(const Shape& s, std::int64_t query_row);
// Keys a query tile of rows [first_row, last_row] visits: those its last row sees.
std::int64_t keys_for_tile(const Shape& s, std::int64_t last_row);
// Σ_i visible_keys(i): the (query, key) pairs of one head.
std::int64_t visible_pairs(const Shape& s);
// N = B·Hq·pairs: the visible scores of the whole problem.
std::int64_t visible_scores(const Shape& s);

// Matrix-product FLOPs of the whole attention: 4·B·Hq·pairs·D.
std::int64_t flops(const Shape& s);

// The softmax's FLOPs, each kind apart (see the top of this file).
struct SoftmaxFlops {
  std::int64_t max = 0, exp = 0, sum = 0, scale = 0;
  std::int64_t total() const { return max + exp + sum + scale; }
};
SoftmaxFlops softmax_flops(const Shape& s);

// Bytes of DRAM traffic, tensor by tensor (reads and writes added up).
struct Traffic {
  std::int64_t q = 0, k = 0, v = 0, o = 0, scores = 0, lse = 0;
  std::int64_t total() const { return q + k + v + o + scores + lse; }
};

enum class NaiveStage { qk_gemm, softmax, pv_gemm };
inline constexpr NaiveStage kNaiveStages[] = {NaiveStage::qk_gemm, NaiveStage::softmax,
                                              NaiveStage::pv_gemm};
const char* to_string(NaiveStage stage);

Traffic naive_stage_traffic(const Shape& s, NaiveStage stage);
// The FLOPs a stage does: its matrix product's (2·B·Hq·pairs·D), or the softmax's total.
std::int64_t naive_stage_flops(const Shape& s, NaiveStage stage);
double naive_stage_ai(const Shape& s, NaiveStage stage);

Traffic fused_traffic(const Shape& s);

// DRAM bytes of each whole-kernel model (see the comment at the top).
std::int64_t fused_bytes(const Shape& s);
std::int64_t fused_bytes_kv_reread(const Shape& s, int query_tile_rows);
std::int64_t naive_bytes(const Shape& s);  // the three stages together

// Matrix-product FLOPs / bytes.
double fused_ai(const Shape& s);
double fused_ai_kv_reread(const Shape& s, int query_tile_rows);
double naive_ai(const Shape& s);

// Br, the query rows of one fused work item, for a concrete ISA (not automatic).
int query_tile_rows(fattn::Isa isa);

// One-paragraph summary of the model for --help.
const char* model_help();

}  // namespace fattn_bench
