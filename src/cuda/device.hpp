// fattn — what the CUDA backend asks of the device: which one is current, its compute
// capability and multiprocessors, and where a pointer's memory lives.
#pragma once

#include "cuda/backend.hpp"

namespace fattn::cuda {

struct ComputeCapability {
  int major = 0, minor = 0;
};

// sm_90a machine code runs on compute capability 9.0 only (the "a" targets have no
// forward compatibility).
inline constexpr ComputeCapability kWgmmaCapability{9, 0};

// {0, 0} when CUDA cannot say (the error is cleared).
ComputeCapability compute_capability(int device);
int multiprocessors(int device);

// The current device; an Error when there is none or it is older than compute
// capability 8.0 (cp.async, bf16 and tf32 mma.sync).
int usable_device();
// An Error unless `device` runs sm_90a code (the wgmma kernels).
void expect_wgmma_device(Kernel kernel, int device);
// An Error unless `data` is device (or managed) memory of `device`; `name` is the
// argument's name in the message.
void expect_device_memory(const char* name, const void* data, int device);

}  // namespace fattn::cuda
