// fattn tests — seeds. Every test draws fresh random data from a seed derived from a
// name (a CPU test's full gtest name, a CUDA case's name), so a failure reproduces
// exactly and no two tests share their data.
//
// FATTN_TEST_SEED perturbs every seed (it is XORed into each one). It is read the way C's
// strtoull reads with base 0: decimal ("12345"), hexadecimal after 0x ("0x3039"), octal
// after a leading 0 ("030071"). A decimal seed must therefore not start with 0. Unset,
// or text that does not start with a number, leaves every seed as it is.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>

namespace fattn_test {

// strtoull's base 0: the prefix of the text picks decimal, hexadecimal or octal.
constexpr int kSeedTextBase = 0;

// What FATTN_TEST_SEED adds to every seed (0 when it is unset).
inline std::uint64_t seed_perturbation() {
  const char* text = std::getenv("FATTN_TEST_SEED");
  return text ? std::strtoull(text, nullptr, kSeedTextBase) : 0;
}

// The seed of everything drawn under `name`: its 64-bit FNV-1a hash, perturbed.
inline std::uint64_t seed_for(std::string_view name) {
  constexpr std::uint64_t kFnvOffsetBasis = 1469598103934665603ull;
  constexpr std::uint64_t kFnvPrime = 1099511628211ull;
  std::uint64_t hash = kFnvOffsetBasis;
  for (const char c : name) hash = (hash ^ static_cast<unsigned char>(c)) * kFnvPrime;
  return hash ^ seed_perturbation();
}

// "Suite.Test" of the running test ("none" outside a test).
inline std::string current_test_name() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return info ? std::string(info->test_suite_name()) + "." + info->name() : std::string("none");
}

// The seed of the running test.
inline std::uint64_t test_seed() { return seed_for(current_test_name()); }

class Rng {
 public:
  Rng() : Rng(test_seed()) {}
  explicit Rng(std::uint64_t seed) : engine_(seed) {}
  float normal() { return normal_(engine_); }
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(engine_); }
  std::int64_t index(std::int64_t n) {  // uniform in [0, n)
    return std::uniform_int_distribution<std::int64_t>(0, n - 1)(engine_);
  }
  std::mt19937_64& engine() { return engine_; }

 private:
  std::mt19937_64 engine_;
  std::normal_distribution<float> normal_{0.0f, 1.0f};
};

}  // namespace fattn_test
