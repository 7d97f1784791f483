// fattn — the CUDA backend's working memory for one call (the naive score matrix,
// repacked inputs), taken from one stream-ordered buffer.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "cuda/backend.hpp"
#include "cuda/host_checks.hpp"

namespace fattn::cuda {

inline constexpr std::int64_t kWorkAlignment = 256;  // each working buffer starts on 256 bytes

// Device memory for one call, stream-ordered: allocated on the stream before the
// launches, freed on it after them (no synchronisation either way). From the
// caller's allocator when Options::device_allocator is set (PyTorch's caching
// allocator, through the binding), else from cudaMallocAsync.
class StreamBuffer {
 public:
  // `kernel`: the kernel's name in error messages.
  StreamBuffer(std::int64_t bytes, cudaStream_t stream, const char* kernel,
               const DeviceAllocator* allocator)
      : stream_(stream), allocator_(allocator) {
    if (bytes == 0) return;
    if (allocator_) {
      ptr_ = allocator_->allocate(allocator_->context, bytes, stream);
      if (!ptr_)
        fail("the device allocator returned no memory for " + std::to_string(bytes) +
             " bytes of working memory for the " + kernel + " CUDA kernel");
      return;
    }
    const cudaError_t e = cudaMallocAsync(&ptr_, static_cast<std::size_t>(bytes), stream);
    if (e != cudaSuccess) {
      cudaGetLastError();
      ptr_ = nullptr;
      fail("could not allocate " + std::to_string(bytes) +
           " bytes of device working memory for the " + kernel +
           " CUDA kernel: " + error_text(e));
    }
  }
  ~StreamBuffer() {
    if (!ptr_) return;
    if (allocator_)
      allocator_->deallocate(allocator_->context, ptr_, stream_);
    else
      cudaFreeAsync(ptr_, stream_);
  }
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;

  // The next `bytes` of the buffer.
  void* take(std::int64_t bytes) {
    void* p = static_cast<char*>(ptr_) + used_;
    used_ += round_up(bytes, kWorkAlignment);
    return p;
  }

 private:
  cudaStream_t stream_;
  const DeviceAllocator* allocator_;
  void* ptr_ = nullptr;
  std::int64_t used_ = 0;
};

}  // namespace fattn::cuda
