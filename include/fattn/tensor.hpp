// fattn — tensor views: a pointer, sizes and strides, no ownership.
#pragma once

#include <array>
#include <cstdint>

namespace fattn {

// float64 is for checking gradients: on the CPU it runs the float64 reference only.
// int32 is for the KV cache's sequence lengths and block table (fattn/kv_cache.hpp),
// boolean (one byte, 0 or 1) for an attention mask.
enum class DType : std::uint8_t { float32, float16, bfloat16, float64, int32, boolean };
enum class Device : std::uint8_t { cpu, cuda };

const char* to_string(DType dtype);
const char* to_string(Device device);
int element_size(DType dtype);

// A float32 value as a float16 or bfloat16 element, rounded to nearest even as fattn's
// kernels round their 16-bit outputs (NaN stays NaN), and an element's value back. For
// preparing 16-bit inputs and reading 16-bit outputs; dtype must be float16 or bfloat16.
std::uint16_t to_16bit(float value, DType dtype);
float from_16bit(std::uint16_t bits, DType dtype);

// A strided view of up to 4 dimensions. Sizes and strides are in elements (64-bit).
// Attention tensors are always *logically* (batch, heads, seq, head_dim); the
// strides say how they sit in memory, so (B,H,S,D), (B,S,H,D) and any other
// strided view are read without copies. The logsumexp output is rank 3:
// (batch, heads, seq).
struct TensorView {
  void* data = nullptr;
  int rank = 4;
  std::array<std::int64_t, 4> sizes{};
  std::array<std::int64_t, 4> strides{};
  DType dtype = DType::float32;
  Device device = Device::cpu;

  std::int64_t size(int dim) const { return sizes[static_cast<std::size_t>(dim)]; }
  std::int64_t stride(int dim) const { return strides[static_cast<std::size_t>(dim)]; }

  // Contiguous (B, H, S, D) memory: PyTorch's layout for SDPA.
  static TensorView bhsd(void* data, std::int64_t batch, std::int64_t heads, std::int64_t seq,
                         std::int64_t head_dim, DType dtype = DType::float32,
                         Device device = Device::cpu);
  // Contiguous (B, S, H, D) memory: FlashAttention's layout, viewed as (B, H, S, D).
  static TensorView bshd(void* data, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                         std::int64_t head_dim, DType dtype = DType::float32,
                         Device device = Device::cpu);
  // Contiguous int32 vector of n elements (a KV cache's sequence lengths).
  static TensorView int32_vector(std::int32_t* data, std::int64_t n, Device device = Device::cpu);
  // Contiguous int32 (rows, cols) matrix (a paged KV cache's block table).
  static TensorView int32_matrix(std::int32_t* data, std::int64_t rows, std::int64_t cols,
                                 Device device = Device::cpu);
  // Contiguous (B, H, S) float32 logsumexp.
  static TensorView lse(float* data, std::int64_t batch, std::int64_t heads, std::int64_t seq,
                        Device device = Device::cpu);
  // Contiguous (B, H, S) logsumexp of another dtype (float64 for float64 problems).
  static TensorView lse(void* data, DType dtype, std::int64_t batch, std::int64_t heads,
                        std::int64_t seq, Device device = Device::cpu);
};

}  // namespace fattn
