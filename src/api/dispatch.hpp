// fattn — from a validated problem to the CPU kernel that runs it (api/attention.cpp), shared by the
// entry points (api/attention.cpp, kv_cache.cpp).
#pragma once

#include <cstdint>

#include "model/parallel.hpp"
#include "model/problem.hpp"
#include "cpu/kernels.hpp"

namespace fattn::detail {

// The CPU kernels for a forward problem under these options (an ISA the CPU lacks is an Error).
const cpu::Kernels& forward_kernels(const Options& options, const Problem& p);

// How a forward problem runs on these kernels, as ForwardPlan says it: the products and why
// (bfloat16 on avx512), and the decode kernel's plan where impl is decode.
ForwardPlan cpu_forward_plan(const cpu::Kernels& kernels, const Problem& p, Impl impl,
                             const Options& options);

// Runs a validated ragged forward problem (attention_varlen) under these options.
void ragged_forward(const Problem& p, const Exec& exec, const Options& options);

// Runs a validated ragged backward problem (attention_varlen_backward).
void ragged_backward(const Problem& p, const Exec& exec, const Options& options);

// A cuda q in a build without the CUDA backend is an Error saying so; nothing otherwise.
void expect_cuda_backend(const TensorView& q);

// Floats of the decode kernel's working memory (an overflow is an Error).
std::int64_t decode_workspace_floats(const cpu::Kernels& kernels, const Problem& p,
                                     const Exec& exec, const Options& options);

}  // namespace fattn::detail
