// fattn-bench — FLOP count and analytical arithmetic intensity of each implementation.
//
// FLOPs
//   Two matrix products per visible (query, key) pair, each 2·D FLOPs (multiply + add):
//   flops = 4 · B · Hq · pairs · D, where pairs counts the (i, j) pairs a causal mask
//   leaves visible, exactly, for the alignment in use (Sq·Sk without a mask). The
//   softmax's exp, max and divide are not counted (the usual convention).
//
// Arithmetic intensity (AI) = flops / DRAM bytes, fp32 (4 bytes an element).
// Every tensor is counted as read or written once from/to DRAM:
//   |Q| = |O| = B·Hq·Sq·D   |K| = |V| = B·Hkv·Sk·D   |LSE| = B·Hq·Sq (only if written)
//
//   fused   bytes = 4 · (|Q| + |K| + |V| + |O| [+ |LSE|])
//           Assumes the K/V tiles each query tile streams are re-read from cache, not
//           DRAM (K and V of one head: 2·Sk·D·4 bytes, 1 MiB at Sk = 2048, D = 64).
//   fused, K/V re-read (pessimistic, JSON field fused_ai_kv_reread)
//           bytes = 4 · (|Q| + |O| [+ |LSE|] + B·Hq·Σ_tiles 2·keys(tile)·D)
//           every query tile of Br rows reads the K and V rows it visits from DRAM;
//           keys(tile) = Sk, or the tile's causal limit (tiles skip keys past it).
//           Br = fattn::cpu_query_tile(isa): 64 (avx512), 24 (avx2), 8 (portable).
//   naive   bytes = 4 · (|Q| + |K| + |V| + |O| [+ |LSE|] + 7·N),  N = B·Hq·pairs scores
//           stage 1  read Q, K; write S                        N
//           stage 2  max pass reads S                          N
//                    exp pass reads S, writes P in place       2N
//                    normalise pass reads P, writes P          2N
//           stage 3  read P, V; write O                        N
//           (src/cpu/naive.hpp; tile_ops.hpp softmax_update, normalize_rows.)
//           Causal: only the visible scores are counted; the kernel also computes the
//           masked part of each diagonal tile (at most Br·Sk per head — ignored).
// Neither model counts the K pre-pass both kernels share (K re-laid into panels).
#pragma once

#include <cstdint>

#include "fattn/attention.hpp"

namespace fattn_bench {

inline constexpr std::int64_t kFloatBytes = 4;  // fp32

struct Shape {
  std::int64_t batch = 1, q_heads = 1, kv_heads = 1, q_len = 1, kv_len = 1, head_dim = 64;
  fattn::Causal causal = fattn::Causal::none;
  bool lse_written = false;  // whether the logsumexp (B·Hq·Sq floats) is stored
};

// Keys query row i sees: Sk, min(Sk, i+1) (top_left) or clamp(i+1+Sk−Sq, 0, Sk)
// (bottom_right).
std::int64_t visible_keys(const Shape& s, std::int64_t query_row);
// Keys a query tile of rows [first_row, last_row] visits: those its last row sees.
std::int64_t keys_for_tile(const Shape& s, std::int64_t last_row);
// Σ_i visible_keys(i): the (query, key) pairs of one head.
std::int64_t visible_pairs(const Shape& s);

std::int64_t flops(const Shape& s);

// DRAM bytes of each model (see the comment at the top).
std::int64_t fused_bytes(const Shape& s);
std::int64_t fused_bytes_kv_reread(const Shape& s, int query_tile_rows);
std::int64_t naive_bytes(const Shape& s);

double fused_ai(const Shape& s);
double fused_ai_kv_reread(const Shape& s, int query_tile_rows);
double naive_ai(const Shape& s);

// Br, the query rows of one fused work item, for a concrete ISA (not automatic).
int query_tile_rows(fattn::Isa isa);

// One-paragraph summary of the model for --help.
const char* model_help();

}  // namespace fattn_bench
