// fattn CUDA tests — the TMA probe kernels (see tma_probe.hpp). Compiled for sm_90a only
// (tests/cuda/CMakeLists.txt); the test launches them on compute capability 9.0 only. Every
// kernel uses the attention kernel's own pieces (src/cuda/tma.cuh, tensor_map.hpp), so what
// passes here is what fused_tma runs.
#include "tma_probe.hpp"

#include "cuda/tensor_map.hpp"
#include "cuda/tma.cuh"
#include "cuda/wgmma.cuh"

namespace fattn_cuda_test::tma_probe {
namespace {

using namespace fattn::cuda;

// The test's layout models and the kernel's helpers agree (every element of both tile
// heights, every slice the kernel issues).
constexpr bool models_agree() {
  for (int r = 0; r < 128; ++r)
    for (int c = 0; c < 128; ++c)
      if (panel_offset(128, r, c) != static_cast<std::uint32_t>(sw128_offset<128>(r, c)) ||
          (r < 64 && panel_offset(64, r, c) != static_cast<std::uint32_t>(sw128_offset<64>(r, c))))
        return false;
  for (int kk = 0; kk < 8; ++kk)
    if (k_slice_start(128, kk) != sw128_k_slice_bytes<128>(kk) ||
        k_slice_start(64, kk) != sw128_k_slice_bytes<64>(kk) ||
        mn_slice_start(kk) != sw128_mn_slice_bytes(kk))
      return false;
  // wgmma's reading of the kernel's descriptors lands where the copy engine wrote: K-major
  // (Q, K) element (row, 16kk + k) and MN-major (V) element (key 16kk + k, column n).
  for (int kk = 0; kk < 8; ++kk)
    for (int mn = 0; mn < 128; ++mn)
      for (int k = 0; k < 16; ++k) {
        if (wgmma_read_address(false, k_slice_start(128, kk), mn, k, Swizzle::b128, kSw128KMajorLbo,
                               kSw128Sbo) != panel_offset(128, mn, 16 * kk + k))
          return false;
        if (wgmma_read_address(true, mn_slice_start(kk), mn, k, Swizzle::b128,
                               sw128_panel_bytes<128>(), kSw128Sbo) != panel_offset(128, 16 * kk + k, mn))
          return false;
      }
  return true;
}
static_assert(models_agree(), "tma_probe.hpp's layout models match src/cuda/tma.cuh");

constexpr long long kWaitCycles = 2000000000LL;  // about a second: a wait that never completes

__device__ unsigned char* align_1024(unsigned char* p) {
  const std::uint32_t a = smem_u32(p);
  return p + (((a + 1023u) & ~1023u) - a);
}

__device__ std::uint64_t barrier_word(const std::uint64_t* bar) {
  return *reinterpret_cast<const volatile std::uint64_t*>(bar);
}

// A wait with a time limit, by every thread: whether the phase completed, and how many
// try_waits said no first.
__device__ bool bounded_wait(std::uint64_t* bar, std::uint32_t parity, long long& polls) {
  const long long start = clock64();
  polls = 0;
  while (!mbar_try_wait(bar, parity)) {
    ++polls;
    if (clock64() - start > kWaitCycles) return false;
  }
  return true;
}

__device__ void copy_out(const unsigned char* smem, std::uint16_t* out, int bytes, int tid) {
  for (int i = tid; i < bytes / 16; i += kThreads)
    reinterpret_cast<uint4*>(out)[i] = reinterpret_cast<const uint4*>(smem)[i];
}

// ---- 1. TMA load under an mbarrier ----------------------------------------------------------
// diag per phase: completed, polls, test_same, test_other, raw_before, raw_after.
template <int kPanels>
__global__ void __launch_bounds__(kThreads) load_probe_kernel(const __grid_constant__ CUtensorMap map,
                                                             int3 box0, int3 box1,
                                                             std::uint16_t* dump,
                                                             unsigned long long* diag) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* const smem = align_1024(smem_raw);
  constexpr int kBoxBytes = kPanels * kBoxRows * 128;
  std::uint64_t* const bar = reinterpret_cast<std::uint64_t*>(smem + 2 * kBoxBytes);
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    mbar_init(bar, 1);
    mbar_init_fence();
  }
  __syncthreads();
  for (int phase = 0; phase < 2; ++phase) {
    const int3 box = phase == 0 ? box0 : box1;
    unsigned char* const dst = smem + phase * kBoxBytes;
    if (tid == 0) {
      diag[phase * 6 + 4] = barrier_word(bar);
      mbar_arrive_expect_tx(bar, kBoxBytes);
#pragma unroll
      for (int panel = 0; panel < kPanels; ++panel)
        tma_load_4d(dst + panel * kBoxRows * 128, &map, bar, panel * kPanelCols, box.x, box.y, box.z);
    }
    long long polls = 0;
    const bool done = bounded_wait(bar, phase & 1, polls);
    const bool same = mbar_test_wait(bar, phase & 1), other = mbar_test_wait(bar, (phase & 1) ^ 1);
    if (tid == 0) {
      diag[phase * 6 + 0] = done;
      diag[phase * 6 + 1] = static_cast<unsigned long long>(polls);
      diag[phase * 6 + 2] = same;
      diag[phase * 6 + 3] = other;
      diag[phase * 6 + 5] = barrier_word(bar);
    }
    if (!__syncthreads_and(done)) break;  // phase 1 means nothing after a lost phase 0
  }
  __syncthreads();
  copy_out(smem, dump, 2 * kBoxBytes, tid);
}

// ---- 2. wgmma on the swizzled tiles -----------------------------------------------------------
__device__ std::uint64_t custom_desc(const void* tile, const DescFields& f) {
  return wgmma_desc_encode_swizzled(smem_u32(tile), f.lbo, f.sbo, static_cast<std::uint32_t>(f.base_offset),
                                    static_cast<SmemLayout>(f.layout));
}

// kKeys: B's rows (the N of S): 128 as the forward's key tile, 64 as the backward's query
// tiles (src/cuda/backward_tma.cuh).
template <int kD, int kKeys>
__global__ void __launch_bounds__(kThreads) qk_probe_kernel(const __grid_constant__ CUtensorMap amap,
                                                           const __grid_constant__ CUtensorMap bmap,
                                                           DescFields f, float* raw,
                                                           std::uint16_t* dump_a, std::uint16_t* dump_b,
                                                           int* loaded) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* const smem = align_1024(smem_raw);
  constexpr int kABytes = kARows * kD * 2, kBBytes = kKeys * kD * 2;
  unsigned char* const sa = smem;
  unsigned char* const sb = smem + kABytes;
  std::uint64_t* const bar = reinterpret_cast<std::uint64_t*>(sb + kBBytes);
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    mbar_init(bar, 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (tid == 0) {
    mbar_arrive_expect_tx(bar, kABytes + kBBytes);
#pragma unroll
    for (int panel = 0; panel < kD / kPanelCols; ++panel) {
      tma_load_4d(sa + panel * sw128_panel_bytes<kARows>(), &amap, bar, panel * kPanelCols, 0, 0, 0);
      tma_load_4d(sb + panel * sw128_panel_bytes<kKeys>(), &bmap, bar, panel * kPanelCols, 0, 0, 0);
    }
  }
  long long polls = 0;
  const bool done = __syncthreads_and(bounded_wait(bar, 0, polls));
  if (tid == 0) *loaded = done;
  if (!done) return;
  float s[kKeys / 8][4];
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
  if (f.kernel) {
    issue_qk<Sw128Slices, __half, kD, kKeys, kARows>(s, sw128_k_major_desc<kARows>(sa),
                                              sw128_k_major_desc<kKeys>(sb));
  } else {
    const std::uint64_t da = custom_desc(sa, f), db = custom_desc(sb, f);
    wgmma_fence_operands(s);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      wgmma_ss<__half, kKeys, 0, 0>(s, da + (sw128_k_slice_bytes<kARows>(kk) >> 4),
                                    db + (sw128_k_slice_bytes<kKeys>(kk) >> 4), kk > 0);
    wgmma_commit_group();
  }
  wgmma_wait_group<0>();
  wgmma_fence_operands(s);
#pragma unroll
  for (int i = 0; i < kKeys / 2; ++i) raw[tid * (kKeys / 2) + i] = s[i / 4][i % 4];
  copy_out(sa, dump_a, kABytes, tid);
  copy_out(sb, dump_b, kBBytes, tid);
}

// kKeys: V's rows (the K of O += P·V, P's columns): 128 as the forward's, 64 as the
// backward's dO and Q tiles in dV += Pᵀ·dO, dK += dSᵀ·Q and K's in dQ += dS·K.
template <int kD, int kKeys>
__global__ void __launch_bounds__(kThreads) pv_probe_kernel(const __grid_constant__ CUtensorMap vmap,
                                                           const __half* p, DescFields f, float* raw,
                                                           std::uint16_t* dump_v, int* loaded) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* const smem = align_1024(smem_raw);
  constexpr int kVBytes = kKeys * kD * 2;
  std::uint64_t* const bar = reinterpret_cast<std::uint64_t*>(smem + kVBytes);
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    mbar_init(bar, 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (tid == 0) {
    mbar_arrive_expect_tx(bar, kVBytes);
#pragma unroll
    for (int panel = 0; panel < kD / kPanelCols; ++panel)
      tma_load_4d(smem + panel * sw128_panel_bytes<kKeys>(), &vmap, bar, panel * kPanelCols, 0, 0, 0);
  }
  // Each thread's A fragments of every 16-key slice (wgmma.cuh's RS layout): register j of
  // slice kk holds row 16w + l/4 + 8·(j%2), columns 16kk + 2·(l%4) + 8·(j/2) + {0, 1}.
  const int warp = tid / 32, lane = tid % 32;
  std::uint32_t a[kKeys / 16][4];
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int row = 16 * warp + lane / 4 + 8 * (j % 2);
      const int col = 16 * kk + 2 * (lane % 4) + 8 * (j / 2);
      a[kk][j] = *reinterpret_cast<const std::uint32_t*>(p + row * kKeys + col);
    }
  long long polls = 0;
  const bool done = __syncthreads_and(bounded_wait(bar, 0, polls));
  if (tid == 0) *loaded = done;
  if (!done) return;
  float o[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  if (f.kernel) {
    issue_pv<Sw128Slices, __half, kD, kKeys / 16>(a, o, sw128_mn_major_desc<kKeys>(smem));
  } else {
    const std::uint64_t dv = custom_desc(smem, f);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) wgmma_fence_operands(a[kk]);
    wgmma_fence_operands(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
      wgmma_rs<__half, kD, 1>(o, a[kk], dv + (sw128_mn_slice_bytes(kk) >> 4), true);
    wgmma_commit_group();
  }
  wgmma_wait_group<0>();
  wgmma_fence_operands(o);
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) wgmma_fence_operands(a[kk]);
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) raw[tid * (kD / 2) + i] = o[i / 4][i % 4];
  copy_out(smem, dump_v, kVBytes, tid);
}

// ---- host side ------------------------------------------------------------------------------
struct DeviceBuffers {
  std::vector<void*> blocks;
  cudaError_t error = cudaSuccess;
  template <class T>
  T* make(std::size_t count, const void* init = nullptr, int fill = 0) {
    void* p = nullptr;
    if (error == cudaSuccess) error = cudaMalloc(&p, count * sizeof(T) + 16);
    if (error == cudaSuccess) blocks.push_back(p);
    if (error == cudaSuccess)
      error = init ? cudaMemcpy(p, init, count * sizeof(T), cudaMemcpyHostToDevice)
                   : cudaMemset(p, fill, count * sizeof(T));
    return static_cast<T*>(p);
  }
  template <class T>
  void fetch(std::vector<T>& out, const T* p, std::size_t count) {
    out.resize(count);
    if (error == cudaSuccess) error = cudaMemcpy(out.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost);
  }
  ~DeviceBuffers() {
    for (void* p : blocks) cudaFree(p);
  }
};

// A row-major rows × cols matrix as a (1, 1, rows, cols) tensor map with box_rows-row boxes.
CUresult matrix_map(CUtensorMap* map, const void* data, int rows, int cols, int box_rows) {
  HeadTensorGeometry g;
  g.data = data;
  g.batch = g.heads = 1;
  g.seq = rows;
  g.head_dim = cols;
  g.seq_stride = cols;
  g.head_stride = g.batch_stride = std::int64_t(rows) * cols;
  return encode_head_tile_map(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, g, static_cast<std::uint32_t>(box_rows));
}

template <class Kernel>
cudaError_t allow_smem(Kernel kernel, int bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

}  // namespace

cudaError_t run_load(const LoadSetup& setup, const std::vector<std::uint16_t>& tensor,
                     LoadResult& result) {
  DeviceBuffers buf;
  const std::uint16_t* dt = buf.make<std::uint16_t>(tensor.size(), tensor.data());
  const int bytes = 2 * static_cast<int>(setup.box_bytes());
  std::uint16_t* dump = buf.make<std::uint16_t>(bytes / 2, nullptr, 0xAB);
  unsigned long long* diag = buf.make<unsigned long long>(12);
  if (buf.error != cudaSuccess) return buf.error;
  HeadTensorGeometry g;
  g.data = dt;
  g.batch = setup.batch;
  g.heads = setup.heads;
  g.seq = setup.seq;
  g.head_dim = setup.head_dim;
  g.batch_stride = setup.batch_stride();
  g.head_stride = setup.head_stride();
  g.seq_stride = setup.seq_stride();
  CUtensorMap map;
  result.encode_status = encode_head_tile_map(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, g, kBoxRows);
  if (result.encode_status != CUDA_SUCCESS) return cudaSuccess;
  const int3 b0{setup.box[0][0], setup.box[0][1], setup.box[0][2]};
  const int3 b1{setup.box[1][0], setup.box[1][1], setup.box[1][2]};
  const int smem = bytes + 64 + 1024;
  if (setup.panels == 1) {
    buf.error = allow_smem(load_probe_kernel<1>, smem);
    if (buf.error == cudaSuccess) load_probe_kernel<1><<<1, kThreads, smem>>>(map, b0, b1, dump, diag);
  } else {
    buf.error = allow_smem(load_probe_kernel<2>, smem);
    if (buf.error == cudaSuccess) load_probe_kernel<2><<<1, kThreads, smem>>>(map, b0, b1, dump, diag);
  }
  if (buf.error == cudaSuccess) buf.error = cudaGetLastError();
  if (buf.error == cudaSuccess) buf.error = cudaDeviceSynchronize();
  std::vector<std::uint16_t> all;
  std::vector<unsigned long long> d;
  buf.fetch(all, dump, static_cast<std::size_t>(bytes / 2));
  buf.fetch(d, diag, 12);
  if (buf.error != cudaSuccess) return buf.error;
  for (int ph = 0; ph < 2; ++ph) {
    BarrierPhase& b = result.phase[ph];
    b.completed = d[ph * 6 + 0] != 0;
    b.polls = static_cast<long long>(d[ph * 6 + 1]);
    b.test_same = d[ph * 6 + 2] != 0;
    b.test_other = d[ph * 6 + 3] != 0;
    b.raw_before = d[ph * 6 + 4];
    b.raw_after = d[ph * 6 + 5];
    const auto first = all.begin() + static_cast<std::ptrdiff_t>(ph) * (bytes / 4);
    result.smem[ph].assign(first, first + bytes / 4);
  }
  return cudaSuccess;
}

cudaError_t run_qk(const std::vector<__half>& a, const std::vector<__half>& b, int D,
                   const DescFields& desc, WgmmaResult& result, int keys) {
  if ((D != 64 && D != 128) || (keys != 64 && keys != 128)) return cudaErrorInvalidValue;
  DeviceBuffers buf;
  const __half* da = buf.make<__half>(a.size(), a.data());
  const __half* db = buf.make<__half>(b.size(), b.data());
  float* raw = buf.make<float>(static_cast<std::size_t>(kThreads * keys / 2), nullptr, 0xFF);
  std::uint16_t* dump_a = buf.make<std::uint16_t>(kARows * D);
  std::uint16_t* dump_b = buf.make<std::uint16_t>(static_cast<std::size_t>(keys * D));
  int* loaded = buf.make<int>(1);
  if (buf.error != cudaSuccess) return buf.error;
  CUtensorMap amap, bmap;
  result.encode_status = matrix_map(&amap, da, kARows, D, kARows);
  if (result.encode_status == CUDA_SUCCESS) result.encode_status = matrix_map(&bmap, db, keys, D, keys);
  if (result.encode_status != CUDA_SUCCESS) return cudaSuccess;
  const int smem = (kARows + keys) * D * 2 + 64 + 1024;
  auto launch = [&](auto kernel) {
    buf.error = allow_smem(kernel, smem);
    if (buf.error == cudaSuccess) kernel<<<1, kThreads, smem>>>(amap, bmap, desc, raw, dump_a, dump_b, loaded);
  };
  if (D == 64) keys == 64 ? launch(qk_probe_kernel<64, 64>) : launch(qk_probe_kernel<64, 128>);
  else keys == 64 ? launch(qk_probe_kernel<128, 64>) : launch(qk_probe_kernel<128, 128>);
  if (buf.error == cudaSuccess) buf.error = cudaGetLastError();
  if (buf.error == cudaSuccess) buf.error = cudaDeviceSynchronize();
  std::vector<int> l;
  buf.fetch(result.raw, raw, static_cast<std::size_t>(kThreads * keys / 2));
  buf.fetch(result.smem_a, dump_a, static_cast<std::size_t>(kARows * D));
  buf.fetch(result.smem_b, dump_b, static_cast<std::size_t>(keys * D));
  buf.fetch(l, loaded, 1);
  result.loaded = !l.empty() && l[0] != 0;
  return buf.error;
}

cudaError_t run_pv(const std::vector<__half>& p, const std::vector<__half>& v, int D,
                   const DescFields& desc, WgmmaResult& result, int keys) {
  if ((D != 64 && D != 128) || (keys != 64 && keys != 128)) return cudaErrorInvalidValue;
  DeviceBuffers buf;
  const __half* dp = buf.make<__half>(p.size(), p.data());
  const __half* dv = buf.make<__half>(v.size(), v.data());
  float* raw = buf.make<float>(kThreads * D / 2, nullptr, 0xFF);
  std::uint16_t* dump_v = buf.make<std::uint16_t>(static_cast<std::size_t>(keys * D));
  int* loaded = buf.make<int>(1);
  if (buf.error != cudaSuccess) return buf.error;
  CUtensorMap vmap;
  result.encode_status = matrix_map(&vmap, dv, keys, D, keys);
  if (result.encode_status != CUDA_SUCCESS) return cudaSuccess;
  const int smem = keys * D * 2 + 64 + 1024;
  auto launch = [&](auto kernel) {
    buf.error = allow_smem(kernel, smem);
    if (buf.error == cudaSuccess) kernel<<<1, kThreads, smem>>>(vmap, dp, desc, raw, dump_v, loaded);
  };
  if (D == 64) keys == 64 ? launch(pv_probe_kernel<64, 64>) : launch(pv_probe_kernel<64, 128>);
  else keys == 64 ? launch(pv_probe_kernel<128, 64>) : launch(pv_probe_kernel<128, 128>);
  if (buf.error == cudaSuccess) buf.error = cudaGetLastError();
  if (buf.error == cudaSuccess) buf.error = cudaDeviceSynchronize();
  std::vector<int> l;
  buf.fetch(result.raw, raw, static_cast<std::size_t>(kThreads * D / 2));
  buf.fetch(result.smem_b, dump_v, static_cast<std::size_t>(keys * D));
  buf.fetch(l, loaded, 1);
  result.loaded = !l.empty() && l[0] != 0;
  return buf.error;
}

std::uint64_t encode_descriptor(std::uint32_t smem_addr, std::uint32_t lbo, std::uint32_t sbo,
                                int base_offset, int layout) {
  return wgmma_desc_encode_swizzled(smem_addr, lbo, sbo, static_cast<std::uint32_t>(base_offset),
                                    static_cast<SmemLayout>(layout));
}

}  // namespace fattn_cuda_test::tma_probe
