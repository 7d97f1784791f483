// fattn-api-timing: the median time of the CPU entry points on fixed shapes, through the
// public API only, so that the same source builds against another version of the library
// and the two can be alternated (scripts/ab.sh). One line per case: "name median_ms".
//
// Cases (2 threads unless --threads): prefill B = 2, H = 8, S = 1024/2048, D = 64/128, full
// and causal; decode B = 1, Hq = 32, Hkv = 8, D = 128, Sq = 1/16 against 16384 keys of a
// (B, S, H, D) cache; backward B = 2, H = 8, S = 1024, D = 64/128, full and causal; each in
// float32 and bfloat16. Inputs: seeded N(0, 1).
//
// Usage: fattn-api-timing [--filter SUBSTRING] [--isa NAME] [--threads N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "fattn/fattn.hpp"

namespace {

using fattn::Causal;
using fattn::DType;
using fattn::Impl;
using fattn::TensorView;

constexpr int kPrefillCalls = 7, kDecodeCalls = 15, kBackwardCalls = 5;

double median_ms(const std::function<void()>& call, int calls) {
  call();  // warm-up: working memory, caches
  std::vector<double> ms;
  for (int r = 0; r < calls; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// n elements of N(0, 1) in float32 or bfloat16 bits, rounded by truncation (any values do;
// fattn::to_16bit is newer than the revisions scripts/ab.sh compares against).
struct Buffer {
  std::vector<unsigned char> bytes;
  Buffer(std::size_t n, DType dtype, std::mt19937& rng) : bytes(n * (dtype == DType::float32 ? 4 : 2)) {
    std::normal_distribution<float> normal;
    for (std::size_t i = 0; i < n; ++i) {
      const float x = normal(rng);
      if (dtype == DType::float32) {
        std::memcpy(&bytes[i * 4], &x, 4);
      } else {
        std::uint32_t u;
        std::memcpy(&u, &x, 4);
        const auto top = static_cast<std::uint16_t>(u >> 16);
        std::memcpy(&bytes[i * 2], &top, 2);
      }
    }
  }
  void* data() { return bytes.data(); }
};

struct Shape {
  int B, Hq, Hkv, Sq, Sk, D;
  Causal causal;
};

enum class Pass { prefill, decode, backward };

struct Runner {
  std::string filter;
  fattn::Isa isa = fattn::Isa::automatic;
  int threads = 2;
  std::mt19937 rng{1};

  void run(const std::string& name, Pass pass, const Shape& s, DType dtype) {
    if (!filter.empty() && name.find(filter) == std::string::npos) return;
    const auto nq = static_cast<std::size_t>(s.B) * s.Hq * s.Sq * s.D;
    const auto nk = static_cast<std::size_t>(s.B) * s.Hkv * s.Sk * s.D;
    Buffer q(nq, dtype, rng), k(nk, dtype, rng), v(nk, dtype, rng), out(nq, dtype, rng),
        dout(nq, dtype, rng), dq(nq, dtype, rng), dk(nk, dtype, rng), dv(nk, dtype, rng);
    std::vector<float> lse(static_cast<std::size_t>(s.B) * s.Hq * s.Sq);
    auto rows = [&](Buffer& b, int heads, int seq) {
      return TensorView::bhsd(b.data(), s.B, heads, seq, s.D, dtype);
    };
    // The decode cache as a KV cache lies: (B, S, H, D).
    auto keys = [&](Buffer& b) {
      return pass == Pass::decode ? TensorView::bshd(b.data(), s.B, s.Sk, s.Hkv, s.D, dtype)
                                  : rows(b, s.Hkv, s.Sk);
    };
    const TensorView Q = rows(q, s.Hq, s.Sq), K = keys(k), V = keys(v), O = rows(out, s.Hq, s.Sq);
    const TensorView L = TensorView::lse(lse.data(), s.B, s.Hq, s.Sq);
    fattn::Options o;
    o.causal = s.causal;
    o.num_threads = threads;
    o.isa = isa;
    o.impl = pass == Pass::decode ? Impl::decode : Impl::fused;
    fattn::attention_forward(Q, K, V, O, &L, o);
    double ms = 0.0;
    if (pass == Pass::backward) {
      const TensorView dO = rows(dout, s.Hq, s.Sq), dQ = rows(dq, s.Hq, s.Sq),
                       dK = rows(dk, s.Hkv, s.Sk), dV = rows(dv, s.Hkv, s.Sk);
      ms = median_ms([&] { fattn::attention_backward(Q, K, V, O, dO, L, nullptr, dQ, dK, dV, o); },
                     kBackwardCalls);
    } else {
      ms = median_ms([&] { fattn::attention_forward(Q, K, V, O, &L, o); },
                     pass == Pass::decode ? kDecodeCalls : kPrefillCalls);
    }
    std::printf("%s %.4f\n", name.c_str(), ms);
    std::fflush(stdout);
  }
};

}  // namespace

int main(int argc, char** argv) try {
  Runner runner;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 < argc && arg == "--filter") runner.filter = argv[++i];
    else if (i + 1 < argc && arg == "--isa") runner.isa = fattn::parse_isa(argv[++i]);
    else if (i + 1 < argc && arg == "--threads") runner.threads = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: fattn-api-timing [--filter SUBSTRING] [--isa NAME] [--threads N]\n");
      return 2;
    }
  }
  for (const DType dtype : {DType::float32, DType::bfloat16}) {
    const std::string type = dtype == DType::float32 ? "f32" : "bf16";
    auto causal_name = [](Causal c) { return c == Causal::none ? "_full" : "_causal"; };
    for (const int S : {1024, 2048})
      for (const int D : {64, 128})
        for (const Causal c : {Causal::none, Causal::top_left})
          runner.run("prefill_" + type + "_S" + std::to_string(S) + "_D" + std::to_string(D) + causal_name(c),
                     Pass::prefill, {2, 8, 8, S, S, D, c}, dtype);
    for (const int Sq : {1, 16})
      runner.run("decode_" + type + "_Sq" + std::to_string(Sq) + "_Sk16384", Pass::decode,
                 {1, 32, 8, Sq, 16384, 128, Causal::bottom_right}, dtype);
    for (const int D : {64, 128})
      for (const Causal c : {Causal::none, Causal::top_left})
        runner.run("backward_" + type + "_S1024_D" + std::to_string(D) + causal_name(c), Pass::backward,
                   {2, 8, 8, 1024, 1024, D, c}, dtype);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fattn-api-timing: %s\n", e.what());
  return 1;
}
