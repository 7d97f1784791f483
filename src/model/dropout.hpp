// fattn — attention dropout: which probabilities survive, defined once for every kernel.
//
// With dropout probability p, the normalized probability P[b,h,i,j] of query i and key j
// is kept with probability 1 − p and scaled by 1/(1 − p), or dropped (0), before P·V
// (where torch's scaled_dot_product_attention applies it); the logsumexp is the
// undropped one. Whether (b, h, i, j) is kept is a pure function of (seed, offset, b, h,
// i, j): no mask is stored, the backward regenerates it, and the answer does not depend
// on tiling, threads or device.
//
// The function: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC 2011; the generator of torch's and Triton's dropout) with key (seed low 32 bits,
// seed high 32 bits) and counter (i, j / 8, b·Hq + h, offset), all taken mod 2^32: its
// four 32-bit words hold eight 16-bit draws, key j taking draw j % 8 (word (j % 8) / 2, its
// low half for even j, high half for odd): kept iff draw >= threshold = round(p · 2^16)
// (the keep rate is 1 − p within 2^-17; p = 0.1 keeps 0.899994). Sixteen bits a draw
// halve the generator's work against one word a key (the CPU's dropout cost,
// docs/perf-log.md), where FlashAttention's 8-bit draws would move the keep rate by up to
// 2^-9. Triton's philox(seed, c0, c1, c2, c3) with 32-bit counters computes the same
// words (python/fattn/triton/dropout.py).
#pragma once

#include <cmath>
#include <cstdint>

namespace fattn::detail {

struct Philox {
  static constexpr std::uint32_t kMulA = 0xD2511F53u, kMulB = 0xCD9E8D57u;
  static constexpr std::uint32_t kKeyA = 0x9E3779B9u, kKeyB = 0xBB67AE85u;
  static constexpr int kRounds = 10;
};

// The dropout of one problem: p, its threshold and survivors' scale, the stream.
struct Dropout {
  double p = 0.0;                 // 0: off
  std::uint32_t threshold = 0;    // a 16-bit draw below it drops its key
  float scale = 1.0f;             // 1/(1 − p), the survivors' factor
  std::uint64_t seed = 0;
  std::uint32_t offset = 0;
  // A problem that is sequence s of a ragged batch (Problem::sequence) counts b as s,
  // whatever index its tiles carry; -1: b is the tile's batch index.
  std::int64_t sequence = -1;

  bool on() const { return p > 0.0; }
  // The counter's third word for head h of batch (or sequence) b: b·Hq + h.
  std::uint32_t head_stream(std::int64_t b, std::int64_t h, std::int64_t q_heads) const {
    return static_cast<std::uint32_t>((sequence >= 0 ? sequence : b) * q_heads + h);
  }
  static constexpr int kKeysPerCall = 8;  // 16-bit draws of one Philox evaluation
  static std::uint32_t threshold_of(double p) {
    const double t = std::nearbyint(p * 65536.0);
    return t >= 65535.0 ? 65535u : static_cast<std::uint32_t>(t);
  }
};

// The four words of the counter (c0, c1, c2, c3) under Philox4x32-10 with the seed's key.
inline void philox4x32(std::uint64_t seed, std::uint32_t c[4]) {
  std::uint32_t k0 = static_cast<std::uint32_t>(seed), k1 = static_cast<std::uint32_t>(seed >> 32);
  for (int r = 0; r < Philox::kRounds; ++r) {
    const std::uint64_t a = std::uint64_t{Philox::kMulA} * c[0];
    const std::uint64_t b = std::uint64_t{Philox::kMulB} * c[2];
    const std::uint32_t c1 = c[1], c3 = c[3];
    c[0] = static_cast<std::uint32_t>(b >> 32) ^ c1 ^ k0;
    c[2] = static_cast<std::uint32_t>(a >> 32) ^ c3 ^ k1;
    c[1] = static_cast<std::uint32_t>(b);
    c[3] = static_cast<std::uint32_t>(a);
    k0 += Philox::kKeyA;
    k1 += Philox::kKeyB;
  }
}

// Whether P[b, h, i, j] survives (q_heads: Hq, for the counter's b·Hq + h).
inline bool dropout_keeps(const Dropout& d, std::int64_t b, std::int64_t h, std::int64_t q_heads,
                          std::int64_t i, std::int64_t j) {
  std::uint32_t c[4] = {static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(j >> 3),
                        d.head_stream(b, h, q_heads), d.offset};
  philox4x32(d.seed, c);
  const std::uint32_t word = c[(j & 7) >> 1];
  return ((j & 1) ? word >> 16 : word & 0xffffu) >= d.threshold;
}

}  // namespace fattn::detail
