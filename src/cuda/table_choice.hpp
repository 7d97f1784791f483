// fattn — the GPU dispatch table's choice for a call, as the C++ side makes it: the first
// candidate of the call's row that takes it (python/fattn/dispatch/table.json, read through
// the generated cuda/dispatch_table.hpp): Impl::automatic's forward kernel, and the torch
// KV-cache operator's kernel.
#pragma once

#include <functional>
#include <string>

#include "cuda/backend.hpp"
#include "cuda/device.hpp"
#include "cuda/refusal.hpp"
#include "fattn/cuda_refusal.hpp"
#include "fattn/kv_cache.hpp"

namespace fattn::cuda {

// The compute capability of the current CUDA device; {0, 0} where there is none (the CUDA
// error cleared), which no kernel runs on.
ComputeCapability current_capability();

// The first candidate of the table's row for `call` that takes it, by name: a C++ kernel
// where `refusal_of` answers "" for it, a Triton kernel where `triton_runs` (the caller can run
// it), among those `admitted` admits (all without it); "" where the call matches no row or no
// candidate takes it.
std::string first_candidate(const CudaCall& call, bool triton_runs,
                            const std::function<std::string(TableKernel)>& refusal_of,
                            const std::function<bool(const std::string&)>& admitted = {});

// The forward family Impl::automatic runs for `call` on a device of compute capability
// (call.major, call.minor): the first C++ candidate of its row that takes it (refusal.hpp;
// the C++ library has no Triton) and that a GPU run verified on that architecture
// (verified.hpp); where none is verified, the first that takes it and that a GPU has run at
// all (table.json's gpu_run), else the first that takes it (with verified.hpp's warning, or
// its Error under FATTN_REQUIRE_VERIFIED); else kernel_for(Impl::automatic, ...), whose plan
// then says why it does not take the call.
Kernel automatic_kernel_for(const CudaCall& call);

// fattn::cuda_kvcache_kernel (fattn/cuda_refusal.hpp) on the current device: first_candidate
// of the "kvcache" row, the decode kernel asked through decode_refusal (its views too).
// Defined in kvcache.cpp, beside the decode kernel's plan: only a program that runs the KV
// cache links that code.
std::string kvcache_kernel(const TensorView& q, const KvCache& cache, const TensorView* k_new,
                           const TensorView* v_new, const Options& options);

}  // namespace fattn::cuda
