// fattn — the verified C++ kernels (verified.hpp).
#include "cuda/verified.hpp"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <utility>

#include "fattn/attention.hpp"

namespace fattn::cuda {
namespace {

struct BuiltRecord {
  const char* kernel;
  const char* architecture;
};

// The build's list (generated; empty where the build found no cuobjdump), and a last entry
// so that an empty list still compiles.
constexpr BuiltRecord kBuilt[] = {
#include "cuda/verified_kernels.inc"
    {nullptr, nullptr}};

constexpr char kSeparator = '@';

struct State {
  std::mutex mutex;
  std::set<std::string> verified;  // "kernel@architecture"
  std::set<std::string> warned;
  bool host_decides = false;  // the host set the list: it warns (or refuses) itself
  State() { restore(); }
  void restore() {
    verified.clear();
    for (const BuiltRecord& r : kBuilt)
      if (r.kernel) verified.insert(std::string(r.kernel) + kSeparator + r.architecture);
    host_decides = false;
  }
};

State& state() {
  static State instance;
  return instance;
}

std::string key(std::string_view kernel, std::string_view architecture) {
  return std::string(kernel) + kSeparator + std::string(architecture);
}

bool required() {
  const char* value = std::getenv("FATTN_REQUIRE_VERIFIED");
  return value && *value && std::string_view(value) != "0";
}

}  // namespace

bool verified(std::string_view kernel, std::string_view architecture) {
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  return s.verified.count(key(kernel, architecture)) != 0;
}

std::vector<std::string> verified_kernels() {
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  return {s.verified.begin(), s.verified.end()};
}

void set_verified_kernels(const std::vector<std::string>& kernel_at_architecture) {
  for (const std::string& k : kernel_at_architecture)
    if (k.find(kSeparator) == std::string::npos)
      throw Error("set_cuda_verified_kernels: each entry must be kernel@architecture (e.g. "
                  "fused_mma@sm_90), got '" + k + "'");
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  s.verified = {kernel_at_architecture.begin(), kernel_at_architecture.end()};
  s.host_decides = true;
}

void restore_build_verified_kernels() {
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  s.restore();
}

void unverified_default(std::string_view kernel, std::string_view architecture,
                        std::string_view entry) {
  const std::string message = "fattn: " + std::string(kernel) + " runs this " +
                              std::string(entry) + " call on " + std::string(architecture) +
                              ", but no GPU run verified its current machine code there; run "
                              "`python -m fattn.selftest` on this GPU to verify it";
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  if (s.host_decides) return;
  if (required()) throw Error(message + " (FATTN_REQUIRE_VERIFIED is set)");
  if (s.warned.insert(key(kernel, architecture)).second)
    std::fprintf(stderr, "%s\n", message.c_str());
}

}  // namespace fattn::cuda
