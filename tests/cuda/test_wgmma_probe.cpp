// fattn CUDA tests — the wgmma probe (docs/cuda.md, "Next: a wgmma kernel", step 1):
// does src/cuda/wgmma.cuh compute a 64×64×K product right on a Hopper GPU, and which
// LBO/SBO assignment of the no-swizzle shared-memory descriptor is the right one for a
// K-major operand (A, and B as K in Q·Kᵀ) and for an N-major B (V in P·V)?
//
// Every (A variant, B variant) pair runs; the test passes when at least one pair matches
// a float64 host product, and prints the matching pairs ("[wgmma probe] ..." lines, also
// test properties in the XML report). When none matches it also says, for a few
// registers, where in the product their values belong, which tells a wrong fragment
// layout from wrong data. The RS form (A from registers, B N-major, as P·V) runs both B
// assignments with the documented A-fragment layout; when neither matches it prints
// diagnostics that tell an A-layout error from a descriptor error. Skips without a
// device of compute capability 9.0 (the probe is compiled for sm_90a only).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "util/cuda_device.hpp"
#include "wgmma_probe.hpp"

namespace fattn_cuda_test {
namespace {

namespace wp = wgmma_probe;

std::string why_no_hopper() {
  std::string why = why_no_gpu();
  if (!why.empty()) return why;
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  if (major != 9 || minor != 0) {
    std::ostringstream s;
    s << "the wgmma probe is compiled for sm_90a, which runs on compute capability 9.0 "
         "only; device 0 is "
      << major << "." << minor;
    return s.str();
  }
  return "";
}

// (row, column) of the product that register i of thread t holds, by the documented
// m64nNk16 accumulator layout (src/cuda/wgmma.cuh).
void fragment_position(int t, int i, int& row, int& col) {
  const int warp = t / 32, lane = t % 32;
  row = 16 * warp + lane / 4 + 8 * ((i / 2) % 2);
  col = 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
}

struct Problem {
  int K = 16;
  bool b_n_major = false;
  std::vector<__half> a, b;            // as passed to the device (wgmma_probe.hpp)
  std::vector<double> ref, abs_ref;    // 64×64: Σ a·b and Σ |a·b| (for the tolerance)
};

// The float64 reference of a problem whose a and b are filled in.
void compute_reference(Problem& p) {
  const int K = p.K;
  const bool b_n_major = p.b_n_major;
  auto A = [&](int m, int k) { return static_cast<double>(__half2float(p.a[m * K + k])); };
  auto B = [&](int k, int n) {
    return static_cast<double>(__half2float(b_n_major ? p.b[k * wp::kN + n] : p.b[n * K + k]));
  };
  p.ref.assign(wp::kM * wp::kN, 0.0);
  p.abs_ref.assign(wp::kM * wp::kN, 0.0);
  for (int m = 0; m < wp::kM; ++m)
    for (int n = 0; n < wp::kN; ++n)
      for (int k = 0; k < K; ++k) {
        p.ref[m * wp::kN + n] += A(m, k) * B(k, n);
        p.abs_ref[m * wp::kN + n] += std::fabs(A(m, k) * B(k, n));
      }
}

Problem make_problem(int K, bool b_n_major, std::uint64_t seed) {
  Problem p;
  p.K = K;
  p.b_n_major = b_n_major;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  p.a.resize(static_cast<std::size_t>(wp::kM * K));
  p.b.resize(static_cast<std::size_t>(wp::kN * K));
  for (auto& x : p.a) x = __float2half_rn(dist(rng));
  for (auto& x : p.b) x = __float2half_rn(dist(rng));
  compute_reference(p);
  return p;
}

// Inputs are exact in f32 and f16·f16 products are exact, so a right result differs from
// the float64 product by accumulation rounding only (≲ K·2^-24·Σ|ab|); a wrong operand
// layout is off by O(Σ|ab|). 2^-10·Σ|ab| separates the two with room to spare, even
// for an accumulator that keeps fewer than 24 bits.
constexpr double kRelTol = 1.0 / 1024.0;

// max over the product of |got − ref| / max(Σ|ab|, 1e-30); infinity for a NaN.
double worst_ratio(const Problem& p, const std::vector<float>& raw) {
  double worst = 0.0;
  for (int t = 0; t < wp::kThreads; ++t)
    for (int i = 0; i < wp::kRegs; ++i) {
      int r = 0, c = 0;
      fragment_position(t, i, r, c);
      const double got = raw[static_cast<std::size_t>(t * wp::kRegs + i)];
      if (!std::isfinite(got)) return std::numeric_limits<double>::infinity();
      const double err = std::fabs(got - p.ref[r * wp::kN + c]);
      worst = std::max(worst, err / std::max(p.abs_ref[r * wp::kN + c], 1e-30));
    }
  return worst;
}

// For a failed run: where the values of a few registers belong in the product.
std::string locate_registers(const Problem& p, const std::vector<float>& raw) {
  std::ostringstream s;
  for (int t : {0, 1, 4, 33, 64, 127})
    for (int i : {0, 1, 2, 3, 4, 31}) {
      int r = 0, c = 0;
      fragment_position(t, i, r, c);
      const double got = raw[static_cast<std::size_t>(t * wp::kRegs + i)];
      s << "\n  thread " << t << " reg " << i << " = " << got << ": layout says (" << r << ","
        << c << "), value found at";
      int found = 0;
      for (int rr = 0; rr < wp::kM && found < 3; ++rr)
        for (int cc = 0; cc < wp::kN && found < 3; ++cc)
          if (std::fabs(got - p.ref[rr * wp::kN + cc]) <= kRelTol * p.abs_ref[rr * wp::kN + cc]) {
            s << " (" << rr << "," << cc << ")";
            ++found;
          }
      if (found == 0) s << " none";
    }
  return s.str();
}

const char* variant_name(int v) { return v == wp::kLboK ? "LBO=K-adjacent" : "LBO=MN-adjacent"; }

// Runs all four (A, B) variant pairs on one problem; returns the matching pairs as
// "a<v>b<v>" words and reports them.
void probe(int K, bool b_n_major) {
  const std::string name = std::string("B_") + (b_n_major ? "N_major" : "K_major") + "_K" +
                           std::to_string(K);
  SCOPED_TRACE(name);
  const Problem p = make_problem(K, b_n_major, 0x9e3779b97f4a7c15ull ^ (K * 2 + b_n_major));
  std::ostringstream summary, matches;
  double best = std::numeric_limits<double>::infinity();
  std::vector<float> best_raw;
  for (int av = 0; av < 2; ++av)
    for (int bv = 0; bv < 2; ++bv) {
      std::vector<float> raw(static_cast<std::size_t>(wp::kThreads * wp::kRegs));
      const cudaError_t e = wp::run(p.a.data(), p.b.data(), K, b_n_major, wp::Variant(av),
                                    wp::Variant(bv), raw.data());
      ASSERT_EQ(e, cudaSuccess) << "A " << variant_name(av) << ", B " << variant_name(bv) << ": "
                                << cudaGetErrorString(e);
      const double ratio = worst_ratio(p, raw);
      summary << " (A " << av << ", B " << bv << "): max err/Σ|ab| = " << ratio << ";";
      if (ratio <= kRelTol) matches << (matches.tellp() > 0 ? " " : "") << "A" << av << "B" << bv;
      if (ratio < best) {
        best = ratio;
        best_raw = raw;
      }
    }
  const std::string matched = matches.str().empty() ? "none" : matches.str();
  std::cout << "[wgmma probe] " << name << ": matching (A, B) descriptor variants: " << matched
            << "   (variant 0: LBO = core-matrix offset along K, SBO = along M/N; 1: swapped)"
            << "\n[wgmma probe]   " << summary.str() << std::endl;
  ::testing::Test::RecordProperty("wgmma_" + name, matched);
  if (matches.str().empty())
    ADD_FAILURE() << "no descriptor variant matches the host product; best run's registers:"
                  << (best_raw.empty() ? std::string(" (none)") : locate_registers(p, best_raw));
}

// ---- the RS form: A from registers, B N-major (O += P·V) -------------------------------

// The 64×64 product as the raw registers hold it, by the accumulator layout.
std::vector<double> assemble(const std::vector<float>& raw) {
  std::vector<double> r(wp::kM * wp::kN, 0.0);
  for (int t = 0; t < wp::kThreads; ++t)
    for (int i = 0; i < wp::kRegs; ++i) {
      int row = 0, col = 0;
      fragment_position(t, i, row, col);
      r[row * wp::kN + col] = raw[static_cast<std::size_t>(t * wp::kRegs + i)];
    }
  return r;
}

// Where element (m, k) of a 64×16 slice of A sits by the documented RS A-fragment layout
// (src/cuda/wgmma.cuh): thread, register, half (0 = low 16 bits).
std::string a_fragment_holder(int m, int k) {
  const int warp = m / 16, r = m % 16, kk = k % 16;
  const int lane = 4 * (r % 8) + (kk % 8) / 2;
  const int reg = (r / 8) + 2 * (kk / 8);
  std::ostringstream s;
  s << "thread " << 32 * warp + lane << " reg " << reg << (kk % 2 ? " high" : " low")
    << (k >= 16 ? " of slice " + std::to_string(k / 16) : std::string());
  return s.str();
}

// Diagnostics for an RS run that matched nothing, to tell a wrong A-fragment layout from
// a wrong B descriptor (K = 16, both B variants):
//  - A all ones: every product row is Σ_k B(k, ·), whatever the A layout, so a match
//    says that B variant is right up to a permutation of k (the N-major SS probe,
//    NMajorB, checks the same B staging with A from shared memory);
//  - A with a single 1 at (m0, k0): the product should be zero except row m0 = B(k0, ·);
//    the lines say which rows are nonzero and which row of B each one equals. Row ≠ m0
//    points at the A rows of the layout, B row ≠ k0 at its columns (or at B's k order).
std::string rs_diagnostics() {
  constexpr int K = 16;
  std::ostringstream s;
  const Problem base = make_problem(K, true, 0x5bd1e995ull);
  auto b_at = [&](int k, int n) {
    return static_cast<double>(__half2float(base.b[k * wp::kN + n]));
  };
  std::vector<float> raw(static_cast<std::size_t>(wp::kThreads * wp::kRegs));
  for (int bv = 0; bv < 2; ++bv) {
    Problem ones = base;
    for (auto& x : ones.a) x = __float2half_rn(1.0f);
    compute_reference(ones);
    cudaError_t e = wp::run_rs(ones.a.data(), ones.b.data(), K, wp::Variant(bv), raw.data());
    s << "\n[wgmma probe]   diag B variant " << bv << ", A all ones: ";
    if (e != cudaSuccess) {
      s << cudaGetErrorString(e);
      continue;
    }
    const double ratio = worst_ratio(ones, raw);
    s << "max err/Σ|ab| = " << ratio
      << (ratio <= kRelTol ? " (match: B descriptor right up to k order)" : " (no match)");
    constexpr std::pair<int, int> kPositions[] = {{0, 0}, {1, 0}, {0, 1}, {8, 0},
                                                  {0, 8}, {21, 5}, {50, 14}};
    for (const auto& [m0, k0] : kPositions) {
      Problem one = base;
      for (auto& x : one.a) x = __float2half_rn(0.0f);
      one.a[m0 * K + k0] = __float2half_rn(1.0f);
      e = wp::run_rs(one.a.data(), one.b.data(), K, wp::Variant(bv), raw.data());
      s << "\n[wgmma probe]   diag B variant " << bv << ", A(" << m0 << "," << k0
        << ") = 1 [" << a_fragment_holder(m0, k0) << "]: ";
      if (e != cudaSuccess) {
        s << cudaGetErrorString(e);
        break;
      }
      const std::vector<double> r = assemble(raw);
      int nonzero_rows = 0;
      for (int row = 0; row < wp::kM; ++row) {
        bool nonzero = false;
        for (int c = 0; c < wp::kN; ++c) nonzero |= !(r[row * wp::kN + c] == 0.0);
        if (!nonzero) continue;
        if (++nonzero_rows > 4) continue;
        s << " row " << row << " = ";
        int same = -1;
        for (int k = 0; k < K && same < 0; ++k) {
          bool eq = true;
          for (int c = 0; c < wp::kN && eq; ++c)
            eq = std::fabs(r[row * wp::kN + c] - b_at(k, c)) <= 1e-6;
          if (eq) same = k;
        }
        if (same >= 0)
          s << "B row " << same << ";";
        else
          s << "no B row;";
      }
      if (nonzero_rows == 0) s << " all zero";
      if (nonzero_rows > 4) s << " (" << nonzero_rows << " nonzero rows in all)";
      s << "  [expected: row " << m0 << " = B row " << k0 << "]";
    }
  }
  return s.str();
}

// O += P·V with P in registers (the RS form), V N-major in shared memory: both B
// descriptor assignments; the A-fragment layout is the documented one (src/cuda/wgmma.cuh).
void probe_rs(int K) {
  const std::string name = "A_registers_B_N_major_K" + std::to_string(K);
  SCOPED_TRACE(name);
  const Problem p = make_problem(K, true, 0x2545f4914f6cdd1dull ^ K);
  std::ostringstream summary, matches;
  double best = std::numeric_limits<double>::infinity();
  std::vector<float> best_raw;
  for (int bv = 0; bv < 2; ++bv) {
    std::vector<float> raw(static_cast<std::size_t>(wp::kThreads * wp::kRegs));
    const cudaError_t e = wp::run_rs(p.a.data(), p.b.data(), K, wp::Variant(bv), raw.data());
    ASSERT_EQ(e, cudaSuccess) << "B " << variant_name(bv) << ": " << cudaGetErrorString(e);
    const double ratio = worst_ratio(p, raw);
    summary << " (B " << bv << "): max err/Σ|ab| = " << ratio << ";";
    if (ratio <= kRelTol) matches << (matches.tellp() > 0 ? " " : "") << "B" << bv;
    if (ratio < best) {
      best = ratio;
      best_raw = raw;
    }
  }
  const std::string matched = matches.str().empty() ? "none" : matches.str();
  // The diagnostics (K = 16 runs) once per test run, for the first K that matches nothing.
  static bool diagnosed = false;
  std::string diag;
  if (matches.str().empty() && !diagnosed) {
    diagnosed = true;
    diag = rs_diagnostics();
  }
  std::cout << "[wgmma probe] " << name << " (RS form, documented A-fragment layout): "
            << "matching B descriptor variants: " << matched
            << "   (variant 0: LBO = core-matrix offset along K, SBO = along N; 1: swapped)"
            << "\n[wgmma probe]   " << summary.str() << diag << std::endl;
  ::testing::Test::RecordProperty("wgmma_" + name, matched);
  if (matches.str().empty())
    ADD_FAILURE() << "no B descriptor variant matches the host product with the documented "
                     "A-fragment layout (diagnostics above); best run's registers:"
                  << (best_raw.empty() ? std::string(" (none)") : locate_registers(p, best_raw));
}

TEST(WgmmaProbe, DescriptorEncoding) {
  // Fields: address >> 4 in bits 0-13, LBO >> 4 in 16-29, SBO >> 4 in 32-45, no swizzle.
  EXPECT_EQ(wp::encode_descriptor(0x0, 128, 256), (8ull << 16) | (16ull << 32));
  EXPECT_EQ(wp::encode_descriptor(0x3FFF0, 0x3FFF0, 0x3FFF0),
            0x3FFFull | (0x3FFFull << 16) | (0x3FFFull << 32));
  EXPECT_EQ(wp::encode_descriptor(0x1230, 16, 16), 0x123ull | (1ull << 16) | (1ull << 32));
  // Bits above the 18-bit shared window and the low 4 bits are dropped.
  EXPECT_EQ(wp::encode_descriptor(0x40000 | 0x100 | 0xF, 0, 0), 0x10ull);
}

// S = Q·Kᵀ: A and B both K-major (imm-trans-b = 0). One k16 step, then K = 64 (four
// steps, the descriptors' start address advanced each time), as the attention kernel
// needs for head dim 64.
TEST(WgmmaProbe, KMajorB) {
  const std::string why = why_no_hopper();
  if (!why.empty()) GTEST_SKIP() << why;
  probe(16, false);
  probe(64, false);
}

// O += P·V with P from shared memory here: B = V stored K×N, N contiguous (imm-trans-b = 1).
TEST(WgmmaProbe, NMajorB) {
  const std::string why = why_no_hopper();
  if (!why.empty()) GTEST_SKIP() << why;
  probe(16, true);
  probe(64, true);
}

// O += P·V with P in registers: the RS form, B = V N-major (imm-trans-b = 1). K = 16,
// then K = 64 (four k16 steps, four A fragments per thread).
TEST(WgmmaProbe, ARegistersNMajorB) {
  const std::string why = why_no_hopper();
  if (!why.empty()) GTEST_SKIP() << why;
  probe_rs(16);
  probe_rs(64);
}

// The attention kernel's own staging and descriptors (core_tile.cuh), as fused_wgmma.cuh
// uses them at head dim 64: Q·Kᵀ in the SS form, P·V in the RS form. No variants: this
// is what the kernel runs, so a failure here and a match above point at core_tile.cuh.
TEST(WgmmaProbe, KernelLayout) {
  const std::string why = why_no_hopper();
  if (!why.empty()) GTEST_SKIP() << why;
  for (bool n_major : {false, true}) {
    const std::string name = n_major ? "kernel_layout_PV" : "kernel_layout_QK";
    SCOPED_TRACE(name);
    const Problem p = make_problem(64, n_major, 0x7f4a7c15ull + n_major);
    std::vector<float> raw(static_cast<std::size_t>(wp::kThreads * wp::kRegs));
    const cudaError_t e = wp::run_kernel_layout(p.a.data(), p.b.data(), n_major, raw.data());
    ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
    const double ratio = worst_ratio(p, raw);
    std::cout << "[wgmma probe] " << name << ": max err/Σ|ab| = " << ratio
              << (ratio <= kRelTol ? " (match)" : " (NO MATCH)") << std::endl;
    ::testing::Test::RecordProperty("wgmma_" + name, ratio <= kRelTol ? "match" : "no match");
    EXPECT_LE(ratio, kRelTol) << "registers:" << locate_registers(p, raw);
  }
}

}  // namespace
}  // namespace fattn_cuda_test
