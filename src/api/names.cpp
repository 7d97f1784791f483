// fattn — names of the enumerations, and the tensor-view constructors.
#include <string>

#include "fattn/attention.hpp"
#include "fattn/tensor.hpp"

namespace fattn {

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::float32: return "float32";
    case DType::float16: return "float16";
    case DType::bfloat16: return "bfloat16";
    case DType::float64: return "float64";
    case DType::int32: return "int32";
    case DType::boolean: return "bool";
    case DType::q8_0: return "q8_0";
  }
  return "unknown dtype";
}

const char* to_string(Device device) {
  switch (device) {
    case Device::cpu: return "cpu";
    case Device::cuda: return "cuda";
  }
  return "unknown device";
}

int element_size(DType dtype) {
  switch (dtype) {
    case DType::float32:
    case DType::int32: return 4;
    case DType::float64: return 8;
    case DType::float16:
    case DType::bfloat16: return 2;
    case DType::boolean:
    case DType::q8_0: return 1;  // q8_0 strides count bytes
  }
  return 0;
}

const char* to_string(Causal causal) {
  switch (causal) {
    case Causal::none: return "none";
    case Causal::top_left: return "top_left";
    case Causal::bottom_right: return "bottom_right";
  }
  return "unknown causal";
}

const char* to_string(Impl impl) {
  switch (impl) {
    case Impl::automatic: return "auto";
    case Impl::reference: return "reference";
    case Impl::naive: return "naive";
    case Impl::fused: return "fused";
    case Impl::decode: return "decode";
  }
  return "unknown impl";
}

const char* to_string(Isa isa) {
  switch (isa) {
    case Isa::automatic: return "auto";
    case Isa::amx: return "amx";
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    case Isa::portable: return "portable";
  }
  return "unknown isa";
}

const char* to_string(Bf16Products products) {
  switch (products) {
    case Bf16Products::automatic: return "auto";
    case Bf16Products::bf16_dot: return "bf16_dot";
    case Bf16Products::fma: return "fma";
  }
  return "unknown bf16 products";
}

const char* to_string(Products products) {
  switch (products) {
    case Products::float64: return "float64";
    case Products::fma: return "fma";
    case Products::bf16_dot: return "bf16_dot";
    case Products::amx: return "amx";
  }
  return "unknown products";
}

Impl parse_impl(const std::string& name) {
  for (Impl i : {Impl::automatic, Impl::reference, Impl::naive, Impl::fused, Impl::decode})
    if (name == to_string(i)) return i;
  throw Error("fattn: impl must be one of auto, reference, naive, fused, decode; got '" + name +
              "'");
}

Isa parse_isa(const std::string& name) {
  for (Isa i : {Isa::automatic, Isa::amx, Isa::avx512, Isa::avx2, Isa::portable})
    if (name == to_string(i)) return i;
  throw Error("fattn: isa must be one of auto, amx, avx512, avx2, portable; got '" + name + "'");
}

Bf16Products parse_bf16_products(const std::string& name) {
  for (Bf16Products p : {Bf16Products::automatic, Bf16Products::bf16_dot, Bf16Products::fma})
    if (name == to_string(p)) return p;
  throw Error("fattn: bf16 products must be one of auto, bf16_dot, fma; got '" + name + "'");
}

namespace {
// The stride between a contiguous tensor's rows of head_dim values: values, or the bytes of
// a q8_0 row (its strides count bytes).
std::int64_t row_stride(std::int64_t head_dim, DType dtype) {
  return dtype == DType::q8_0 ? q8_0_row_bytes(head_dim) : head_dim;
}
}  // namespace

TensorView TensorView::bhsd(void* data, std::int64_t batch, std::int64_t heads, std::int64_t seq,
                            std::int64_t head_dim, DType dtype, Device device) {
  const std::int64_t row = row_stride(head_dim, dtype);
  return {data, 4, {batch, heads, seq, head_dim}, {heads * seq * row, seq * row, row, 1}, dtype, device};
}

TensorView TensorView::bshd(void* data, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                            std::int64_t head_dim, DType dtype, Device device) {
  const std::int64_t row = row_stride(head_dim, dtype);
  return {data, 4, {batch, heads, seq, head_dim}, {seq * heads * row, row, heads * row, 1}, dtype, device};
}

TensorView TensorView::int32_vector(std::int32_t* data, std::int64_t n, Device device) {
  return {data, 1, {n, 0, 0, 0}, {1, 0, 0, 0}, DType::int32, device};
}

TensorView TensorView::int32_matrix(std::int32_t* data, std::int64_t rows, std::int64_t cols,
                                    Device device) {
  return {data, 2, {rows, cols, 0, 0}, {cols, 1, 0, 0}, DType::int32, device};
}

TensorView TensorView::lse(float* data, std::int64_t batch, std::int64_t heads, std::int64_t seq,
                           Device device) {
  return lse(data, DType::float32, batch, heads, seq, device);
}

TensorView TensorView::lse(void* data, DType dtype, std::int64_t batch, std::int64_t heads,
                           std::int64_t seq, Device device) {
  return {data, 3, {batch, heads, seq, 0}, {heads * seq, seq, 1, 0}, dtype, device};
}

}  // namespace fattn
