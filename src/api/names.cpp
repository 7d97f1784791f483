// fattn — names of the enumerations, and the tensor-view constructors.
#include <cstddef>
#include <string>

#include "fattn/attention.hpp"
#include "fattn/tensor.hpp"

namespace fattn {

namespace {

// One table per enumeration: its values and their names, for to_string and the parsers
// (whose errors list the names from here).
template <class E>
struct Named {
  E value;
  const char* name;
};

constexpr Named<DType> kDTypes[] = {
    {DType::float32, "float32"}, {DType::float16, "float16"}, {DType::bfloat16, "bfloat16"},
    {DType::float64, "float64"}, {DType::int32, "int32"},     {DType::boolean, "bool"},
    {DType::q8_0, "q8_0"}};
constexpr Named<Device> kDevices[] = {{Device::cpu, "cpu"}, {Device::cuda, "cuda"}};
constexpr Named<Causal> kCausals[] = {
    {Causal::none, "none"}, {Causal::top_left, "top_left"}, {Causal::bottom_right, "bottom_right"}};
constexpr Named<Impl> kImpls[] = {{Impl::automatic, "auto"}, {Impl::reference, "reference"},
                                  {Impl::naive, "naive"},    {Impl::fused, "fused"},
                                  {Impl::decode, "decode"}};
constexpr Named<Isa> kIsas[] = {{Isa::automatic, "auto"}, {Isa::amx, "amx"},
                                {Isa::avx512, "avx512"},  {Isa::avx2, "avx2"},
                                {Isa::portable, "portable"}};
constexpr Named<Bf16Products> kBf16Products[] = {{Bf16Products::automatic, "auto"},
                                                 {Bf16Products::bf16_dot, "bf16_dot"},
                                                 {Bf16Products::fma, "fma"}};
constexpr Named<Products> kProducts[] = {{Products::float64, "float64"},
                                         {Products::fma, "fma"},
                                         {Products::bf16_dot, "bf16_dot"},
                                         {Products::amx, "amx"}};

template <class E, std::size_t N>
const char* name_in(const Named<E> (&table)[N], E value, const char* unknown) {
  for (const Named<E>& n : table)
    if (n.value == value) return n.name;
  return unknown;
}

// The value named `name`, or an Error naming the argument (`what`) and every name it takes.
template <class E, std::size_t N>
E parse_in(const Named<E> (&table)[N], const std::string& name, const char* what) {
  for (const Named<E>& n : table)
    if (name == n.name) return n.value;
  std::string names;
  for (const Named<E>& n : table) names += (names.empty() ? "" : ", ") + std::string(n.name);
  throw Error("fattn: " + std::string(what) + " must be one of " + names + "; got '" + name + "'");
}

}  // namespace

const char* to_string(DType dtype) { return name_in(kDTypes, dtype, "unknown dtype"); }
const char* to_string(Device device) { return name_in(kDevices, device, "unknown device"); }
const char* to_string(Causal causal) { return name_in(kCausals, causal, "unknown causal"); }
const char* to_string(Impl impl) { return name_in(kImpls, impl, "unknown impl"); }
const char* to_string(Isa isa) { return name_in(kIsas, isa, "unknown isa"); }
const char* to_string(Bf16Products products) {
  return name_in(kBf16Products, products, "unknown bf16 products");
}
const char* to_string(Products products) {
  return name_in(kProducts, products, "unknown products");
}

Impl parse_impl(const std::string& name) { return parse_in(kImpls, name, "impl"); }
Isa parse_isa(const std::string& name) { return parse_in(kIsas, name, "isa"); }
Bf16Products parse_bf16_products(const std::string& name) {
  return parse_in(kBf16Products, name, "bf16 products");
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
