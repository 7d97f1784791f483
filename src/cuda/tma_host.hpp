// fattn — the host side of the TMA kernels' loads (fused_tma.cuh, backward_tma.cu): the tensor
// map data type of a 16-bit element type, and the encoding of one input's map with an error
// that names the kernel and the input (the map itself: tensor_map.hpp).
#pragma once

#include <cuda.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/host_checks.hpp"
#include "cuda/tensor_map.hpp"

namespace fattn::cuda {

template <class T>
constexpr CUtensorMapDataType tma_data_type() {
  return std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
}

// `kernel`: the kernel's name in the error.
inline void encode_or_fail(CUtensorMap* map, CUtensorMapDataType type,
                           const HeadTensorGeometry& g, std::uint32_t box_rows, const char* name,
                           const char* kernel = "fused_tma") {
  const CUresult r = encode_head_tile_map(map, type, g, box_rows);
  if (r == CUDA_ERROR_NOT_FOUND)
    fail(std::string("the ") + kernel + " CUDA kernel needs the driver's cuTensorMapEncodeTiled, which this "
         "driver does not provide");
  if (r != CUDA_SUCCESS)
    fail(std::string("the ") + kernel + " CUDA kernel could not describe " + name +
         " as a TMA tensor map (cuTensorMapEncodeTiled returned " + std::to_string(static_cast<int>(r)) +
         "; its data pointer must be 16-byte aligned and its strides multiples of 16 bytes)");
}

}  // namespace fattn::cuda
