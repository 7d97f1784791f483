// fattn — what the CUDA decode kernels receive (decode.cuh), and the host's choices for them.
//
// Attention of a few query rows per sequence against a KV cache: contiguous (B, Hkv, S_cache,
// D) or paged (num_blocks, Hkv, block_size, D) with a block table, each sequence with its own
// key count in a device tensor, the new keys appended in the same launch. The host never
// reads the lengths or the block table (a decode step does not wait for the GPU and can be
// captured in a CUDA graph): the kernels check them and stop with a device-side assertion
// naming the argument (decode.cuh, DecodeChecks).
//
// Plain C++: the host tests check the per-sequence band and the split choice
// (tests/test_cuda_decode_plan.cpp).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FATTN_DECODE_FN __host__ __device__ __forceinline__
#else
#define FATTN_DECODE_FN inline
#endif

namespace fattn::cuda {

struct DecodeParams {
  const void* q = nullptr;  // (B, Hq, Sq, D)
  void* k_cache = nullptr;  // (B or pages, Hkv, S_cache or block_size, D)
  void* v_cache = nullptr;
  const void* k_new = nullptr;  // (B, Hkv, S_new, D) or null
  const void* v_new = nullptr;
  void* out = nullptr;          // (B, Hq, Sq, D)
  float* lse = nullptr;         // (B, Hq, Sq) or null
  // Element strides (batch or page, head, sequence); each row of D is contiguous.
  std::int64_t q_stride[3] = {}, k_stride[3] = {}, v_stride[3] = {}, kn_stride[3] = {},
               vn_stride[3] = {}, out_stride[3] = {}, lse_stride[3] = {};

  int batch = 0, q_heads = 0, kv_heads = 0, group = 1;  // group = Hq / Hkv
  int q_len = 0;      // Sq: queries per sequence (1 for a decode step)
  int head_dim = 0;   // the real D; the kernel is compiled for a D at least as large
  int capacity = 0;   // keys a sequence can hold: S_cache, or pages per sequence · block_size
  int new_len = 0;    // S_new: keys appended per sequence (0: none)

  const std::int32_t* seqlens = nullptr;  // (B) keys before the append; null: capacity
  const std::int32_t* block_table = nullptr;  // (B, pages per sequence); null: contiguous
  std::int64_t table_stride = 0;
  int block_size = 0;  // keys per page (paged)
  int num_blocks = 0;  // pages in the cache (paged)

  // The band, aligned bottom-right to each sequence's length L after the append (query i
  // with key i + L − Sq): causal hides keys after it; a window keeps keys within
  // window_left before and window_right after it (−1: unbounded on that side).
  bool causal = false;
  int window_left = -1, window_right = -1;

  float scale = 0.0f;       // softmax scale (natural units)
  float scale_log2 = 0.0f;  // scale · log2(e): the kernels keep scores in log2 units
  float softcap = 0.0f;     // 0: off; else s ← softcap·tanh(s / softcap)
  const float* alibi = nullptr;  // slope of (b, h) at alibi[b·alibi_batch + h]
  std::int64_t alibi_batch = 0;
  const float* sinks = nullptr;  // (Hq) logits in every row's denominator

  // Key splits: each of `splits` blocks per (sequence, kv head, row tile) takes one chunk
  // of the sequence's keys; with more than one, the partial rows go to o_part/lse_part
  // (splits, B, Hq, Sq, D) and (splits, B, Hq, Sq) float32, merged by the combine kernel.
  int splits = 1;
  float* o_part = nullptr;
  float* lse_part = nullptr;
};

// Which keys split `split` of `splits` takes of [begin, end): whole tiles of `tile` keys,
// in order (the last splits may get none).
struct SplitRange {
  int begin, end;
  FATTN_DECODE_FN static SplitRange of(int begin, int end, int split, int splits, int tile) {
    const int keys = end > begin ? end - begin : 0;
    const int per_split = (keys + splits - 1) / splits;
    const int chunk = (per_split + tile - 1) / tile * tile;
    const long long first = static_cast<long long>(begin) + static_cast<long long>(split) * chunk;
    const int b = static_cast<int>(first < end ? first : end);
    const long long last = static_cast<long long>(b) + chunk;
    return {b, static_cast<int>(last < end ? last : end)};
  }
};

}  // namespace fattn::cuda

#undef FATTN_DECODE_FN
