// fattn — the Python dispatch's word on a KV-cache call on CUDA tensors. The C++ operator
// (kv_ops.cpp) knows which candidates of the dispatch table take a call; which of them is
// the default also depends on the verification records (python/fattn/dispatch: the first
// candidate whose current machine code a GPU run verified), which Python reads. The operator
// asks Python once per kind of call and remembers the answer, so a decode step still costs the
// host a lookup, not a Python call.
#pragma once

#include <cstdint>
#include <string>

#include <pybind11/pybind11.h>

namespace fattn_torch {

// What the Python dispatch's choice depends on.
struct KvcacheKind {
  int major = 0, minor = 0;  // the device's compute capability
  std::string dtype;         // "float16", "bfloat16", "float32"
  std::int64_t head_dim = 0;
  bool left_window = false, right_window = false, softcap = false, alibi = false, sinks = false;
};

// The kernel of table.json the Python dispatch runs for this kind of call (it may warn once,
// or raise under FATTN_REQUIRE_VERIFIED); "" where no planner is registered (the operator's own
// choice stands).
std::string planned_kvcache_kernel(const KvcacheKind& kind);

// Binds _C.set_kvcache_planner(fn) and _C.forget_kvcache_plans() (after new records).
void bind_kvcache_planner(pybind11::module_& m);

}  // namespace fattn_torch
