// fattn — fused attention in exact float32 arithmetic (FMA units, no tensor cores).
//
// One block of 256 threads = one query tile of Br = 64 rows of one (batch, head);
// thread (r, c) = (tid / 16, tid % 16) owns query rows 4r..4r+3. Per key tile of Bc
// keys (tile_config.hpp):
//   S = Q·Kᵀ        thread (r, c) computes rows 4r.. × keys c, c+16, ... (float4 loads)
//   S ← S·scale·log2(e), masked; online softmax, row reductions over the 16 lanes
//                   of a half-warp (the threads with the same r)
//   P → shared memory
//   O ← alpha·O + P·V   thread (r, c) accumulates rows 4r.. × dims c, c+16, ...
// then out = O / l, lse = ln 2 · (m + log2 l). Same K/V pipeline as the 3xTF32 kernel,
// and the same care for NaN / Inf values at hidden keys (tiles crossing the causal
// diagonal are scanned; if one is found, each row sums its visible keys only).
#pragma once

#include "cuda/async_copy.cuh"
#include "cuda/common.cuh"
#include "cuda/tile_config.hpp"

namespace fattn::cuda {

template <int kD>
struct FmaShape {
  static constexpr int kThreads = 256;
  static constexpr int kBr = fma_tiles(kD).br;
  static constexpr int kBc = fma_tiles(kD).bc;
  static constexpr int kRows = kBr / 16;  // query rows per thread
  static constexpr int kCols = kBc / 16;  // keys per thread in a score tile
  static constexpr int kOut = kD / 16;    // output dims per thread
  static constexpr int kPitch = kD + 4;   // +4 floats: float4 K loads of 8 lanes hit 32 banks
  static constexpr int kPPitch = kBc + 4;  // P rows; the two half-warps land 16 banks apart
  static constexpr int kSmemBytes = ((kBr + 2 * kBc) * kPitch + kBr * kPPitch) * 4;
  static_assert(kBr == 64 && kD % 16 == 0 && kBc % 16 == 0, "16×16 thread layout");
};

// Reduction over the 16 lanes of a half-warp.
__device__ __forceinline__ float half_warp_max(float x) {
#pragma unroll
  for (int o = 1; o < 16; o *= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float half_warp_sum(float x) {
#pragma unroll
  for (int o = 1; o < 16; o *= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// O += P·V for one key tile: thread (r, c) accumulates its rows 4r.. × dims c, c+16,
// ... from P (shared, row pitch kPPitch) and V (shared, key-major).
template <int kD>
__device__ __forceinline__ void pv_tile(const float* sp, const float* sv, int tr, int tc,
                                        float (&o)[FmaShape<kD>::kRows][FmaShape<kD>::kOut]) {
  using S = FmaShape<kD>;
#pragma unroll 2
  for (int j4 = 0; j4 < S::kBc; j4 += 4) {
    float4 pv[S::kRows];
#pragma unroll
    for (int i = 0; i < S::kRows; ++i)
      pv[i] = *reinterpret_cast<const float4*>(sp + (tr * S::kRows + i) * S::kPPitch + j4);
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const float* const vrow = sv + (j4 + jj) * S::kPitch + tc;
#pragma unroll
      for (int d = 0; d < S::kOut; ++d) {
        const float x = vrow[16 * d];
#pragma unroll
        for (int i = 0; i < S::kRows; ++i) {
          const float pij = jj == 0 ? pv[i].x : jj == 1 ? pv[i].y : jj == 2 ? pv[i].z : pv[i].w;
          o[i][d] = fmaf(pij, x, o[i][d]);
        }
      }
    }
  }
}

template <int kD>
__global__ void __launch_bounds__(256) fused_fma_kernel(const Params p) {
  using S = FmaShape<kD>;
  extern __shared__ __align__(16) unsigned char smem[];
  float* const sq = reinterpret_cast<float*>(smem);
  float* const sk = sq + S::kBr * S::kPitch;
  float* const sv = sk + S::kBc * S::kPitch;
  float* const sp = sv + S::kBc * S::kPitch;

  const int tid = static_cast<int>(threadIdx.x);
  const int tr = tid / 16, tc = tid % 16;
  const FusedBlock<float> block = fused_block<float>(p, S::kBr, S::kBc);
  const BlockCoord c = block.c;
  const int tiles = block.tiles;

  const KeyTileLoader<float, S, kD> load{p, tid};

  float o[S::kRows][S::kOut];
  float m[S::kRows], l[S::kRows];
#pragma unroll
  for (int i = 0; i < S::kRows; ++i) {
    m[i] = neg_inf();
    l[i] = 0.0f;
#pragma unroll
    for (int d = 0; d < S::kOut; ++d) o[i][d] = 0.0f;
  }

  load_first_tiles<S::kBr, S::kBc, kD, S::kPitch, S::kThreads>(sq, sk, sv, block, p, tid);
  const int row0 = c.q0 + tr * S::kRows;  // sequence index of this thread's first row

  for (int j = 0; j < tiles; ++j) {
    cp_async_wait<1>();  // Q and K_j
    __syncthreads();

    float s[S::kRows][S::kCols];
#pragma unroll
    for (int i = 0; i < S::kRows; ++i)
#pragma unroll
      for (int jj = 0; jj < S::kCols; ++jj) s[i][jj] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < kD; d += 4) {
      float4 qv[S::kRows], kv[S::kCols];
#pragma unroll
      for (int i = 0; i < S::kRows; ++i)
        qv[i] = *reinterpret_cast<const float4*>(sq + (tr * S::kRows + i) * S::kPitch + d);
#pragma unroll
      for (int jj = 0; jj < S::kCols; ++jj)
        kv[jj] = *reinterpret_cast<const float4*>(sk + (tc + 16 * jj) * S::kPitch + d);
#pragma unroll
      for (int i = 0; i < S::kRows; ++i)
#pragma unroll
        for (int jj = 0; jj < S::kCols; ++jj) {
          s[i][jj] = fmaf(qv[i].x, kv[jj].x, s[i][jj]);
          s[i][jj] = fmaf(qv[i].y, kv[jj].y, s[i][jj]);
          s[i][jj] = fmaf(qv[i].z, kv[jj].z, s[i][jj]);
          s[i][jj] = fmaf(qv[i].w, kv[jj].w, s[i][jj]);
        }
    }
    __syncthreads();  // every thread is done with K_j
    if (j + 1 < tiles) load(sk, block.k, p.k_stride.seq, j + 1);
    cp_async_commit();

    // Scale to log2 units, mask, online softmax; P to shared memory.
    const int k0 = j * S::kBc;
    const bool mask =
        k0 + S::kBc > p.kv_len || (p.has_band_hi && k0 + S::kBc - 1 > c.q0 + p.band_hi);
#pragma unroll
    for (int i = 0; i < S::kRows; ++i) {
      float mx = m[i];
#pragma unroll
      for (int jj = 0; jj < S::kCols; ++jj) {
        float x = s[i][jj] * p.scale_log2;
        const int col = k0 + tc + 16 * jj;
        if (mask && (col >= p.kv_len || (p.has_band_hi && col > row0 + i + p.band_hi)))
          x = neg_inf();
        s[i][jj] = x;
        mx = fmaxf(mx, x);
      }
      mx = half_warp_max(mx);
      const float m_ref = mx == neg_inf() ? 0.0f : mx;
      const float alpha = exp2f(m[i] - m_ref);
      m[i] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int jj = 0; jj < S::kCols; ++jj) {
        const float x = exp2f(s[i][jj] - m_ref);
        sp[(tr * S::kRows + i) * S::kPPitch + tc + 16 * jj] = x;
        sum += x;
      }
      l[i] = fmaf(l[i], alpha, sum);
#pragma unroll
      for (int d = 0; d < S::kOut; ++d) o[i][d] *= alpha;
    }

    cp_async_wait<1>();  // all but K_{j+1}: V_j has landed
    __syncthreads();     // ... and P is visible to all threads
    // A tile crossing the causal diagonal whose V holds a NaN or an infinity: each row
    // sums only the keys it sees (0·NaN would reach rows that do not see that key).
    if (mask && p.has_band_hi &&
        tile_has_nonfinite<float, S::kBc, kD, S::kPitch, S::kThreads>(
            sv, min(S::kBc, p.kv_len - k0), tid)) {
      for (int key = 0; key < S::kBc; ++key) {
        const float* const vrow = sv + key * S::kPitch + tc;
#pragma unroll
        for (int i = 0; i < S::kRows; ++i) {
          const int col = k0 + key;
          if (col >= p.kv_len || col > row0 + i + p.band_hi) continue;
          const float pij = sp[(tr * S::kRows + i) * S::kPPitch + key];
#pragma unroll
          for (int d = 0; d < S::kOut; ++d) o[i][d] = fmaf(pij, vrow[16 * d], o[i][d]);
        }
      }
    } else {
      pv_tile<kD>(sp, sv, tr, tc, o);
    }
    __syncthreads();  // every thread is done with V_j and P
    if (j + 1 < tiles) load(sv, block.v, p.v_stride.seq, j + 1);
    cp_async_commit();
  }

  float* const out = head_ptr<float>(p.out, p.out_stride, c.b, c.h);
  float* const lse = lse_head(p, c.b, c.h);
#pragma unroll
  for (int i = 0; i < S::kRows; ++i) {
    const float total = half_warp_sum(l[i]);
    const int row = row0 + i;
    if (row >= p.q_len) continue;
    const float inv = reciprocal_or_zero(total);
    float* const dst = out + row * p.out_stride.seq;
#pragma unroll
    for (int d = 0; d < S::kOut; ++d) {
      const int col = tc + 16 * d;
      if (col < p.head_dim) dst[col] = o[i][d] * inv;
    }
    if (lse && tc == 0) lse[row * p.lse_stride.seq] = logsumexp(m[i], total);
  }
}

template <int D>
void launch_fused_fma(const Params& p, const FusedLaunch&, cudaStream_t stream) {
  launch_per_query_tile<FmaShape<D>>(fused_fma_kernel<D>, "fused_fma_kernel", p, stream);
}

}  // namespace fattn::cuda
