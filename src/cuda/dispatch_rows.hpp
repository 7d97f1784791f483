// fattn — the shapes of the GPU dispatch table's data (python/fattn/dispatch/table.json):
// its kernels and, per entry, its rows. cmake/dispatch.cmake writes the table itself as
// constexpr data of these types (cuda/dispatch_table.hpp, generated); dispatch_lookup.hpp
// finds a call's row. Plain C++17, no CUDA headers: the api layer and host tests read it too.
#pragma once

#include <cstdint>
#include <string_view>

namespace fattn::dispatch {

// Which engine runs a kernel: the library's CUDA C++ kernels, or the Triton kernels of the
// Python package (which the C++ API does not have).
enum class Engine : std::uint8_t { cuda_cpp, triton };

// A row's "variants": "any" call, calls with "none" of them, or with "some".
enum class VariantsRule : std::uint8_t { any, none, some };

// A row's "attn_mask": "any" call, calls without one (false), or with one (true).
enum class MaskRule : std::uint8_t { any, without, with };

// The values a row admits for one field of a call: every value ("*"), or those listed.
template <class T>
struct Choices {
  bool any = true;
  const T* items = nullptr;
  int size = 0;

  constexpr bool admits(const T& value) const {
    if (any) return true;
    for (int i = 0; i < size; ++i)
      if (items[i] == value) return true;
    return false;
  }
};

struct KernelRow {
  std::string_view name;
  Engine engine;
  std::string_view impl;  // the operator's impl name that reaches it
  bool ran_on_gpu;        // a GPU ran an earlier version of its code (table.json's gpu_run)
};

struct Row {
  Choices<std::string_view> architectures;  // "sm_<major><minor>"
  Choices<std::string_view> dtypes;         // "float16", "bfloat16", "float32"
  Choices<std::int64_t> head_dims;
  VariantsRule variants = VariantsRule::any;
  MaskRule attn_mask = MaskRule::any;
  const std::string_view* candidates = nullptr;  // kernel names, in order of preference
  int candidate_count = 0;
};

struct Entry {
  std::string_view name;
  const Row* rows = nullptr;
  int size = 0;
};

}  // namespace fattn::dispatch
