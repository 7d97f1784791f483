// fattn CUDA tests — the device side of the shared test layer: whether a usable GPU is
// present, device buffers, and device copies of host tensors (tensor.hpp): a buffer of
// the host storage's exact size, so compute-sanitizer reports any access past its end.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "fattn/fattn.hpp"
#include "tensor.hpp"

namespace fattn_cuda_test {

using fattn_test::Tensor;
using fattn_test::TensorView;

// The CUDA kernels need compute capability 8.0 (Ampere) or newer.
constexpr int kMinComputeCapabilityMajor = 8;

// Success, or the failing call and the CUDA runtime's word for its error.
inline ::testing::AssertionResult cuda_succeeded(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << call << ": " << cudaGetErrorString(status);
}

// Asserts that a CUDA runtime call succeeded (a fatal failure of the test otherwise).
#define CUDA_OK(call) ASSERT_TRUE(::fattn_cuda_test::cuda_succeeded((call), #call))

// Why this machine cannot run the CUDA kernels ("" when it can).
inline std::string why_no_gpu() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no CUDA device: cudaGetDeviceCount says ") + cudaGetErrorString(e) +
           " (the CUDA tests need a GPU)";
  }
  if (count == 0) return "no CUDA device: cudaGetDeviceCount found 0 (the CUDA tests need a GPU)";
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  if (major < kMinComputeCapabilityMajor)
    return "the CUDA kernels need compute capability 8.0+, device 0 is older";
  return "";
}

// Skips the current test unless a CUDA device of compute capability >= 8.0 is present
// (GTEST_SKIP returns from the test body, so this has to be a macro).
#define FATTN_REQUIRE_GPU()                                                 \
  do {                                                                      \
    if (!::fattn_cuda_test::why_no_gpu().empty())                           \
      GTEST_SKIP() << ::fattn_cuda_test::why_no_gpu();                      \
  } while (0)

// Device memory; get() is null when cudaMalloc failed.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, bytes) != cudaSuccess) {
      cudaGetLastError();
      ptr_ = nullptr;
    }
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(ptr_, other.ptr_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::uint8_t* get() const { return static_cast<std::uint8_t*>(ptr_); }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// A host tensor's storage on the device, and the tensor's view at it.
struct DeviceTensor {
  DeviceBuffer buffer;
  TensorView view;
  bool ok() const { return buffer.get() != nullptr; }
};

// Copies t's whole storage (view and padding) into a new device buffer.
inline DeviceTensor upload(const Tensor& t) {
  DeviceTensor d;
  d.buffer = DeviceBuffer(t.byte_size());
  if (!d.ok()) return d;
  d.view = t.view_at(d.buffer.get(), fattn::Device::cuda);
  EXPECT_TRUE(cuda_succeeded(cudaMemcpy(d.buffer.get(), t.bytes(), t.byte_size(), cudaMemcpyHostToDevice),
                             "cudaMemcpy to the device"));
  return d;
}

// Copies the device storage back over t's storage.
inline void download(const DeviceTensor& d, Tensor& t) {
  EXPECT_TRUE(cuda_succeeded(cudaMemcpy(t.bytes(), d.buffer.get(), t.byte_size(), cudaMemcpyDeviceToHost),
                             "cudaMemcpy to the host"));
}

}  // namespace fattn_cuda_test
