// fattn — decode on CUDA: a few query rows per sequence against a KV cache (decode.hpp).
//
// Three kernels, launched back to back on one stream, none waiting for the host:
//   check_cache    (only with an append) one block per sequence: its length and the pages it
//                  will use are valid, else a device-side assertion naming the argument. The
//                  stream stops there, so an append never runs on bad indices: the cache
//                  stays as it was.
//   split_decode   one block per (key split, kv head × row tile, sequence):
//                    the new keys of this split's share appended to the cache (row tile 0);
//                    each warp takes the split's key tiles in turn through its own ring of
//                    cp.async stages (row addresses per key: page lookup, or the new keys,
//                    read from k_new/v_new and not from the cache being written);
//                    S = Q·Kᵀ and O += P·V on mma.sync (mma_warp.cuh's warp products,
//                    16 rows: GQA packs the query heads of the kv head into them), the
//                    variants and the band per key (visibility.cuh, over the sequence's
//                    SequenceBand), the online softmax (warp_softmax.cuh);
//                  the warps' rows merged in shared memory; one split: the sink folded in
//                  and out, lse written; more: float32 partial rows.
//   combine_splits one warp per (sequence, query head, query): the splits' rows weighted by
//                  their logsumexps and the sink.
// Keys hidden from every row of a tile are never read (zero-filled). A tile with a key that
// some rows see and others do not (Sq > 1 at the band's edges) has its V checked for NaN
// or infinity, and where there is one the warp sums each row's visible keys only (0·NaN
// would poison the rows that do not see it).
#pragma once

#include "cuda/common.cuh"
#include "cuda/decode.hpp"
#include "cuda/decode_params.hpp"
#include "cuda/decode_tiles.hpp"
#include "cuda/mma_warp.cuh"
#include "cuda/score_mods.cuh"
#include "cuda/visibility.cuh"
#include "cuda/warp_softmax.cuh"

// The device-side assertion's entry (CUDA's; glibc's <assert.h> declares it only without
// NDEBUG, and these checks stay in release builds, as torch's CUDA_KERNEL_ASSERT).
extern "C" __host__ __device__ void __assert_fail(const char* assertion, const char* file,
                                                  unsigned int line, const char* function) noexcept
    __attribute__((__noreturn__));

namespace fattn::cuda::decode {

// The kernels stop with this when an index from a device tensor is wrong; the message is
// the assertion text CUDA prints, and the host sees cudaErrorAssert at its next
// synchronisation (as torch's own device-side checks).
__device__ __forceinline__ void require(bool ok, const char* message) {
  if (!ok) __assert_fail(message, __FILE__, __LINE__, "fattn decode");
}

__device__ __forceinline__ void cp_async_wait_at_most(int groups) {
  switch (groups) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    default: cp_async_wait<3>(); break;
  }
}

// Keys of sequence b before the append (checked).
__device__ __forceinline__ int old_length(const DecodeParams& p, int b) {
  if (!p.seqlens) return p.capacity;
  const int old = p.seqlens[b];
  require(old >= 0 && static_cast<long long>(old) + p.new_len <= p.capacity,
          "fattn: every cache_seqlens entry must be >= 0 and, with the new keys (k_new.size(2)), "
          "fit the cache's capacity (k_cache.size(2), or block_table.size(1) x block_size)");
  return old;
}

// Element offset of key j of sequence b, kv head h, in a cache with strides `stride`.
__device__ __forceinline__ std::int64_t cache_offset(const DecodeParams& p,
                                                     const std::int64_t (&stride)[3], int b,
                                                     int h, int j) {
  if (!p.block_table)
    return b * stride[0] + h * stride[1] + static_cast<std::int64_t>(j) * stride[2];
  const int page = p.block_table[b * p.table_stride + j / p.block_size];
  require(page >= 0 && page < p.num_blocks,
          "fattn: every block_table entry a sequence uses must be a page of k_cache "
          "(0 <= entry < k_cache.size(0); flash_attn_with_kvcache's cache_batch_idx entries "
          "are checked as these)");
  return page * stride[0] + h * stride[1] + static_cast<std::int64_t>(j % p.block_size) * stride[2];
}

// Whether sequence c's append writes slot `slot` of page `page` (c's length checked).
__device__ __forceinline__ bool appends_to(const DecodeParams& p, int c, int page, int slot) {
  const int old = p.seqlens[c];
  if (old < 0 || static_cast<long long>(old) + p.new_len > p.capacity) return false;  // c's own block stops
  for (int n = old / p.block_size; n * p.block_size < old + p.new_len; ++n) {
    const int j = n * p.block_size + slot;
    if (j >= old && j < old + p.new_len && p.block_table[c * p.table_stride + n] == page) return true;
  }
  return false;
}

// Sequence b's length, every page it uses, and with a paged append that no other sequence
// appends to a slot b appends to (the CPU's check_append_slots).
__global__ void check_cache(const DecodeParams p) {
  const int b = static_cast<int>(blockIdx.x);
  const int old = old_length(p, b);
  const int length = old + p.new_len;
  if (!p.block_table) return;
  for (int n = static_cast<int>(threadIdx.x); n * p.block_size < length;
       n += static_cast<int>(blockDim.x))
    cache_offset(p, p.k_stride, b, 0, n * p.block_size);
  for (int c = static_cast<int>(threadIdx.x); c < p.batch; c += static_cast<int>(blockDim.x)) {
    if (c == b) continue;
    for (int t = 0; t < p.new_len; ++t) {
      const int j = old + t;
      const int page = p.block_table[b * p.table_stride + j / p.block_size];
      require(!appends_to(p, c, page, j % p.block_size),
              "fattn: two sequences append to one slot of a page (block_table): each new key "
              "of k_new needs a slot of its own");
    }
  }
}

// One block's 16 rows: row r is query i = (16·tile + r) / group of query head
// kv_head·group + (16·tile + r) % group.
struct RowTile {
  int b, kv_head;
  int first;  // 16·tile
  int rows;   // Sq·group: the rows of this kv head
  int group;

  __device__ __forceinline__ int query(int r) const { return (first + r) / group; }
  __device__ __forceinline__ int head(int r) const { return kv_head * group + (first + r) % group; }
  __device__ __forceinline__ bool valid(int r) const { return first + r < rows; }
};

// This thread's two rows (g and g + 8 of the warp's C fragments): query index and ALiBi
// slope in log2 units.
struct ThreadRows {
  int query[2];
  float slope2[2];
};

// The variants and the band on a warp's scores (score_mods.cuh's order and units): scale,
// softcap, ALiBi, then −inf for hidden pairs when `mask` (the tile holds one).
template <int kN>
__device__ __forceinline__ void modify_scores(float (&s)[kN][4], const DecodeParams& p,
                                              const ThreadRows& rows,
                                              const VisibilityOf<SequenceBand>& band, bool mask,
                                              int k0, int lane) {
  const float inv_softcap = p.softcap != 0.0f ? 1.0f / p.softcap : 0.0f;
  const int alibi_offset = band.p.kv_len - p.q_len;
#pragma unroll
  for (int n = 0; n < kN; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int half = e >> 1;
      const int key = k0 + n * 8 + 2 * (lane % 4) + (e & 1);
      float x = s[n][e];
      if (p.softcap != 0.0f)
        x = softcapped(x * p.scale, p.softcap, inv_softcap) * kLog2e;
      else
        x *= p.scale_log2;
      if (p.alibi) x -= rows.slope2[half] * static_cast<float>(abs(rows.query[half] + alibi_offset - key));
      if (mask && band.hidden(rows.query[half], key)) x = neg_inf();
      s[n][e] = x;
    }
}

// O += P·V over each row's visible keys only (the rare path, see the top): the quad's
// probabilities by shuffles, V from the shared tile.
template <class T, int kN, int kDB>
__device__ __forceinline__ void pv_visible_keys(const float (&s)[kN][4], float (&o)[kDB][4],
                                                const T* v_tile, int pitch,
                                                const ThreadRows& rows,
                                                const VisibilityOf<SequenceBand>& band, int k0,
                                                int lane) {
  const int t = lane % 4, quad = lane & ~3;
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int n = 0; n < kN; ++n)
#pragma unroll 1
      for (int src = 0; src < 4; ++src) {
        const float p0 = __shfl_sync(0xffffffffu, s[n][2 * half], quad + src);
        const float p1 = __shfl_sync(0xffffffffu, s[n][2 * half + 1], quad + src);
        for (int e = 0; e < 2; ++e) {
          const int key = n * 8 + 2 * src + e;
          if (band.hidden(rows.query[half], k0 + key)) continue;
          const float pe = e ? p1 : p0;
          const T* const vrow = v_tile + key * pitch + 2 * t;
#pragma unroll
          for (int d = 0; d < kDB; ++d) {
            o[d][2 * half] = fmaf(pe, to_float(vrow[d * 8]), o[d][2 * half]);
            o[d][2 * half + 1] = fmaf(pe, to_float(vrow[d * 8 + 1]), o[d][2 * half + 1]);
          }
        }
      }
}

// Warp-wide: whether the first `rows` rows of a key-major tile hold a NaN or an infinity.
template <class T, int kD>
__device__ __forceinline__ bool warp_tile_nonfinite(const T* tile, int rows, int pitch, int lane) {
  constexpr int kChunksPerRow = kD * static_cast<int>(sizeof(T)) / 16;
  bool bad = false;
  for (int c = lane; c < rows * kChunksPerRow; c += 32)
    bad |= chunk_nonfinite<T>(
        *reinterpret_cast<const uint4*>(tile + (c / kChunksPerRow) * pitch + (c % kChunksPerRow) * 8));
  return __any_sync(0xffffffffu, bad);
}

// log(exp(lse) + exp(sink)) in natural units: a row's logsumexp with the sink's term in
// its denominator; −inf when both are (NaN stays NaN).
__device__ __forceinline__ float with_sink(float lse, float sink) {
  if (isnan(lse) || isnan(sink)) return lse + sink;
  const float top = fmaxf(lse, sink);
  if (top == neg_inf()) return neg_inf();
  return top + logf(expf(lse - top) + expf(sink - top));
}

// Appends this block's share of the new keys (kv head h of sequence b): new key t goes to
// cache position old + t, written by split t % splits.
template <class T, int kD>
__device__ __forceinline__ void append_new_keys(const DecodeParams& p, int b, int h, int old,
                                                int split, int tid) {
  constexpr int kChunks = kD * static_cast<int>(sizeof(T)) / 16;
  const int chunks = (p.head_dim * static_cast<int>(sizeof(T)) + 15) / 16;
  const int mine = (p.new_len - split + p.splits - 1) / p.splits;  // t = split + n·splits
  for (int c = tid; c < mine * kChunks; c += DecodeTiles::kThreads) {
    const int t = split + (c / kChunks) * p.splits, col = (c % kChunks) * 8;
    if (col / 8 >= chunks) continue;
    const T* kn = static_cast<const T*>(p.k_new) + b * p.kn_stride[0] + h * p.kn_stride[1] +
                  static_cast<std::int64_t>(t) * p.kn_stride[2] + col;
    const T* vn = static_cast<const T*>(p.v_new) + b * p.vn_stride[0] + h * p.vn_stride[1] +
                  static_cast<std::int64_t>(t) * p.vn_stride[2] + col;
    T* kc = static_cast<T*>(p.k_cache) + cache_offset(p, p.k_stride, b, h, old + t) + col;
    T* vc = static_cast<T*>(p.v_cache) + cache_offset(p, p.v_stride, b, h, old + t) + col;
    *reinterpret_cast<uint4*>(kc) = *reinterpret_cast<const uint4*>(kn);
    *reinterpret_cast<uint4*>(vc) = *reinterpret_cast<const uint4*>(vn);
  }
}

// The block's query rows into shared memory (row pitch kPitch), zero-filled past the rows
// and the head dim, by cp.async (the caller commits the group).
template <class T, int kD, int kPitch>
__device__ __forceinline__ void load_query_rows(T* sq, const DecodeParams& p, const RowTile& tile,
                                                int tid) {
  constexpr int kChunksPerRow = kD / 8;
  for (int c = tid; c < DecodeTiles::kRows * kChunksPerRow; c += DecodeTiles::kThreads) {
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    const bool ok = tile.valid(r) && col < p.head_dim;
    const T* src = static_cast<const T*>(p.q);
    if (ok)
      src += tile.b * p.q_stride[0] + tile.head(r) * p.q_stride[1] +
             static_cast<std::int64_t>(tile.query(r)) * p.q_stride[2] + col;
    cp_async_16(sq + r * kPitch + col, src, ok);
  }
}

// The warps' rows merged in shared memory (over the block's rings, once every warp is done
// with them): each warp's running max and sum and its 16 × kD partial output, then per row
// each warp's weight 2^(m_w − M) / L and the row's logsumexp.
template <int kD>
struct WarpMerge {
  static constexpr int kRows = DecodeTiles::kRows, kWarps = DecodeTiles::kWarps;
  float* m_w;      // [kWarps][kRows]
  float* l_w;      // [kWarps][kRows]
  float* o_w;      // [kWarps][kRows][kD]
  float* weight;   // [kWarps][kRows]
  float* row_lse;  // [kRows], natural units

  __device__ __forceinline__ explicit WarpMerge(float* area)
      : m_w(area), l_w(area + kWarps * kRows), o_w(l_w + kWarps * kRows),
        weight(o_w + kWarps * kRows * kD), row_lse(weight + kWarps * kRows) {}

  // This warp's state (the C fragments of warp_softmax.cuh: rows g and g + 8).
  __device__ __forceinline__ void store(WarpRows& stats, const float (&o)[kD / 8][4], int warp,
                                        int lane) const {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = lane / 4 + 8 * half;
      const float l = quad_sum(stats.l[half]);
      if (lane % 4 == 0) {
        m_w[warp * kRows + r] = stats.m[half];
        l_w[warp * kRows + r] = l;
      }
#pragma unroll
      for (int d = 0; d < kD / 8; ++d) {
        float* dst = o_w + (warp * kRows + r) * kD + d * 8 + 2 * (lane % 4);
        dst[0] = o[d][2 * half];
        dst[1] = o[d][2 * half + 1];
      }
    }
  }

  // Row r's weights and logsumexp (−inf for a row that saw nothing).
  __device__ __forceinline__ void weigh(int r) const {
    float m = neg_inf();
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, m_w[w * kRows + r]);
    const float m_ref = m == neg_inf() ? 0.0f : m;
    float l = 0.0f;
    for (int w = 0; w < kWarps; ++w) l = fmaf(l_w[w * kRows + r], exp2f(m_w[w * kRows + r] - m_ref), l);
    const float inv = reciprocal_or_zero(l);
    for (int w = 0; w < kWarps; ++w) weight[w * kRows + r] = exp2f(m_w[w * kRows + r] - m_ref) * inv;
    row_lse[r] = logsumexp(m, l);
  }

  // Column col of row r: the warps' outputs, weighted.
  __device__ __forceinline__ float value(int r, int col) const {
    float x = 0.0f;
    for (int w = 0; w < kWarps; ++w) x = fmaf(o_w[(w * kRows + r) * kD + col], weight[w * kRows + r], x);
    return x;
  }
};

// The block's rows out: with one split, out and lse with the sink folded in; with more, the
// split's float32 partial rows (o normalised, lse) for combine_splits.
template <class T, int kD>
__device__ __forceinline__ void write_rows(const DecodeParams& p, const RowTile& tile,
                                           const WarpMerge<kD>& merge, int split, int tid) {
  const int b = tile.b;
  for (int c = tid; c < DecodeTiles::kRows * kD; c += DecodeTiles::kThreads) {
    const int r = c / kD, col = c % kD;
    if (!tile.valid(r) || col >= p.head_dim) continue;
    float x = merge.value(r, col);
    const int i = tile.query(r), h = tile.head(r);
    if (p.splits > 1) {
      const std::int64_t row = ((static_cast<std::int64_t>(split) * p.batch + b) * p.q_heads + h) * p.q_len + i;
      p.o_part[row * p.head_dim + col] = x;
      if (col == 0) p.lse_part[row] = merge.row_lse[r];
      continue;
    }
    float lse = merge.row_lse[r];
    if (p.sinks) {  // the sink's term joins the denominator: rescale by exp(lse − lse')
      const float joined = with_sink(lse, p.sinks[h]);
      x = isnan(joined) ? joined : lse == neg_inf() ? 0.0f : x * expf(lse - joined);
      lse = joined;  // a NaN sink makes the row NaN, out and lse (as fold_sink)
    }
    static_cast<T*>(p.out)[b * p.out_stride[0] + h * p.out_stride[1] +
                           static_cast<std::int64_t>(i) * p.out_stride[2] + col] = from_float<T>(x);
    if (col == 0 && p.lse)
      p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + static_cast<std::int64_t>(i) * p.lse_stride[2]] = lse;
  }
}

// DecodeTiles::at as compile-time constants of the kernel.
template <int kD>
struct DecodeShape {
  static constexpr int kBc = DecodeTiles::at(kD).keys;
  static constexpr int kPitch = DecodeTiles::at(kD).pitch;
};

template <class T, int kD>
__global__ void __launch_bounds__(DecodeTiles::kThreads, 1)
    split_decode(const DecodeParams p, int stages) {
  constexpr int kBc = DecodeShape<kD>::kBc, kPitch = DecodeShape<kD>::kPitch;
  constexpr int kRows = DecodeTiles::kRows;
  constexpr int kWarps = DecodeTiles::kWarps;
  constexpr int kN = kBc / 8, kDB = kD / 8, kChunksPerRow = kD / 8;
  static_assert(kBc <= 32 && kBc % 16 == 0, "one key per lane, whole 16-key MMA steps");

  extern __shared__ __align__(16) unsigned char smem[];
  T* const sq = reinterpret_cast<T*>(smem);
  T* const rings = sq + kRows * kPitch;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  T* const ring = rings + static_cast<std::int64_t>(warp) * stages * 2 * kBc * kPitch;
  const T** const k_rows =
      reinterpret_cast<const T**>(rings + static_cast<std::int64_t>(kWarps) * stages * 2 * kBc * kPitch) +
      warp * 2 * kBc;
  const T** const v_rows = k_rows + kBc;

  const int split = static_cast<int>(blockIdx.x);
  const int row_tiles = (p.q_len * p.group + kRows - 1) / kRows;
  const RowTile tile{static_cast<int>(blockIdx.z), static_cast<int>(blockIdx.y) / row_tiles,
                     (static_cast<int>(blockIdx.y) % row_tiles) * kRows, p.q_len * p.group,
                     p.group};
  const int b = tile.b, hk = tile.kv_head;
  const int old = old_length(p, b);
  const SequenceBand sequence =
      SequenceBand::bottom_right(p.q_len, old + p.new_len, p.causal, p.window_left, p.window_right);
  const VisibilityOf<SequenceBand> band{sequence};
  const int i_first = tile.query(0);
  const int i_last = tile.query(min(kRows, tile.rows - tile.first) - 1);
  const int seen_begin = band.kv_begin(i_first), seen_end = band.kv_end(i_last + 1);
  const SplitRange range =
      SplitRange::of(seen_begin / kBc * kBc, seen_end, split, p.splits, kBc);
  const int tiles = (range.end - range.begin + kBc - 1) / kBc;
  const int my_tiles = tiles > warp ? (tiles - warp + kWarps - 1) / kWarps : 0;

  if (p.new_len > 0 && tile.first == 0) append_new_keys<T, kD>(p, b, hk, old, split, tid);

  load_query_rows<T, kD, kPitch>(sq, p, tile, tid);
  cp_async_commit();

  // Issues warp tile n (keys range.begin + (warp + n·kWarps)·kBc ...) into its stage: each
  // lane finds its key's rows (the cache, a page, or k_new/v_new), then the warp copies.
  auto issue = [&](int n) {
    const int k0 = range.begin + (warp + n * kWarps) * kBc;
    const T* kr = nullptr;
    const T* vr = nullptr;
    const int j = k0 + lane;
    if (lane < kBc && j < range.end && j >= seen_begin) {
      if (j >= old) {
        const std::int64_t t = j - old;
        kr = static_cast<const T*>(p.k_new) + b * p.kn_stride[0] + hk * p.kn_stride[1] + t * p.kn_stride[2];
        vr = static_cast<const T*>(p.v_new) + b * p.vn_stride[0] + hk * p.vn_stride[1] + t * p.vn_stride[2];
      } else {
        kr = static_cast<const T*>(p.k_cache) + cache_offset(p, p.k_stride, b, hk, j);
        vr = static_cast<const T*>(p.v_cache) + cache_offset(p, p.v_stride, b, hk, j);
      }
    }
    if (lane < kBc) {
      k_rows[lane] = kr;
      v_rows[lane] = vr;
    }
    __syncwarp();
    T* const sk = ring + (n % stages) * 2 * kBc * kPitch;
    T* const sv = sk + kBc * kPitch;
#pragma unroll 4
    for (int c = lane; c < kBc * kChunksPerRow; c += 32) {
      const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
      const T* ks = k_rows[r];
      const T* vs = v_rows[r];
      const bool ok = ks != nullptr && col < p.head_dim;
      cp_async_16(sk + r * kPitch + col, ok ? ks + col : static_cast<const T*>(p.q), ok);
      cp_async_16(sv + r * kPitch + col, ok ? vs + col : static_cast<const T*>(p.q), ok);
    }
    __syncwarp();  // the row addresses are rewritten by the next issue
  };

  for (int n = 0; n < stages - 1; ++n) {
    if (n < my_tiles) issue(n);
    cp_async_commit();  // possibly empty: one group per stage
  }
  cp_async_wait_at_most(stages - 1);  // the query rows (the oldest group) have landed
  __syncthreads();

  ThreadRows rows;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = lane / 4 + 8 * half;
    rows.query[half] = tile.query(r);
    rows.slope2[half] = p.alibi ? p.alibi[b * p.alibi_batch + tile.head(r)] * kLog2e : 0.0f;
  }
  const T* const q_frag = sq + (lane % 16) * kPitch + (lane / 16) * 8;
  const int k_frag = (lane % 8 + (lane / 16) * 8) * kPitch + ((lane / 8) % 2) * 8;
  const int v_frag = (lane % 8 + ((lane / 8) % 2) * 8) * kPitch + (lane / 16) * 8;

  float o[1][kDB][4];  // one 16-row slice (mma_warp.cuh's products take slices)
  WarpRows stats;
  stats.start();
#pragma unroll
  for (int d = 0; d < kDB; ++d) o[0][d][0] = o[0][d][1] = o[0][d][2] = o[0][d][3] = 0.0f;

  for (int n = 0; n < my_tiles; ++n) {
    if (n + stages - 1 < my_tiles) issue(n + stages - 1);
    cp_async_commit();
    cp_async_wait_at_most(stages - 1);  // tile n has landed (this lane's copies)
    __syncwarp();                       // ... and the other lanes'
    const T* const sk = ring + (n % stages) * 2 * kBc * kPitch;
    const T* const sv = sk + kBc * kPitch;
    const int k0 = range.begin + (warp + n * kWarps) * kBc;

    float s[1][kN][4];
    qk_mma<T, 1, kBc, kD, kPitch>(s, q_frag, sk + k_frag);
    // Whether a key of the tile is hidden from some row: past the sequence, or past an edge
    // of the band for the first or last query.
    const bool mask = band.tile_hides_keys(k0, kBc, i_first) || band.below_band(k0, i_last);
    modify_scores(s[0], p, rows, band, mask, k0, lane);
    softmax_update(s[0], o[0], stats);
    // Keys seen by some rows only exist when the tile's rows hold several queries.
    if (mask && i_first != i_last &&
        warp_tile_nonfinite<T, kD>(sv, min(kBc, sequence.kv_len - k0), kPitch, lane))
      pv_visible_keys<T>(s[0], o[0], sv, kPitch, rows, band, k0, lane);
    else
      pv_mma<T, 1, kBc, kD, kPitch>(s, o, sv + v_frag);
    __syncwarp();  // the stage is reloaded by a later issue
  }
  cp_async_wait_at_most(0);
  __syncthreads();  // every warp is done with its ring: the merge reuses it

  const WarpMerge<kD> merge(reinterpret_cast<float*>(rings));
  merge.store(stats, o[0], warp, lane);
  __syncthreads();
  if (tid < kRows) merge.weigh(tid);
  __syncthreads();
  write_rows<T, kD>(p, tile, merge, split, tid);
}

// One warp per (sequence, query head, query) row: out = Σ_s exp(lse_s − lse)·o_s with
// lse = log(Σ_s exp(lse_s) + exp(sink)).
template <class T>
__global__ void combine_splits(const DecodeParams p) {
  const int warps = static_cast<int>(blockDim.x) / 32;
  const long long row = static_cast<long long>(blockIdx.x) * warps + threadIdx.x / 32;
  const long long rows = static_cast<long long>(p.batch) * p.q_heads * p.q_len;
  if (row >= rows) return;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int i = static_cast<int>(row % p.q_len), h = static_cast<int>(row / p.q_len % p.q_heads);
  const int b = static_cast<int>(row / (static_cast<long long>(p.q_len) * p.q_heads));
  const float sink = p.sinks ? p.sinks[h] : neg_inf();
  float top = sink;
  for (int s = lane; s < p.splits; s += 32) top = fmaxf(top, p.lse_part[s * rows + row]);
  for (int offset = 16; offset > 0; offset /= 2)
    top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, offset));
  const float ref = top == neg_inf() ? 0.0f : top;
  float sum = lane == 0 && p.sinks ? expf(sink - ref) : 0.0f;
  for (int s = lane; s < p.splits; s += 32) sum += expf(p.lse_part[s * rows + row] - ref);
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  // fmaxf passed over NaNs; sum did not: a NaN part or sink makes the row NaN.
  const float lse = isnan(sum) ? sum : top == neg_inf() ? neg_inf() : ref + logf(sum);
  T* const out = static_cast<T*>(p.out) + b * p.out_stride[0] + h * p.out_stride[1] +
                 static_cast<std::int64_t>(i) * p.out_stride[2];
  for (int col = lane; col < p.head_dim; col += 32) {
    float x = 0.0f;
    for (int s = 0; s < p.splits; ++s) {
      const float part = p.lse_part[s * rows + row];
      if (part == neg_inf()) continue;  // a split without keys: weight 0 (its row is 0)
      x = fmaf(p.o_part[(s * rows + row) * p.head_dim + col], expf(part - lse), x);
    }
    out[col] = from_float<T>(isnan(lse) ? lse : x);
  }
  if (lane == 0 && p.lse)
    p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + static_cast<std::int64_t>(i) * p.lse_stride[2]] = lse;
}

}  // namespace fattn::cuda::decode
