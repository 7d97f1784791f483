// fattn CUDA tests — the TMA probe (docs/cuda.md, "The TMA kernel"): does each assumption the
// fused_tma kernel makes about Hopper's copy engine, its mbarrier and wgmma on 128-byte
// swizzled tiles hold on the GPU, and if not, which one fails?
//
//   Load*      a tensor map from the kernel's own encoder (cuTensorMapEncodeTiled through the
//              runtime's driver entry point), boxes of 64 columns × 128 rows copied with the
//              128-byte swizzle under one mbarrier, two phases: the wait completes within a
//              second (expect-tx = the full box, also when part of it lies past the tensor),
//              test_wait says phase parity 0 then 1 completed, and every shared-memory slot
//              holds the element the swizzle model (tma_probe.hpp) puts there — zero past the
//              sequence and the head dim. Values are element indices, so a wrong slot says
//              which element it holds instead, and the alternative swizzle widths are scored.
//   QkSS       S = Q·Kᵀ as the kernel issues it (SS wgmma, both operands swizzled K-major,
//              D = 64 and 128: slices inside a 128-byte row, then the next panel).
//   PvRS       O = P·V as the kernel issues it (RS wgmma, V swizzled MN-major, LBO between
//              the 64-column panels).
// Each product is checked against a float64 host product (max err ≤ 2^-10·Σ|ab|). On a
// mismatch the test prints the first wrong element and where its value belongs, checks the
// operands' shared memory against the copy engine's model, scores every (swizzle width,
// LBO/SBO order) reading of the same shared memory on the host, and reruns the GPU with
// other descriptor fields — which tells a wrong layout-type field, swapped offsets or a
// wrong copy from each other. It always reports whether the base-offset field (bits 49-51)
// matters for the kernel's 1024-aligned tiles. "[tma probe]" lines; XML properties tma_*.
// Skips without a device of compute capability 9.0 (sm_90a code).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tma_probe.hpp"
#include "util/cuda_device.hpp"

namespace fattn_cuda_test {
namespace {

namespace tp = tma_probe;

std::string why_no_hopper() {
  std::string why = why_no_gpu();
  if (!why.empty()) return why;
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  if (major != 9 || minor != 0) {
    std::ostringstream s;
    s << "the TMA probe is compiled for sm_90a, which runs on compute capability 9.0 only; "
         "device 0 is "
      << major << "." << minor;
    return s.str();
  }
  return "";
}

void report(const std::string& key, const std::string& line) {
  std::cout << "[tma probe] " << line << std::endl;
  ::testing::Test::RecordProperty("tma_" + key, line);
}

// ---- 1. loads --------------------------------------------------------------------------------
// Element index i <-> a 16-bit value that is never 0 (0 = zero fill) nor a NaN/Inf pattern.
std::uint16_t encode_index(std::int64_t i) {
  const std::int64_t v = i + 1;
  return static_cast<std::uint16_t>(v < 0x7C00 ? v : v + 0x400);
}
std::int64_t decode_value(std::uint16_t v) {  // -1: zero; -2: no element
  if (v == 0) return -1;
  if (v < 0x7C00) return v - 1;
  if (v >= 0x8000 && v < 0xFC00) return v - 1 - 0x400;
  return -2;
}
constexpr std::uint16_t kPadding = 0xFFFF;  // row padding in memory: never to be read

std::string describe(const tp::LoadSetup& s, std::int64_t index) {
  if (index == -1) return "zero (fill)";
  if (index == -2) return "no element (padding or unwritten shared memory)";
  const int c = static_cast<int>(index % s.head_dim);
  std::int64_t rest = index / s.head_dim;
  const int seq = static_cast<int>(rest % s.seq);
  rest /= s.seq;
  std::ostringstream o;
  o << "element (b " << rest / s.heads << ", h " << rest % s.heads << ", s " << seq << ", d " << c << ")";
  return o.str();
}

// The shared memory a box should hold under swizzle model `sw`, as element indices (-1: zero).
std::vector<std::int64_t> expected_box(const tp::LoadSetup& s, int phase, tp::Swizzle sw) {
  const auto [s0, h, b] = s.box[phase];
  std::vector<std::int64_t> want(s.box_bytes() / 2, -2);
  for (int r = 0; r < tp::kBoxRows; ++r)
    for (int c = 0; c < 64 * s.panels; ++c) {
      const bool inside = s0 + r < s.seq && c < s.head_dim;
      want[tp::panel_offset(tp::kBoxRows, r, c, sw) / 2] =
          inside ? ((std::int64_t(b) * s.heads + h) * s.seq + s0 + r) * s.head_dim + c : -1;
    }
  return want;
}

void probe_load(const std::string& name, const tp::LoadSetup& s) {
  SCOPED_TRACE(name);
  std::vector<std::uint16_t> tensor(static_cast<std::size_t>(s.elements()), kPadding);
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h)
      for (int q = 0; q < s.seq; ++q)
        for (int c = 0; c < s.head_dim; ++c)
          tensor[static_cast<std::size_t>(b * s.batch_stride() + h * s.head_stride() + q * s.seq_stride() + c)] =
              encode_index(((std::int64_t(b) * s.heads + h) * s.seq + q) * s.head_dim + c);
  tp::LoadResult r;
  const cudaError_t e = tp::run_load(s, tensor, r);
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
  ASSERT_EQ(r.encode_status, 0) << "cuTensorMapEncodeTiled (through cudaGetDriverEntryPointByVersion) "
                                   "returned CUresult " << r.encode_status << " for this geometry";
  bool ok = true;
  std::ostringstream line;
  line << name << ":";
  for (int ph = 0; ph < 2; ++ph) {
    const tp::BarrierPhase& b = r.phase[ph];
    const bool barrier_ok = b.completed && b.test_same && !b.test_other;
    line << " phase " << ph << " (wait parity " << ph << ", expect-tx " << s.box_bytes() << " B): "
         << (b.completed ? "completed" : "NOT completed within ~1 s") << " after " << b.polls
         << " polls, test_wait(parity " << ph << ") = " << b.test_same << " (expected 1), test_wait(parity "
         << (ph ^ 1) << ") = " << b.test_other << " (expected 0), barrier word 0x" << std::hex
         << b.raw_before << " -> 0x" << b.raw_after << std::dec << ";";
    ok &= barrier_ok;
    if (!b.completed) {
      ADD_FAILURE() << "phase " << ph << " never completed: the bytes that landed differ from "
                       "expect-tx (" << s.box_bytes() << " B: boxes past the tensor should still "
                       "count in full), or the copy faulted";
      break;
    }
    if (!barrier_ok) ADD_FAILURE() << "mbarrier phase " << ph << ": parity not as expected (see line)";
    const std::vector<std::uint16_t>& got = r.smem[ph];
    int best = -1;
    std::size_t best_count = 0;
    std::ostringstream scores;
    for (int sw = 0; sw < 4; ++sw) {
      const std::vector<std::int64_t> want = expected_box(s, ph, tp::Swizzle(sw));
      std::size_t same = 0;
      for (std::size_t i = 0; i < want.size(); ++i) same += decode_value(got[i]) == want[i];
      scores << " " << tp::kSwizzleNames[sw] << " " << same << "/" << want.size();
      if (same > best_count) best_count = same, best = sw;
    }
    const std::vector<std::int64_t> want = expected_box(s, ph, tp::Swizzle::b128);
    std::size_t first = want.size();
    for (std::size_t i = 0; i < want.size() && first == want.size(); ++i)
      if (decode_value(got[i]) != want[i]) first = i;
    line << " layout slots matching each swizzle model:" << scores.str() << ";";
    if (first != want.size()) {
      ok = false;
      const std::size_t byte = first * 2;
      const int panel = static_cast<int>(byte / (tp::kBoxRows * 128)), row = static_cast<int>(byte % (tp::kBoxRows * 128) / 128);
      ADD_FAILURE() << "phase " << ph << ": first wrong slot: byte " << byte << " (panel " << panel << ", row "
                    << row << ", stored chunk " << (byte % 128) / 16 << ", element " << (byte % 16) / 2
                    << ") should hold " << describe(s, want[first]) << " (128B swizzle model), holds "
                    << describe(s, decode_value(got[first])) << "; best model: "
                    << (best >= 0 ? tp::kSwizzleNames[best] : "none");
    }
  }
  line << (ok ? " OK" : " FAILED");
  report(name, line.str());
}

TEST(TmaProbe, LoadSwizzled128) {
  const std::string why = why_no_hopper();
  if (!why.empty()) GTEST_SKIP() << why;
  // D = 128 (two copies per box) in BSHD (the head stride below the sequence stride); phase 0
  // a whole box, phase 1 one reaching 56 rows past the sequence (zero-filled, full expect-tx).
  tp::LoadSetup a;
  a.batch = 1, a.heads = 2, a.seq = 200, a.head_dim = 128, a.row = 128, a.bshd = true, a.panels = 2;
  a.box[0] = {0, 1, 0};
  a.box[1] = {128, 0, 0};
  probe_load("load_D128_bshd", a);
  // D = 64 in BHSD, second batch.
  tp::LoadSetup b;
  b.batch = 2, b.heads = 2, b.seq = 200, b.head_dim = 64, b.row = 64, b.panels = 1;
  b.box[0] = {50, 1, 1};
  b.box[1] = {100, 0, 1};
  probe_load("load_D64_bhsd", b);
  // head dim 40 (80-byte rows) read by the D = 64 kernel: columns 40-63 zero-filled.
  tp::LoadSetup c;
  c.batch = 2, c.heads = 2, c.seq = 150, c.head_dim = 40, c.row = 40, c.panels = 1;
  c.box[0] = {0, 1, 1};
  c.box[1] = {100, 1, 0};
  probe_load("load_D40_in_64", c);
}

// ---- 2. wgmma on swizzled tiles ----------------------------------------------------------------
constexpr double kRelTol = 1.0 / 1024.0;  // as the wgmma probe: rounding vs a wrong layout

void fragment_position(int t, int i, int& row, int& col) {
  const int warp = t / 32, lane = t % 32;
  row = 16 * warp + lane / 4 + 8 * ((i / 2) % 2);
  col = 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
}

std::vector<__half> random_matrix(int rows, int cols, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<__half> m(static_cast<std::size_t>(rows) * cols);
  for (auto& x : m) x = __float2half_rn(dist(rng));
  return m;
}
double h(const __half& x) { return static_cast<double>(__half2float(x)); }
double h16(std::uint16_t bits) {
  __half_raw r;
  r.x = bits;
  return static_cast<double>(__half2float(__half(r)));
}

// A 64×N product: ref, Σ|ab|, and how raw registers compare to it.
struct Product {
  int n = 0;
  std::vector<double> ref, abs;
};
std::vector<double> assemble(const std::vector<float>& raw, int n) {
  std::vector<double> out(static_cast<std::size_t>(64 * n), std::numeric_limits<double>::quiet_NaN());
  const int regs = n / 2;
  for (int t = 0; t < tp::kThreads; ++t)
    for (int i = 0; i < regs; ++i) {
      int r = 0, c = 0;
      fragment_position(t, i, r, c);
      out[static_cast<std::size_t>(r * n + c)] = raw[static_cast<std::size_t>(t * regs + i)];
    }
  return out;
}
double worst(const Product& p, const std::vector<double>& got) {
  double w = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    w = std::max(w, std::fabs(got[i] - p.ref[i]) / std::max(p.abs[i], 1e-30));
  }
  return w;
}
std::string first_mismatch(const Product& p, const std::vector<double>& got) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isfinite(got[i]) && std::fabs(got[i] - p.ref[i]) <= kRelTol * p.abs[i]) continue;
    std::ostringstream s;
    s << "first wrong element (" << i / p.n << "," << i % p.n << "): got " << got[i] << ", want " << p.ref[i]
      << "; that value belongs at";
    int found = 0;
    for (std::size_t j = 0; j < p.ref.size() && found < 3; ++j)
      if (std::fabs(got[i] - p.ref[j]) <= kRelTol * p.abs[j]) s << " (" << j / p.n << "," << j % p.n << ")", ++found;
    if (!found) s << " no element of the product";
    return s.str();
  }
  return "no wrong element";
}

// The (swizzle width, offsets) readings of shared memory the host scores on a mismatch.
struct Reading {
  tp::Swizzle sw;
  bool swapped;  // LBO and SBO exchanged
};
std::vector<Reading> readings() {
  std::vector<Reading> r;
  for (int sw = 0; sw < 4; ++sw)
    for (bool swapped : {false, true}) r.push_back({tp::Swizzle(sw), swapped});
  return r;
}
std::string reading_name(const Reading& r) {
  return std::string(tp::kSwizzleNames[static_cast<int>(r.sw)]) + (r.swapped ? " LBO<->SBO" : "");
}
// A shared-memory value at byte address a (NaN outside the dump).
double at(const std::vector<std::uint16_t>& smem, std::uint32_t a) {
  return a / 2 < smem.size() ? h16(smem[a / 2]) : std::numeric_limits<double>::quiet_NaN();
}

// Whether a dump holds the row-major rows × D matrix m in the kernel's swizzled panels.
std::string check_dump(const std::vector<std::uint16_t>& smem, const std::vector<__half>& m, int rows, int D) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < D; ++c) {
      const std::uint32_t a = tp::panel_offset(rows, r, c);
      if (at(smem, a) != h(m[static_cast<std::size_t>(r * D + c)])) {
        std::ostringstream s;
        s << "NOT as the copy engine's 128B model (first: (" << r << "," << c << ") at byte " << a << ")";
        return s.str();
      }
    }
  return "as the copy engine's 128B model";
}

void probe_qk(int D, int keys = tp::kKeys) {
  const std::string name = "qk_SS_D" + std::to_string(D) + (keys == tp::kKeys ? "" : "_N" + std::to_string(keys));
  SCOPED_TRACE(name);
  const std::vector<__half> a = random_matrix(tp::kARows, D, 11 + D), b = random_matrix(keys, D, 13 + D);
  Product p;
  p.n = keys;
  p.ref.assign(64 * p.n, 0.0);
  p.abs.assign(64 * p.n, 0.0);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < p.n; ++n)
      for (int k = 0; k < D; ++k) {
        const double x = h(a[m * D + k]) * h(b[n * D + k]);
        p.ref[m * p.n + n] += x;
        p.abs[m * p.n + n] += std::fabs(x);
      }
  auto run = [&](const tp::DescFields& f, tp::WgmmaResult& r) {
    const cudaError_t e = tp::run_qk(a, b, D, f, r, keys);
    EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
    EXPECT_EQ(r.encode_status, 0) << "cuTensorMapEncodeTiled returned CUresult " << r.encode_status;
    EXPECT_TRUE(r.loaded) << "the operands' mbarrier phase did not complete";
    return e == cudaSuccess && r.encode_status == 0 && r.loaded ? worst(p, assemble(r.raw, p.n))
                                                                : std::numeric_limits<double>::infinity();
  };
  tp::WgmmaResult r;
  const double ratio = run({}, r);
  std::ostringstream line;
  line << name << " (kernel's descriptors: 128B, LBO 16, SBO 1024): max err/Σ|ab| = " << ratio
       << (ratio <= kRelTol ? " (match)" : " (NO MATCH)");
  // The base-offset field on 1024-aligned tiles: ignored (both match) or not.
  for (int base : {0, 7}) {
    tp::WgmmaResult rb;
    const double rr = run({false, 1, 16, 1024, base}, rb);
    line << "; base offset " << base << ": " << (rr <= kRelTol ? "match" : "no match");
  }
  if (ratio > kRelTol && !r.raw.empty()) {
    const std::vector<double> got = assemble(r.raw, p.n);
    line << "\n[tma probe]   " << first_mismatch(p, got) << "\n[tma probe]   shared memory: A "
         << check_dump(r.smem_a, a, tp::kARows, D) << ", B " << check_dump(r.smem_b, b, keys, D)
         << "\n[tma probe]   host readings of that shared memory, max err/Σ|ab|:";
    for (const Reading& rd : readings()) {
      const std::uint32_t lbo = rd.swapped ? 1024 : 16, sbo = rd.swapped ? 16 : 1024;
      std::vector<double> sim(64 * p.n, 0.0);
      for (int m = 0; m < 64; ++m)
        for (int n = 0; n < p.n; ++n) {
          double acc = 0.0;
          for (int k = 0; k < D; ++k) {
            const int kk = k / 16, kin = k % 16;
            acc += at(r.smem_a, tp::wgmma_read_address(false, tp::k_slice_start(tp::kARows, kk), m, kin, rd.sw, lbo, sbo)) *
                   at(r.smem_b, tp::wgmma_read_address(false, tp::k_slice_start(keys, kk), n, kin, rd.sw, lbo, sbo));
          }
          sim[m * p.n + n] = acc;
        }
      double w = 0.0;
      for (std::size_t i = 0; i < sim.size(); ++i)
        w = std::max(w, std::isfinite(sim[i]) && std::isfinite(got[i])
                            ? std::fabs(sim[i] - got[i]) / std::max(p.abs[i], 1e-30)
                            : std::numeric_limits<double>::infinity());
      line << " " << reading_name(rd) << " " << w << (w <= kRelTol ? " (THE GPU READ THIS)" : "") << ";";
    }
    line << "\n[tma probe]   GPU reruns with other descriptor fields (layout type, LBO, SBO):";
    for (const tp::DescFields& f : {tp::DescFields{false, 1, 16, 1024, 0}, tp::DescFields{false, 1, 1024, 16, 0},
                                    tp::DescFields{false, 2, 16, 1024, 0}, tp::DescFields{false, 3, 16, 1024, 0},
                                    tp::DescFields{false, 0, 128, 1024, 0}}) {
      tp::WgmmaResult rv;
      const double rr = run(f, rv);
      line << " (" << f.layout << ", " << f.lbo << ", " << f.sbo << "): " << rr << (rr <= kRelTol ? " match" : "") << ";";
    }
  }
  report(name, line.str());
  EXPECT_LE(ratio, kRelTol) << "the kernel's Q·Kᵀ on swizzled tiles does not match (diagnostics above)";
}

void probe_pv(int D, int keys = tp::kKeys) {
  const std::string name = "pv_RS_D" + std::to_string(D) + (keys == tp::kKeys ? "" : "_K" + std::to_string(keys));
  SCOPED_TRACE(name);
  const std::vector<__half> pm = random_matrix(64, keys, 17 + D), v = random_matrix(keys, D, 19 + D);
  Product p;
  p.n = D;
  p.ref.assign(64 * D, 0.0);
  p.abs.assign(64 * D, 0.0);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < D; ++n)
      for (int k = 0; k < keys; ++k) {
        const double x = h(pm[m * keys + k]) * h(v[k * D + n]);
        p.ref[m * D + n] += x;
        p.abs[m * D + n] += std::fabs(x);
      }
  auto run = [&](const tp::DescFields& f, tp::WgmmaResult& r) {
    const cudaError_t e = tp::run_pv(pm, v, D, f, r, keys);
    EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
    EXPECT_EQ(r.encode_status, 0) << "cuTensorMapEncodeTiled returned CUresult " << r.encode_status;
    EXPECT_TRUE(r.loaded) << "V's mbarrier phase did not complete";
    return e == cudaSuccess && r.encode_status == 0 && r.loaded ? worst(p, assemble(r.raw, p.n))
                                                                : std::numeric_limits<double>::infinity();
  };
  const std::uint32_t panel = keys * 128;  // LBO: the next 64 columns of V
  tp::WgmmaResult r;
  const double ratio = run({}, r);
  std::ostringstream line;
  line << name << " (kernel's descriptors: 128B, LBO " << panel << ", SBO 1024): max err/Σ|ab| = " << ratio
       << (ratio <= kRelTol ? " (match)" : " (NO MATCH)");
  for (int base : {0, 7}) {
    tp::WgmmaResult rb;
    const double rr = run({false, 1, panel, 1024, base}, rb);
    line << "; base offset " << base << ": " << (rr <= kRelTol ? "match" : "no match");
  }
  if (ratio > kRelTol && !r.raw.empty()) {
    const std::vector<double> got = assemble(r.raw, p.n);
    line << "\n[tma probe]   " << first_mismatch(p, got) << "\n[tma probe]   shared memory: V "
         << check_dump(r.smem_b, v, keys, D) << "\n[tma probe]   host readings of that shared memory, max err/Σ|ab|:";
    for (const Reading& rd : readings()) {
      const std::uint32_t lbo = rd.swapped ? 1024 : panel, sbo = rd.swapped ? panel : 1024;
      double w = 0.0;
      for (int m = 0; m < 64; ++m)
        for (int n = 0; n < D; ++n) {
          double acc = 0.0;
          for (int k = 0; k < keys; ++k)
            acc += h(pm[m * keys + k]) *
                   at(r.smem_b, tp::wgmma_read_address(true, tp::mn_slice_start(k / 16), n, k % 16, rd.sw, lbo, sbo));
          const std::size_t i = static_cast<std::size_t>(m * D + n);
          w = std::max(w, std::isfinite(acc) && std::isfinite(got[i])
                              ? std::fabs(acc - got[i]) / std::max(p.abs[i], 1e-30)
                              : std::numeric_limits<double>::infinity());
        }
      line << " " << reading_name(rd) << " " << w << (w <= kRelTol ? " (THE GPU READ THIS)" : "") << ";";
    }
    line << "\n[tma probe]   GPU reruns with other descriptor fields (layout type, LBO, SBO):";
    for (const tp::DescFields& f : {tp::DescFields{false, 1, panel, 1024, 0}, tp::DescFields{false, 1, 1024, panel, 0},
                                    tp::DescFields{false, 2, panel, 1024, 0}, tp::DescFields{false, 3, panel, 1024, 0}}) {
      tp::WgmmaResult rv;
      const double rr = run(f, rv);
      line << " (" << f.layout << ", " << f.lbo << ", " << f.sbo << "): " << rr << (rr <= kRelTol ? " match" : "") << ";";
    }
  }
  report(name, line.str());
  EXPECT_LE(ratio, kRelTol) << "the kernel's P·V on the swizzled V does not match (diagnostics above)";
}

TEST(TmaProbe, DescriptorFields) {
  // Address >> 4 in bits 0-13, LBO >> 4 in 16-29, SBO >> 4 in 32-45, base offset 49-51,
  // layout type 62-63 (1: 128-byte swizzle).
  EXPECT_EQ(tp::encode_descriptor(0x400, 16, 1024, 0, 1), 0x40ull | (1ull << 16) | (64ull << 32) | (1ull << 62));
  EXPECT_EQ(tp::encode_descriptor(0, 16384, 1024, 7, 3), (1024ull << 16) | (64ull << 32) | (7ull << 49) | (3ull << 62));
  // The models: every 1024-byte group of a panel is a permutation of its 16-byte chunks.
  for (int rows : {64, 128}) {
    std::vector<int> seen(static_cast<std::size_t>(rows * 128 * 2 / 16), 0);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < 128; c += 8) ++seen[tp::panel_offset(rows, r, c) / 16];
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; })) << rows;
  }
  EXPECT_EQ(tp::panel_offset(128, 1, 0), 128u + 16u);
  EXPECT_EQ(tp::wgmma_read_address(true, tp::mn_slice_start(1), 64, 9, tp::Swizzle::b128, 16384, 1024),
            tp::panel_offset(128, 25, 64));
}

TEST(TmaProbe, QkSS) {
  const std::string why = why_no_hopper();
  if (!why.empty()) GTEST_SKIP() << why;
  probe_qk(64);
  probe_qk(128);
  probe_qk(64, 64);  // the Hopper backward's 64-row B tiles (Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, S and dP)
  probe_qk(128, 64);
}

TEST(TmaProbe, PvRS) {
  const std::string why = why_no_hopper();
  if (!why.empty()) GTEST_SKIP() << why;
  probe_pv(64);
  probe_pv(128);
  probe_pv(64, 64);  // the Hopper backward's MN-major B of 64-row panels (dV, dK, dQ: LBO 8 KB)
  probe_pv(128, 64);
}

}  // namespace
}  // namespace fattn_cuda_test
