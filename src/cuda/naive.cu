// fattn — the naive CUDA baseline: three kernels, the score matrix in global memory.
//
//   1 naive_scores_kernel   S = Q·Kᵀ·scale·log2(e) → B·Hq·Sq·Sk float32 buffer
//   2 naive_softmax_kernel  P = softmax(S) in place, row by row; logsumexp
//   3 naive_pv_kernel       O = P·V
// The two products are shared-memory tiled GEMMs (64×64 output tiles, 16-deep steps,
// 256 threads with 4×4 outputs each), computing in float32 whatever the dtype. The
// scores are stored in log2 units, as the fused kernels keep them.
//
// Masking is done where the scores are read: kernel 1 skips output tiles that no
// query of the tile can see (causal) and writes the rest unmasked; kernels 2 and 3
// read, for query i, only keys j < kv_end(i + 1). Nothing reads an unwritten score,
// and a NaN in a hidden key's value never reaches a row (kernel 3 skips hidden keys
// on the diagonal blocks instead of multiplying them by 0).
#include "cuda/backend.hpp"
#include "cuda/common.cuh"
#include "cuda/launchers.hpp"

namespace fattn::cuda {
namespace {

// 64×64 output tiles: 256 threads × 4×4 outputs, enough reuse (8 shared loads per
// 16 FMAs) for a baseline without register blocking tricks. Steps of 16 keep the two
// operand tiles at 2 × 16 × 68 floats = 8.7 KB. Not tuned: this is the baseline.
constexpr int kTile = 64;
constexpr int kStep = 16;
constexpr int kPad = 4;  // shared rows of 68 floats: column reads land in distinct banks
constexpr int kThreads = 256;
constexpr int kSoftmaxWarps = 8;  // one warp per row, 8 rows per block

// Block x of a flattened (bh, tile_a, tile_b) grid.
struct Tile3 {
  int bh, a, b;
};
__device__ __forceinline__ Tile3 tile3(int tiles_a, int tiles_b) {
  const unsigned x = blockIdx.x;
  Tile3 t;
  t.b = static_cast<int>(x % static_cast<unsigned>(tiles_b));
  const unsigned rest = x / static_cast<unsigned>(tiles_b);
  t.a = static_cast<int>(rest % static_cast<unsigned>(tiles_a));
  t.bh = static_cast<int>(rest / static_cast<unsigned>(tiles_a));
  return t;
}

// One kStep slice of a 64×64 tile product: acc[i][j] += Σ_s a[s][ty+16i] · b[s][tx+16j]
// (both GEMM kernels: scores = Q·Kᵀ and O = P·V).
__device__ __forceinline__ void accumulate_step(const float (&a_tile)[kStep][kTile + kPad],
                                                const float (&b_tile)[kStep][kTile + kPad],
                                                float (&acc)[4][4]) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
  for (int s = 0; s < kStep; ++s) {
    float a[4], b[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = a_tile[s][ty + 16 * i];
#pragma unroll
    for (int j = 0; j < 4; ++j) b[j] = b_tile[s][tx + 16 * j];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
  }
}

// The thread's 4×4 outputs of the 64×64 tile whose first row is i0 and first column c0,
// those inside rows × cols, each handed to store(row, col, value): the epilogue of both
// GEMM kernels (thread (ty, tx) holds rows ty + 16i and columns tx + 16j, as in
// accumulate_step).
template <class Store>
__device__ __forceinline__ void store_tile(const float (&acc)[4][4], int ty, int tx, int i0,
                                           int c0, int rows, int cols, Store store) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = i0 + ty + 16 * i;
    if (row >= rows) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int col = c0 + tx + 16 * j;
      if (col < cols) store(row, col, acc[i][j]);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) naive_scores_kernel(const Params p, float* scores) {
  __shared__ float sq[kStep][kTile + kPad];  // [dim][query]
  __shared__ float sk[kStep][kTile + kPad];  // [dim][key]
  const int tiles_q = (p.q_len + kTile - 1) / kTile, tiles_k = (p.kv_len + kTile - 1) / kTile;
  const Tile3 t = tile3(tiles_q, tiles_k);
  const int i0 = t.a * kTile, j0 = t.b * kTile;
  if (j0 >= visibility(p).kv_end(min(i0 + kTile, p.q_len))) return;  // no query of the tile sees these keys

  const int b = t.bh / p.q_heads, h = t.bh % p.q_heads;
  const T* const q = head_ptr<T>(p.q, p.q_stride, b, h);
  const T* const k = head_ptr<T>(p.k, p.k_stride, b, h / p.group);
  const int tid = static_cast<int>(threadIdx.x), ty = tid / 16, tx = tid % 16;

  float acc[4][4] = {};
  for (int d0 = 0; d0 < p.head_dim; d0 += kStep) {
#pragma unroll
    for (int e = 0; e < kTile * kStep / kThreads; ++e) {
      const int idx = tid + e * kThreads, r = idx / kStep, d = idx % kStep;
      const bool dim_ok = d0 + d < p.head_dim;
      sq[d][r] = dim_ok && i0 + r < p.q_len ? to_float(q[(i0 + r) * p.q_stride.seq + d0 + d]) : 0.0f;
      sk[d][r] = dim_ok && j0 + r < p.kv_len ? to_float(k[(j0 + r) * p.k_stride.seq + d0 + d]) : 0.0f;
    }
    __syncthreads();
    accumulate_step(sq, sk, acc);
    __syncthreads();
  }
  float* const rows = scores + static_cast<std::int64_t>(t.bh) * p.q_len * p.kv_len;
  store_tile(acc, ty, tx, i0, j0, p.q_len, p.kv_len, [&](int row, int col, float s) {
    rows[static_cast<std::int64_t>(row) * p.kv_len + col] = s * p.scale_log2;
  });
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// One warp per query row: max pass, sum pass, normalise pass (three reads of the row,
// as a row softmax over global memory does). A row that sees no key writes nothing
// (kernel 3 reads none of it) and gets lse = -inf.
__global__ void __launch_bounds__(32 * kSoftmaxWarps) naive_softmax_kernel(const Params p,
                                                                           float* scores) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t row_id =
      static_cast<std::int64_t>(blockIdx.x) * kSoftmaxWarps + threadIdx.x / 32;
  if (row_id >= static_cast<std::int64_t>(p.batch) * p.q_heads * p.q_len) return;
  const int i = static_cast<int>(row_id % p.q_len);
  const int bh = static_cast<int>(row_id / p.q_len);
  const int visible = visibility(p).kv_end(i + 1);
  float* const row = scores + row_id * p.kv_len;

  float m = neg_inf();
  for (int j = lane; j < visible; j += 32) m = fmaxf(m, row[j]);
  m = warp_max(m);
  const float m_ref = m == neg_inf() ? 0.0f : m;
  float l = 0.0f;
  for (int j = lane; j < visible; j += 32) l += exp2f(row[j] - m_ref);
  l = warp_sum(l);
  const float inv = reciprocal_or_zero(l);
  for (int j = lane; j < visible; j += 32) row[j] = exp2f(row[j] - m_ref) * inv;
  if (p.lse && lane == 0)
    lse_head(p, bh / p.q_heads, bh % p.q_heads)[i * p.lse_stride.seq] = logsumexp(m, l);
}

template <class T>
__global__ void __launch_bounds__(kThreads) naive_pv_kernel(const Params p, const float* probs) {
  __shared__ float sp[kStep][kTile + kPad];  // [key][query]
  __shared__ float sv[kStep][kTile + kPad];  // [key][dim]
  const int tiles_q = (p.q_len + kTile - 1) / kTile, tiles_d = (p.head_dim + kTile - 1) / kTile;
  const Tile3 t = tile3(tiles_q, tiles_d);
  const int i0 = t.a * kTile, d0 = t.b * kTile;
  const int b = t.bh / p.q_heads, h = t.bh % p.q_heads;
  const T* const v = head_ptr<T>(p.v, p.v_stride, b, h / p.group);
  const float* const rows = probs + static_cast<std::int64_t>(t.bh) * p.q_len * p.kv_len;
  const int tid = static_cast<int>(threadIdx.x), ty = tid / 16, tx = tid % 16;
  const Visibility visible = visibility(p);
  const int end = visible.kv_end(min(i0 + kTile, p.q_len));

  float acc[4][4] = {};
  for (int j0 = 0; j0 < end; j0 += kStep) {
#pragma unroll
    for (int e = 0; e < kTile * kStep / kThreads; ++e) {
      const int idx = tid + e * kThreads;
      {  // P: query r, key jj; keys the query does not see are 0
        const int r = idx / kStep, jj = idx % kStep, row = i0 + r, col = j0 + jj;
        sp[jj][r] = row < p.q_len && col < visible.kv_end(row + 1)
                        ? rows[static_cast<std::int64_t>(row) * p.kv_len + col]
                        : 0.0f;
      }
      {  // V: key jj, dim dd
        const int jj = idx / kTile, dd = idx % kTile, key = j0 + jj, dim = d0 + dd;
        sv[jj][dd] = key < p.kv_len && dim < p.head_dim ? to_float(v[key * p.v_stride.seq + dim])
                                                        : 0.0f;
      }
    }
    __syncthreads();
    if (p.has_band_hi && j0 + kStep - 1 > i0 + p.band_hi) {
      // Keys some rows of the tile do not see: skip them rather than add 0·v, so a
      // NaN or an infinity in such a key's value stays out of those rows.
      for (int jj = 0; jj < kStep; ++jj)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = i0 + ty + 16 * i;
          if (j0 + jj >= visible.kv_end(row + 1)) continue;
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(sp[jj][ty + 16 * i], sv[jj][tx + 16 * j], acc[i][j]);
        }
    } else {
      accumulate_step(sp, sv, acc);
    }
    __syncthreads();
  }
  T* const out = head_ptr<T>(p.out, p.out_stride, b, h);
  store_tile(acc, ty, tx, i0, d0, p.q_len, p.head_dim, [&](int row, int dim, float o) {
    out[row * p.out_stride.seq + dim] = from_float<T>(o);
  });
}

unsigned blocks_of(long long n) { return static_cast<unsigned>(n); }  // dispatcher checks < 2^31

}  // namespace

template <class T>
void launch_naive(const Params& p, float* scores, cudaStream_t stream) {
  const long long bh = static_cast<long long>(p.batch) * p.q_heads;
  const long long tiles_q = (p.q_len + kTile - 1) / kTile;
  const long long tiles_k = (p.kv_len + kTile - 1) / kTile;
  const long long tiles_d = (p.head_dim + kTile - 1) / kTile;
  naive_scores_kernel<T><<<blocks_of(bh * tiles_q * tiles_k), kThreads, 0, stream>>>(p, scores);
  check_launch("naive_scores_kernel");
  const long long rows = bh * p.q_len;
  naive_softmax_kernel<<<blocks_of((rows + kSoftmaxWarps - 1) / kSoftmaxWarps),
                         32 * kSoftmaxWarps, 0, stream>>>(p, scores);
  check_launch("naive_softmax_kernel");
  naive_pv_kernel<T><<<blocks_of(bh * tiles_q * tiles_d), kThreads, 0, stream>>>(p, scores);
  check_launch("naive_pv_kernel");
}

int naive_launch_count() { return 3; }

// Grid sizes of the naive launches, for the dispatcher's 2^31 check.
long long naive_max_blocks(const Params& p) {
  const long long bh = static_cast<long long>(p.batch) * p.q_heads;
  const long long tiles_q = (p.q_len + kTile - 1) / kTile;
  const long long tiles_k = (p.kv_len + kTile - 1) / kTile;
  const long long rows = (bh * p.q_len + kSoftmaxWarps - 1) / kSoftmaxWarps;
  const long long scores = bh * tiles_q * tiles_k;
  return scores > rows ? scores : rows;
}

template void launch_naive<float>(const Params&, float*, cudaStream_t);
template void launch_naive<__half>(const Params&, float*, cudaStream_t);
template void launch_naive<__nv_bfloat16>(const Params&, float*, cudaStream_t);

}  // namespace fattn::cuda
