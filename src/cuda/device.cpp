// fattn — device queries of the CUDA backend (device.hpp) and its error checks
// (launchers.hpp: check_cuda, check_launch).
#include "cuda/device.hpp"

#include <cuda_runtime_api.h>

#include <string>

#include "cuda/host_checks.hpp"
#include "cuda/launchers.hpp"
#include "cuda/refusal.hpp"
#include "cuda/table_choice.hpp"  // current_capability

namespace fattn::cuda {

void check_cuda(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clear it, so the next call does not report it again
  fail(std::string(what) + " failed: " + error_text(status));
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail(std::string("launching ") + what + " failed: " + error_text(e));
}

ComputeCapability compute_capability(int device) {
  ComputeCapability c;
  if (cudaDeviceGetAttribute(&c.major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&c.minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  return c;
}

int multiprocessors(int device) {
  int sms = 0;
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute(multiProcessorCount)");
  return sms;
}

int usable_device() {
  int device = -1;
  const cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail("q is on cuda, but no CUDA device is usable: " + error_text(e));
  }
  const std::string why = least_capability_refusal(compute_capability(device));
  if (!why.empty()) fail(why + " (CUDA device " + std::to_string(device) + ")");
  return device;
}

void expect_wgmma_device(Kernel kernel, int device) {
  const std::string why = capability_refusal(kernel, compute_capability(device));
  if (!why.empty()) fail(why + " (CUDA device " + std::to_string(device) + ")");
}

void expect_device_memory(const char* name, const void* data, int device) {
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, data);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail(std::string(name) + " is marked Device::cuda, but CUDA does not know its data pointer (" +
         error_text(e) + ")");
  }
  if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
    fail(std::string(name) + " is marked Device::cuda, but its data pointer is " +
         (a.type == cudaMemoryTypeHost ? "page-locked host memory" : "host memory") +
         "; CUDA views need device memory (cudaMalloc, or a CUDA tensor's data pointer)");
  if (a.type == cudaMemoryTypeDevice && a.device != device)
    fail(std::string(name) + " is memory of CUDA device " + std::to_string(a.device) +
         ", but the current device is " + std::to_string(device) +
         " (cudaSetDevice to the tensors' device first)");
}

bool runs_on_current_device(Kernel kernel) {
  return capability_refusal(kernel, current_capability()).empty();
}

}  // namespace fattn::cuda
