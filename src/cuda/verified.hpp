// fattn — which C++ kernels' current machine code a GPU run verified, per architecture: the
// build's list (cmake/dispatch.cmake hashes this build's SASS against
// python/fattn/dispatch/verified.json: cuda/verified_kernels.inc), or the host program's
// (fattn::set_cuda_verified_kernels: the Python package adds the user's own records from
// python -m fattn.selftest). Impl::automatic takes the first verified candidate of the
// dispatch table's row (table_choice.hpp).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace fattn::cuda {

// Whether `kernel` (a table.json name) is verified on `architecture` ("sm_90").
bool verified(std::string_view kernel, std::string_view architecture);

// The verified list, as "kernel@architecture". Setting it replaces the build's, and hands
// the warning to the host (the Python package warns, or refuses, before it calls).
std::vector<std::string> verified_kernels();
void set_verified_kernels(const std::vector<std::string>& kernel_at_architecture);

// Back to the build's list, the warning the library's again (tests).
void restore_build_verified_kernels();

// Once per process and kernel, on stderr, where Impl::automatic runs a kernel no GPU run
// verified on this architecture; an Error instead under FATTN_REQUIRE_VERIFIED=1; nothing
// where the host set the list.
void unverified_default(std::string_view kernel, std::string_view architecture,
                        std::string_view entry);

}  // namespace fattn::cuda
