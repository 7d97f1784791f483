// fattn tests — every argument check of src/model/validate.cpp and src/api/attention.cpp:
// each must throw fattn::Error whose message names the argument, the expected and
// the actual value; and a rejected call must not touch memory (the poisoned out and
// lse stay poisoned bit for bit).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include "util/checks.hpp"
#include "util/cpu_variants.hpp"
#include "util/reference.hpp"

namespace fattn_test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using L = Layout;

// The message of the fattn::Error that f throws; a test failure if it throws
// anything else or nothing.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const fattn::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a std::exception that is not fattn::Error: " << e.what();
    return "";
  } catch (...) {
    ADD_FAILURE() << "threw something that is not fattn::Error";
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

// A valid problem (B = 2, Hq = 4, Hkv = 2, Sq = 5, Sk = 7, D = 16) whose views a
// test breaks one at a time. Outputs are poisoned.
struct Args {
  static constexpr std::int64_t B = 2, Hq = 4, Hkv = 2, Sq = 5, Sk = 7, D = 16;
  Rng rng;
  Tensor q = make_input(L::bhsd, B, Hq, Sq, D, rng);
  Tensor k = make_input(L::bhsd, B, Hkv, Sk, D, rng);
  Tensor v = make_input(L::bhsd, B, Hkv, Sk, D, rng);
  Tensor out = make_output(L::bhsd, B, Hq, Sq, D);
  Tensor lse = make_lse(LseLayout::contiguous, B, Hq, Sq);
  TensorView qv = q.view(), kv = k.view(), vv = v.view(), ov = out.view(), lv = lse.view();
  bool with_lse = true;
  Options options;

  TensorView& view(const std::string& name) {
    if (name == "q") return qv;
    if (name == "k") return kv;
    if (name == "v") return vv;
    if (name == "out") return ov;
    return lv;
  }
  void forward() const {
    fattn::attention_forward(qv, kv, vv, ov, with_lse ? &lv : nullptr, options);
  }
};

// Runs the forward call expecting an Error with all of `parts` in its message, and
// checks that out and lse were not touched.
#define EXPECT_FORWARD_ERROR(setup, ...)                                            \
  do {                                                                               \
    const std::string message_ = error_of([&] { (setup).forward(); });               \
    EXPECT_THAT(message_, AllOf(HasSubstr("fattn: "), __VA_ARGS__));                 \
    EXPECT_TRUE(all_poison((setup).out)) << "out was touched by a rejected call";    \
    EXPECT_TRUE(all_poison((setup).lse)) << "lse was touched by a rejected call";    \
  } while (0)

TEST(Validation, ValidSetupRuns) {  // the baseline every other test breaks
  Args s;
  for (Impl impl : {Impl::reference, Impl::naive, Impl::fused, Impl::automatic}) {
    s.options.impl = impl;
    EXPECT_NO_THROW(s.forward());
  }
  EXPECT_NO_THROW(fattn::extra_bytes(s.qv, s.kv, s.vv, s.options));
  std::vector<double> row(Args::D);
  EXPECT_NO_THROW(fattn::reference_row(s.qv, s.kv, s.vv, s.options, 1, 3, 4, row.data()));
}

// ---- sizes -----------------------------------------------------------------------------

TEST(Validation, KBatchMismatch) {
  Args s;
  s.kv.sizes[0] = 3;
  EXPECT_FORWARD_ERROR(s, HasSubstr("k.size(0) (batch) must equal q.size(0) = 2, got 3"));
}

TEST(Validation, VBatchMismatch) {
  Args s;
  s.vv.sizes[0] = 1;
  EXPECT_FORWARD_ERROR(s, HasSubstr("v.size(0) (batch) must equal q.size(0) = 2, got 1"));
}

TEST(Validation, VHeadsMismatch) {
  Args s;
  s.vv.sizes[1] = 1;
  EXPECT_FORWARD_ERROR(s, HasSubstr("v.size(1) (kv heads) must equal k.size(1) = 2, got 1"));
}

TEST(Validation, VSequenceMismatch) {
  Args s;
  s.vv.sizes[2] = 6;
  EXPECT_FORWARD_ERROR(s, HasSubstr("v.size(2) (kv sequence) must equal k.size(2) = 7, got 6"));
}

TEST(Validation, QueryHeadsNotAMultipleOfKvHeads) {
  Args s;
  s.kv.sizes[1] = 3;
  s.vv.sizes[1] = 3;
  EXPECT_FORWARD_ERROR(s, HasSubstr("q.size(1) (query heads) must be a multiple of k.size(1) (kv heads) = 3, got 4"));
}

TEST(Validation, HeadDimOutOfRange) {
  for (std::int64_t D : {15, 257, 1, 1024}) {
    Args s;
    s.qv.sizes[3] = s.kv.sizes[3] = s.vv.sizes[3] = s.ov.sizes[3] = D;
    SCOPED_TRACE(D);
    EXPECT_FORWARD_ERROR(s, HasSubstr("q.size(3) (head dim) must be in [16, 256], got " + std::to_string(D)));
  }
}

TEST(Validation, KHeadDimMismatch) {
  Args s;
  s.kv.sizes[3] = 32;
  EXPECT_FORWARD_ERROR(s, HasSubstr("k.size(3) (head dim) must equal q.size(3) = 16, got 32"));
}

TEST(Validation, VHeadDimMismatch) {
  Args s;
  s.vv.sizes[3] = 8;
  EXPECT_FORWARD_ERROR(s, HasSubstr("v.size(3) (head dim) must equal q.size(3) = 16, got 8"));
}

TEST(Validation, OutSizeMismatch) {
  const std::int64_t q_sizes[] = {Args::B, Args::Hq, Args::Sq, Args::D};
  for (int d = 0; d < 4; ++d) {
    Args s;
    s.ov.sizes[static_cast<std::size_t>(d)] -= 1;
    SCOPED_TRACE(d);
    const std::string want = "out.size(" + std::to_string(d) + ") (as q) must equal q.size(" +
                             std::to_string(d) + ") = " + std::to_string(q_sizes[d]) + ", got " +
                             std::to_string(q_sizes[d] - 1);
    EXPECT_FORWARD_ERROR(s, HasSubstr(want));
  }
}

TEST(Validation, LseSizeMismatch) {
  const char* meaning[] = {"batch", "query heads", "query sequence"};
  const std::int64_t q_sizes[] = {Args::B, Args::Hq, Args::Sq};
  for (int d = 0; d < 3; ++d) {
    Args s;
    s.lv.sizes[static_cast<std::size_t>(d)] -= 1;
    SCOPED_TRACE(d);
    const std::string want = "lse.size(" + std::to_string(d) + ") (" + meaning[d] +
                             ") must equal q.size(" + std::to_string(d) + ") = " +
                             std::to_string(q_sizes[d]) + ", got " + std::to_string(q_sizes[d] - 1);
    EXPECT_FORWARD_ERROR(s, HasSubstr(want));
  }
}

TEST(Validation, NonPositiveSizes) {
  for (const char* name : {"q", "k", "v", "out", "lse"})
    for (int d = 0; d < (std::string(name) == "lse" ? 3 : 4); ++d)
      for (std::int64_t bad : {0, -1, -5}) {
        Args s;
        s.view(name).sizes[static_cast<std::size_t>(d)] = bad;
        SCOPED_TRACE(::testing::Message() << name << " dim " << d << " = " << bad);
        EXPECT_FORWARD_ERROR(s, HasSubstr(std::string(name) + ".size(" + std::to_string(d) +
                                          ") must be positive, got " + std::to_string(bad)));
      }
}

TEST(Validation, NegativeStrides) {
  for (const char* name : {"q", "k", "v", "out", "lse"})
    for (int d = 0; d < (std::string(name) == "lse" ? 3 : 4); ++d) {
      Args s;
      s.view(name).strides[static_cast<std::size_t>(d)] = -1;
      SCOPED_TRACE(::testing::Message() << name << " dim " << d);
      EXPECT_FORWARD_ERROR(s, HasSubstr(std::string(name) + ".stride(" + std::to_string(d) +
                                        ") must be non-negative, got -1"));
    }
}

// ---- 64-bit overflow of sizes, strides and extents --------------------------------------

TEST(Validation, SizesTimesStridesOverflow) {
  for (const char* name : {"q", "k", "v", "out", "lse"}) {
    Args s;
    TensorView& t = s.view(name);
    t.sizes[0] = std::int64_t{1} << 33;
    t.strides[0] = std::int64_t{1} << 31;  // (2^33 - 1) · 2^31 > 2^63
    SCOPED_TRACE(name);
    EXPECT_FORWARD_ERROR(s, HasSubstr(std::string(name) + ": sizes times strides overflow 64-bit offsets"));
  }
  {  // the sum of in-range reaches overflows
    Args s;
    s.qv.sizes = {2, 3, Args::Sq, Args::D};  // 2^62 + 2·2^61 = 2^63
    s.qv.strides = {std::int64_t{1} << 62, std::int64_t{1} << 61, 1, 1};
    EXPECT_FORWARD_ERROR(s, HasSubstr("q: sizes times strides overflow 64-bit offsets"));
  }
}

TEST(Validation, ProductOfSizesOverflows) {
  // Zero strides keep every offset at 0; only the element count overflows (2^66).
  Args s;
  s.kv.sizes = {Args::B, std::int64_t{1} << 25, std::int64_t{1} << 37, Args::D};
  s.kv.strides = {0, 0, 0, 0};
  EXPECT_FORWARD_ERROR(s, HasSubstr("k: the product of its sizes overflows 64 bits"));
}

TEST(Validation, ExtentInBytesOverflows) {
  // The last element offset fits in 63 bits; times 4 bytes it does not.
  Args s;
  s.vv.sizes[0] = 2;
  s.vv.strides[0] = std::int64_t{1} << 62;
  EXPECT_FORWARD_ERROR(s, HasSubstr("v: its extent in bytes overflows 64 bits"));
}

TEST(Validation, ExtentWrapsAroundTheAddressSpace) {
  Args s;
  s.ov.data = reinterpret_cast<void*>(std::numeric_limits<std::uintptr_t>::max() - 63);
  EXPECT_FORWARD_ERROR(s, HasSubstr("out: its extent wraps around the address space"));
}

// ---- pointers, aliasing, self-overlap ---------------------------------------------------

TEST(Validation, NullPointers) {
  for (const char* name : {"q", "k", "v", "out", "lse"}) {
    Args s;
    s.view(name).data = nullptr;
    SCOPED_TRACE(name);
    EXPECT_FORWARD_ERROR(s, HasSubstr(std::string(name) + " has a null data pointer"));
  }
}

TEST(Validation, OutputAliasesAnInput) {
  {  // out == q (same shape and strides)
    Args s;
    s.qv = s.ov;  // q now lives in the poisoned out buffer; out must stay untouched
    EXPECT_FORWARD_ERROR(s, HasSubstr("out must not overlap q"));
  }
  for (const char* input : {"k", "v"}) {  // out's last element is the input's first
    Args s;
    TensorView& in = s.view(input);
    in.data = static_cast<float*>(s.ov.data) + (Args::B * Args::Hq * Args::Sq * Args::D - 1);
    SCOPED_TRACE(input);
    EXPECT_FORWARD_ERROR(s, HasSubstr(std::string("out must not overlap ") + input));
  }
}

TEST(Validation, LseOverlapsAnotherTensor) {
  for (const char* other : {"q", "k", "v"}) {
    Args s;
    // lse starts at the input's last element (and runs past it: nothing is read).
    const TensorView& in = s.view(other);
    std::int64_t last = 0;
    for (std::size_t d = 0; d < 4; ++d) last += (in.sizes[d] - 1) * in.strides[d];
    s.lv.data = static_cast<float*>(in.data) + last;
    SCOPED_TRACE(other);
    EXPECT_FORWARD_ERROR(s, HasSubstr(std::string("lse must not overlap ") + other));
  }
  {  // lse inside out
    Args s;
    s.lv.data = static_cast<float*>(s.ov.data) + 7;
    EXPECT_FORWARD_ERROR(s, HasSubstr("lse must not overlap out"));
  }
}

TEST(Validation, OutputOverlapsItself) {
  {
    Args s;
    s.ov.strides[2] = 0;  // every row of a head at one address
    EXPECT_FORWARD_ERROR(s, HasSubstr("out has overlapping elements"), HasSubstr("stride(2) = 0"));
  }
  {
    Args s;
    s.ov.strides[1] = Args::D;  // heads one row apart: head h row s+1 == head h+1 row s
    EXPECT_FORWARD_ERROR(s, HasSubstr("out has overlapping elements"), HasSubstr("stride(1) = 16"),
                         HasSubstr("80 elements"));
  }
  {
    Args s;
    s.ov.strides[3] = 0;
    EXPECT_FORWARD_ERROR(s, HasSubstr("out has overlapping elements"), HasSubstr("stride(3) = 0"));
  }
  {
    Args s;
    s.lv.strides[2] = 0;
    EXPECT_FORWARD_ERROR(s, HasSubstr("lse has overlapping elements"), HasSubstr("stride(2) = 0"));
  }
}

// ---- options -----------------------------------------------------------------------------

TEST(Validation, NonFiniteScale) {
  for (double scale : {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                       std::numeric_limits<double>::quiet_NaN()}) {
    Args s;
    s.options.scale = scale;
    std::ostringstream shown;
    shown << scale;
    SCOPED_TRACE(shown.str());
    EXPECT_FORWARD_ERROR(s, HasSubstr("scale must be finite, got " + shown.str()));
  }
}

TEST(Validation, NegativeNumThreads) {
  for (int threads : {-1, -8}) {
    Args s;
    s.options.num_threads = threads;
    EXPECT_FORWARD_ERROR(s, HasSubstr("num_threads must be >= 0 (0: all cores), got " + std::to_string(threads)));
  }
}

TEST(Validation, RunnerWithoutRunFunction) {
  Args s;
  const fattn::ParallelRunner runner{};
  s.options.runner = &runner;
  EXPECT_FORWARD_ERROR(s, HasSubstr("runner.run must not be null"));
}

// ---- rank, dtype, device -------------------------------------------------------------------

TEST(Validation, WrongRank) {
  for (auto [name, rank, want] : {std::tuple{"q", 3, 4}, {"k", 2, 4}, {"v", 1, 4}, {"out", 3, 4},
                                  {"lse", 4, 3}, {"lse", 2, 3}}) {
    Args s;
    s.view(name).rank = rank;
    SCOPED_TRACE(name);
    EXPECT_FORWARD_ERROR(s, HasSubstr(std::string(name) + " must have rank " + std::to_string(want) +
                                      ", got " + std::to_string(rank)));
  }
}

TEST(Validation, WrongDtype) {
  {
    Args s;
    s.qv.dtype = fattn::DType::int32;
    EXPECT_FORWARD_ERROR(s, HasSubstr("the CPU kernels take float32, bfloat16 or float16 (float64: "
                                      "reference only), got q.dtype = int32"));
  }
  {  // a 16-bit q with float32 k: k named, with both dtypes
    Args s;
    s.qv.dtype = fattn::DType::float16;
    EXPECT_FORWARD_ERROR(s, HasSubstr("k must have dtype float16, got float32"));
  }
  for (auto [name, dtype] : {std::pair{"k", fattn::DType::bfloat16}, {"v", fattn::DType::float16},
                             {"out", fattn::DType::float16}, {"lse", fattn::DType::bfloat16}}) {
    Args s;
    s.view(name).dtype = dtype;
    SCOPED_TRACE(name);
    EXPECT_FORWARD_ERROR(s, HasSubstr(std::string(name) + " must have dtype float32, got " +
                                      fattn::to_string(dtype)));
  }
}

TEST(Validation, CudaDevice) {
  {
    Args s;
    s.qv.device = fattn::Device::cuda;
#if FATTN_TEST_WITH_CUDA
    // The CUDA backend takes the call and validates it: k is still on the cpu.
    EXPECT_FORWARD_ERROR(s, HasSubstr("k must be on cuda like q, got cpu"));
#else
    // A CPU-only build has nowhere to send a cuda tensor.
    EXPECT_FORWARD_ERROR(s, HasSubstr("q is on cuda"), HasSubstr("no CUDA backend"));
#endif
  }
  for (const char* name : {"k", "v", "out", "lse"}) {
    Args s;
    s.view(name).device = fattn::Device::cuda;
    SCOPED_TRACE(name);
    EXPECT_FORWARD_ERROR(s, HasSubstr(std::string(name) + " must be on cpu like q, got cuda"));
  }
}

TEST(Validation, UnsupportedIsa) {
  int tested = 0;
  for (Isa isa : {Isa::amx, Isa::avx512, Isa::avx2}) {
    if (fattn::cpu_supports(isa)) continue;
    for (Impl impl : {Impl::naive, Impl::fused}) {
      Args s;
      s.options.isa = isa;
      s.options.impl = impl;
      EXPECT_FORWARD_ERROR(s, HasSubstr(std::string("isa ") + fattn::to_string(isa) + " is not supported by this CPU"),
                           HasSubstr(std::string("best: ") + fattn::to_string(fattn::best_cpu_isa())));
      ++tested;
    }
  }
  if (tested == 0) GTEST_SKIP() << "this CPU supports every isa; nothing to reject";
}

// ---- names --------------------------------------------------------------------------------

TEST(Validation, UnknownNames) {
  for (const char* name : {"", "fast", "Fused", "naive ", "automatic"})
    EXPECT_THAT(error_of([&] { fattn::parse_impl(name); }),
                HasSubstr(std::string("fattn: impl must be one of auto, reference, naive, fused, decode; got '") + name + "'"));
  for (const char* name : {"", "sse", "AVX2", "avx512f", "neon"})
    EXPECT_THAT(error_of([&] { fattn::parse_isa(name); }),
                HasSubstr(std::string("fattn: isa must be one of auto, amx, avx512, avx2, portable; got '") + name + "'"));
}

// ---- reference_row and extra_bytes validate too --------------------------------------------

TEST(Validation, ReferenceRowIndexOutOfRange) {
  Args s;
  std::vector<double> row(Args::D, -7.0);
  for (auto [b, h, i] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{-1, 0, 0}, {2, 0, 0},
                         {0, -1, 0}, {0, 4, 0}, {0, 0, -1}, {0, 0, 5}, {1, 3, 1000}}) {
    const std::string want = "reference_row index (" + std::to_string(b) + ", " + std::to_string(h) + ", " +
                             std::to_string(i) + ") is outside q's (B, Hq, Sq) = (2, 4, 5)";
    EXPECT_THAT(error_of([&] { fattn::reference_row(s.qv, s.kv, s.vv, s.options, b, h, i, row.data()); }),
                HasSubstr(want));
  }
  EXPECT_THAT(error_of([&] { fattn::reference_row(s.qv, s.kv, s.vv, s.options, 0, 0, 0, nullptr); }),
              HasSubstr("reference_row out_row must not be null"));
  for (double x : row) EXPECT_EQ(x, -7.0) << "out_row was written by a rejected call";
}

TEST(Validation, ReferenceRowAndExtraBytesValidateArguments) {
  Args s;
  s.kv.sizes[0] = 3;
  std::vector<double> row(Args::D);
  const std::string want = "k.size(0) (batch) must equal q.size(0) = 2, got 3";
  EXPECT_THAT(error_of([&] { fattn::reference_row(s.qv, s.kv, s.vv, s.options, 0, 0, 0, row.data()); }),
              HasSubstr(want));
  EXPECT_THAT(error_of([&] { fattn::extra_bytes(s.qv, s.kv, s.vv, s.options); }), HasSubstr(want));
  Args t;
  t.options.scale = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(error_of([&] { fattn::extra_bytes(t.qv, t.kv, t.vv, t.options); }), HasSubstr("scale must be finite"));
  Args u;
  u.qv.device = fattn::Device::cuda;
#if FATTN_TEST_WITH_CUDA
  EXPECT_THAT(error_of([&] { fattn::extra_bytes(u.qv, u.kv, u.vv, u.options); }),
              HasSubstr("k must be on cuda like q, got cpu"));
#else
  EXPECT_THAT(error_of([&] { fattn::extra_bytes(u.qv, u.kv, u.vv, u.options); }), HasSubstr("q is on cuda"));
#endif
  // reference_row is the CPU reference in every build.
  EXPECT_THAT(error_of([&] { fattn::reference_row(u.qv, u.kv, u.vv, u.options, 0, 0, 0, row.data()); }),
              HasSubstr("q is on cuda"));
}

// The naive path's Sq×Sk score buffer size is checked for 64-bit overflow (inputs
// broadcast with zero strides are valid views of any length).
TEST(Validation, NaiveScoreBufferOverflow) {
  Args s;
  const std::int64_t huge = std::int64_t{1} << 40;
  s.qv.sizes = {1, 1, huge, Args::D};
  s.qv.strides = {0, 0, 0, 1};
  s.kv.sizes = s.vv.sizes = {1, 1, huge, Args::D};
  s.kv.strides = s.vv.strides = {0, 0, 0, 1};
  s.options.impl = Impl::naive;
  EXPECT_THAT(error_of([&] { fattn::extra_bytes(s.qv, s.kv, s.vv, s.options); }),
              HasSubstr("the naive forward's working memory for this problem would overflow 64 bits"));
}

// Working memory that cannot be allocated is reported as an Error too. Keys and values
// broadcast with zero strides over Sk = 2^40 rows of D = 256: the fused K panels
// alone would be 2^50 bytes and the naive score buffer more, beyond any 64-bit
// address space in use, so the allocation fails on every machine.
TEST(Validation, WorkingMemoryAllocationFailure) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer aborts on an impossible allocation instead of throwing bad_alloc";
#else
  for (Impl impl : {Impl::fused, Impl::naive}) {
    Rng rng;
    Tensor q = make_input(L::bhsd, 1, 1, 1, 256, rng);
    Tensor kv = make_input(L::bhsd, 1, 1, 1, 256, rng);
    Tensor out = make_output(L::bhsd, 1, 1, 1, 256);
    TensorView k = kv.view();
    k.sizes[2] = std::int64_t{1} << 40;
    k.strides = {0, 0, 0, 1};
    Options o;
    o.impl = impl;
    SCOPED_TRACE(to_string(impl));
    const std::string message = error_of([&] { fattn::attention_forward(q.view(), k, k, out.view(), nullptr, o); });
    EXPECT_THAT(message, AllOf(HasSubstr("fattn: could not allocate "),
                               HasSubstr(std::string(" bytes of working memory for the ") + to_string(impl) +
                                         " implementation")));
    EXPECT_TRUE(all_poison(out));
    const std::int64_t bytes = fattn::extra_bytes(q.view(), k, k, o);
    EXPECT_THAT(message, HasSubstr("allocate " + std::to_string(bytes) + " bytes"));
  }
#endif
}

// The fused path's working memory (K panels: B·Hkv·ceil(Sk/key_rows)·key_rows·D
// floats) must not overflow silently either. A key/value view broadcast with zero
// strides is valid for any Sk whose element count fits 64 bits; with D = 16 and
// Sk = 2^57 or 2^58 the K panels alone need 2^63 or 2^64 bytes, which extra_bytes
// cannot return: it must throw fattn::Error (as the naive path does), not return a
// wrapped value — attention_forward allocates that wrapped size and packs Sk keys
// into it.
TEST(Validation, FusedWorkspaceSizeDoesNotWrap) {
  for (Isa isa : {Isa::amx, Isa::avx512, Isa::avx2, Isa::portable}) {
    if (!fattn::cpu_supports(isa)) continue;
    for (int log2_sk : {57, 58}) {
      Args s;
      s.qv.sizes = {1, 1, 1, Args::D};
      s.kv.sizes = s.vv.sizes = {1, 1, std::int64_t{1} << log2_sk, Args::D};
      s.kv.strides = s.vv.strides = {0, 0, 0, 1};
      s.options.impl = Impl::fused;
      s.options.isa = isa;
      try {
        const std::int64_t bytes = fattn::extra_bytes(s.qv, s.kv, s.vv, s.options);
        ADD_FAILURE() << to_string(isa) << ", Sk = 2^" << log2_sk << ": extra_bytes returned " << bytes
                      << " instead of throwing fattn::Error (K panels need >= 2^" << log2_sk + 6 << " bytes)";
      } catch (const fattn::Error&) {  // reported: fine
      }
    }
  }
}

}  // namespace
}  // namespace fattn_test
