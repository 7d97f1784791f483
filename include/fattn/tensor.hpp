// fattn — tensor views: a pointer, sizes and strides, no ownership.
#pragma once

#include <array>
#include <cstdint>

namespace fattn {

// float64 is for checking gradients: on the CPU it runs the float64 reference only.
// int32 is for the KV cache's sequence lengths and block table (fattn/kv_cache.hpp),
// boolean (one byte, 0 or 1) for an attention mask.
// q8_0 is fattn's int8 K/V format (ggml's block_q8_0, llama.cpp's `-ctk q8_0 -ctv q8_0`):
// each row of head_dim values is head_dim / 32 blocks of 34 bytes, a float16 scale d then
// 32 int8 q, value = d·q. It halves a 16-bit cache's bytes. K and V of a CPU
// attention_forward take it, with q and out float32; the kernels widen it to float32 as
// they read it. A q8_0 view's sizes count values, its strides count bytes (the head dim's
// must be 1: a row's blocks lie back to back), and head_dim must be a multiple of 32.
enum class DType : std::uint8_t { float32, float16, bfloat16, float64, int32, boolean, q8_0 };
enum class Device : std::uint8_t { cpu, cuda };

const char* to_string(DType dtype);
const char* to_string(Device device);
int element_size(DType dtype);

// A float32 value as a float16 or bfloat16 element, rounded to nearest even as fattn's
// kernels round their 16-bit outputs (NaN stays NaN), and an element's value back. For
// preparing 16-bit inputs and reading 16-bit outputs; dtype must be float16 or bfloat16.
std::uint16_t to_16bit(float value, DType dtype);
float from_16bit(std::uint16_t bits, DType dtype);

// The q8_0 format (see DType): values per block, bytes per block, bytes of a row of n
// values (n a multiple of kQ8_0BlockValues).
constexpr std::int64_t kQ8_0BlockValues = 32;
constexpr std::int64_t kQ8_0BlockBytes = 34;
constexpr std::int64_t q8_0_row_bytes(std::int64_t n) { return n / kQ8_0BlockValues * kQ8_0BlockBytes; }
// n float32 values (n a multiple of 32) as q8_0 blocks at dst: per block d = max|x| / 127
// rounded to float16, q = x / d rounded to nearest (ties away from zero), as ggml
// quantizes; and q8_0 blocks back to float32 (exact: d·q needs 19 of float32's 24 bits).
void quantize_q8_0(const float* src, std::int64_t n, void* dst);
void dequantize_q8_0(const void* src, std::int64_t n, float* dst);

// A strided view of up to 4 dimensions. Sizes and strides are in elements (64-bit;
// q8_0: sizes in values, strides in bytes).
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
