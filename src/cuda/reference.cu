// fattn — the float64 CUDA reference (Impl::reference on the GPU): the definition
// every CUDA kernel can be checked against on the same device, as cpu/reference.cpp
// does on the CPU, and with the same semantics:
//   s_j = scale · Σ_d q_d k_jd, then softcap (c·tanh(s/c)) and ALiBi (− slope·|i + Sk − Sq − j|),
//   over the keys the band shows row i (visibility.cuh); with a sink, its logit joins them
//   in the denominator: m = max(s_j, sink) (NaN never becomes m; a NaN sink makes the row
//   NaN), out = Σ_j e^(s_j − m) v_j / (e^(sink − m) + Σ_j e^(s_j − m)), lse = m + ln(...);
//   a row that sees no key (and has no sink) gives out = 0 and lse = −inf.
// One warp per query row; lane l holds dims l, l+32, ... (head dim <= 256: 8 each).
// Two passes over the keys (max, then sums), recomputing the dot products: slow and
// simple, for tests.
#include <math_constants.h>

#include "cuda/common.cuh"
#include "cuda/launchers.hpp"

namespace fattn::cuda {
namespace {

constexpr int kWarps = 8;      // query rows per block
constexpr int kPerLane = 8;    // 256 / 32 dims per lane

__device__ __forceinline__ double warp_sum(double x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

template <class T>
__global__ void __launch_bounds__(32 * kWarps) reference_kernel(const Params p) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t row_id = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row_id >= static_cast<std::int64_t>(p.batch) * p.q_heads * p.q_len) return;
  const int i = static_cast<int>(row_id % p.q_len);
  const int bh = static_cast<int>(row_id / p.q_len);
  const int b = bh / p.q_heads, h = bh % p.q_heads;
  const T* const q = head_ptr<T>(p.q, p.q_stride, b, h) + i * p.q_stride.seq;
  const T* const k = head_ptr<T>(p.k, p.k_stride, b, h / p.group);
  const T* const v = head_ptr<T>(p.v, p.v_stride, b, h / p.group);

  double qd[kPerLane];
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int d = lane + 32 * c;
    qd[c] = d < p.head_dim ? static_cast<double>(to_float(q[d])) : 0.0;
  }
  auto score = [&](int j) {
    const T* const krow = k + j * p.k_stride.seq;
    double dot = 0.0;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) {
      const int d = lane + 32 * c;
      if (d < p.head_dim) dot += qd[c] * static_cast<double>(to_float(krow[d]));
    }
    double s = warp_sum(dot) * p.scale;
    if (p.softcap != 0.0f) s = p.softcap * tanh(s / p.softcap);
    if (p.alibi) s -= static_cast<double>(p.alibi[b * p.alibi_batch + h]) * fabs(static_cast<double>(i) + p.kv_len - p.q_len - j);
    return s;
  };

  const int begin = visibility(p).kv_begin(i), end = visibility(p).kv_end(i + 1);
  const double sink = p.sinks ? static_cast<double>(p.sinks[h]) : -CUDART_INF;
  double m = sink;
  for (int j = begin; j < end; ++j) {
    const double s = score(j);
    if (s > m) m = s;
  }
  if (isnan(sink)) m = sink;
  const double m_ref = m == -CUDART_INF ? 0.0 : m;
  double sum = exp(sink - m_ref), acc[kPerLane] = {};
  for (int j = begin; j < end; ++j) {
    const double e = exp(score(j) - m_ref);
    sum += e;
    const T* const vrow = v + j * p.v_stride.seq;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) {
      const int d = lane + 32 * c;
      if (d < p.head_dim) acc[c] += e * static_cast<double>(to_float(vrow[d]));
    }
  }
  T* const out = head_ptr<T>(p.out, p.out_stride, b, h) + i * p.out_stride.seq;
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int d = lane + 32 * c;
    if (d < p.head_dim) out[d] = from_float<T>(sum != 0.0 ? static_cast<float>(acc[c] / sum) : 0.0f);
  }
  if (p.lse && lane == 0)
    lse_head(p, b, h)[i * p.lse_stride.seq] =
        sum != 0.0 ? static_cast<float>(m_ref + log(sum)) : -CUDART_INF_F;
}

}  // namespace

template <class T>
void launch_reference(const Params& p, cudaStream_t stream) {
  const long long rows = static_cast<long long>(p.batch) * p.q_heads * p.q_len;
  reference_kernel<T>
      <<<static_cast<unsigned>((rows + kWarps - 1) / kWarps), 32 * kWarps, 0, stream>>>(p);
  check_launch("reference_kernel");
}

template void launch_reference<float>(const Params&, cudaStream_t);
template void launch_reference<__half>(const Params&, cudaStream_t);
template void launch_reference<__nv_bfloat16>(const Params&, cudaStream_t);

}  // namespace fattn::cuda
