// fattn — host side of the TMA loads (tma.cuh): the tensor map of one (B, H, S, D) input,
// encoded by the driver's cuTensorMapEncodeTiled. The driver function is taken through the
// runtime's cudaGetDriverEntryPointByVersion, so nothing links libcuda directly (the
// runtime loads the driver as it does for every launch); cuda.h gives the types only.
//
// The map is 4-d, innermost first: (head dim, sequence, heads, batch), strides in bytes
// from the tensor's own element strides, so BHSD, BSHD and padded layouts all work as they
// are (the strides need not grow with the dimension: BSHD's head stride is below its
// sequence stride). The box is 64 columns (128 bytes, the swizzle span) × box_rows rows of one
// (head, batch), written to shared memory with the 128-byte swizzle (tma.cuh); columns
// past the head dim and rows past the sequence are zero-filled by the copy engine.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

#include <cstdint>

#include "cuda/params.hpp"

namespace fattn::cuda {

// The driver's cuTensorMapEncodeTiled (ABI of CUDA 12.0), or null when the driver has none;
// looked up once.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                           cudaEnableDefault, &found);
#else  // runtimes before 12.5 have only the unversioned lookup
    const cudaError_t e =
        cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found);
#endif
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encoder;
}

// One input's geometry: element strides (batch, head, seq) and sizes, as Params holds them.
struct HeadTensorGeometry {
  const void* data = nullptr;
  std::int64_t batch_stride = 0, head_stride = 0, seq_stride = 0;  // elements
  int batch = 0, heads = 0, seq = 0, head_dim = 0;
};

// The geometry of one of a kernel's (batch, heads, seq, head_dim) inputs from its Params fields.
inline HeadTensorGeometry head_geometry(const void* data, const Strides3& st, int batch, int heads,
                                        int seq, int head_dim) {
  HeadTensorGeometry g;
  g.data = data;
  g.batch_stride = st.batch;
  g.head_stride = st.head;
  g.seq_stride = st.seq;
  g.batch = batch;
  g.heads = heads;
  g.seq = seq;
  g.head_dim = head_dim;
  return g;
}

constexpr std::uint32_t kTmaBoxCols = 64;  // one 128-byte swizzle span of 16-bit elements

// Encodes the tensor map of `g` (16-bit elements of `type`) with boxes of 64 × box_rows and
// the given shared-memory swizzle. A dimension of size 1 never uses its stride, so an
// arbitrary one (PyTorch keeps any) is replaced by the natural one. Sizes of 0 become 1
// (a kernel with nothing to load issues no copy). Returns the driver's result;
// CUDA_ERROR_NOT_FOUND when the driver has no encoder.
inline CUresult encode_head_tile_map(CUtensorMap* map, CUtensorMapDataType type,
                                     const HeadTensorGeometry& g, std::uint32_t box_rows,
                                     CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (!encode) return CUDA_ERROR_NOT_FOUND;
  constexpr std::uint64_t kElem = 2;
  auto at_least_1 = [](int n) { return static_cast<cuuint64_t>(n > 0 ? n : 1); };
  const cuuint64_t dims[4] = {at_least_1(g.head_dim), at_least_1(g.seq), at_least_1(g.heads),
                              at_least_1(g.batch)};
  auto round16 = [](std::uint64_t b) { return (b + 15) / 16 * 16; };
  const std::uint64_t natural_seq = round16(dims[0] * kElem);
  const std::uint64_t seq_bytes =
      dims[1] > 1 ? static_cast<std::uint64_t>(g.seq_stride) * kElem : natural_seq;
  const std::uint64_t head_bytes =
      dims[2] > 1 ? static_cast<std::uint64_t>(g.head_stride) * kElem : seq_bytes * dims[1];
  const std::uint64_t batch_bytes =
      dims[3] > 1 ? static_cast<std::uint64_t>(g.batch_stride) * kElem : head_bytes * dims[2];
  const cuuint64_t strides[3] = {seq_bytes, head_bytes, batch_bytes};
  const cuuint32_t box[4] = {kTmaBoxCols, box_rows, 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  return encode(map, type, 4, const_cast<void*>(g.data), dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

}  // namespace fattn::cuda
