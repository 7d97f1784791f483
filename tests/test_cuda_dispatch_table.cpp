// fattn — the GPU dispatch table on the C++ side, without a GPU: the header cmake/dispatch.cmake
// generates from python/fattn/dispatch/table.json, fattn::cuda_refusal's answers for a compute
// capability, and the forward kernel Impl::automatic takes from the table for one.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "cuda/dispatch_lookup.hpp"
#include "fattn/cuda_refusal.hpp"

#if FATTN_TEST_WITH_CUDA
#include <cstdlib>

#include "cuda/backend.hpp"
#include "cuda/table_choice.hpp"
#include "cuda/verified.hpp"
#endif

namespace {

using ::testing::HasSubstr;
using fattn::CudaCall;
using fattn::DType;
namespace dispatch = fattn::dispatch;

constexpr int kHopper[2] = {9, 0};
constexpr int kAmpere[2] = {8, 0};

CudaCall call_on(const int (&capability)[2], const char* entry, DType dtype, std::int64_t head_dim) {
  CudaCall call;
  call.entry = entry;
  call.dtype = dtype;
  call.head_dim = head_dim;
  call.major = capability[0];
  call.minor = capability[1];
  return call;
}

std::string table_text() {
  std::ifstream file(FATTN_TEST_DISPATCH_TABLE);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

int occurrences(const std::string& text, const std::string& word) {
  int n = 0;
  for (auto at = text.find(word); at != std::string::npos; at = text.find(word, at + word.size())) ++n;
  return n;
}

std::vector<std::string_view> candidates(const dispatch::Row& row) {
  return {row.candidates, row.candidates + row.candidate_count};
}

const dispatch::Entry& entry(std::string_view name) {
  const dispatch::Entry* found = dispatch::entry_named(name);
  EXPECT_NE(found, nullptr) << name;
  return *found;
}

// Every row and kernel of the JSON is in the header: one row per "candidates" list, one kernel
// per "engine", each under its own name.
TEST(DispatchTable, GeneratedHeaderHasTheJsonsRowsAndKernels) {
  const std::string json = table_text();
  ASSERT_FALSE(json.empty()) << FATTN_TEST_DISPATCH_TABLE;
  int rows = 0;
  for (const dispatch::Entry& e : dispatch::kEntries) {
    rows += e.size;
    EXPECT_THAT(json, HasSubstr("\"" + std::string(e.name) + "\": ["));
  }
  // The rows that need dropout or seqused_k are the Python dispatch's alone (the C++ kernels
  // take neither): every other row is in the header.
  EXPECT_EQ(rows + occurrences(json, "\"needs\""), occurrences(json, "\"candidates\""));
  EXPECT_EQ(static_cast<int>(std::size(dispatch::kKernels)), occurrences(json, "\"engine\""));
  int never_ran = 0;
  for (const dispatch::KernelRow& k : dispatch::kKernels) {
    EXPECT_THAT(json, HasSubstr("\"" + std::string(k.name) + "\": {")) << k.name;
    never_ran += !k.ran_on_gpu;
    const char* engine = k.engine == dispatch::Engine::cuda_cpp ? "cuda_cpp" : "triton";
    EXPECT_THAT(json, HasSubstr("\"engine\": \"" + std::string(engine) + "\", \"impl\": \"" +
                                std::string(k.impl) + "\""))
        << k.name;
  }
  EXPECT_EQ(never_ran, occurrences(json, "\"gpu_run\": null"));
  EXPECT_FALSE(dispatch::kernel_named("backward_tma")->ran_on_gpu);
  EXPECT_TRUE(dispatch::kernel_named("fused_tma")->ran_on_gpu);
}

TEST(DispatchTable, RowsReadAsWritten) {
  const dispatch::Entry& forward = entry("forward");
  ASSERT_GE(forward.size, 2);
  const dispatch::Row& masked = forward.rows[0];
  EXPECT_TRUE(masked.architectures.any && masked.dtypes.any && masked.head_dims.any);
  EXPECT_EQ(masked.attn_mask, dispatch::MaskRule::with);
  EXPECT_EQ(masked.variants, dispatch::VariantsRule::any);
  EXPECT_THAT(candidates(masked), ::testing::ElementsAre("triton_forward"));
  const dispatch::Row& tma = forward.rows[1];
  EXPECT_TRUE(tma.architectures.admits("sm_90"));
  EXPECT_FALSE(tma.architectures.admits("sm_80"));
  EXPECT_TRUE(tma.dtypes.admits("bfloat16"));
  EXPECT_FALSE(tma.dtypes.admits("float32"));
  EXPECT_TRUE(tma.head_dims.admits(128));
  EXPECT_FALSE(tma.head_dims.admits(64));
  EXPECT_EQ(tma.variants, dispatch::VariantsRule::none);
  EXPECT_EQ(tma.attn_mask, dispatch::MaskRule::without);
  EXPECT_THAT(candidates(tma), ::testing::ElementsAre("fused_tma", "triton_forward", "fused_mma"));
  const dispatch::Entry& backward = entry("backward");
  EXPECT_EQ(backward.rows[backward.size - 1].attn_mask, dispatch::MaskRule::any);
  for (const dispatch::Entry& e : dispatch::kEntries)
    for (int r = 0; r < e.size; ++r)
      for (std::string_view name : candidates(e.rows[r]))
        EXPECT_NE(dispatch::kernel_named(name), nullptr) << e.name << " row " << r << ": " << name;
}

TEST(DispatchTable, ACallsRowIsTheFirstThatAdmitsIt) {
  const dispatch::Row* rows = entry("forward").rows;
  CudaCall call = call_on(kHopper, "forward", DType::float16, 128);
  EXPECT_EQ(dispatch::row_for(call), &rows[1]);
  call.softcap = true;
  EXPECT_EQ(dispatch::row_for(call), &rows[2]);
  call.attn_mask = true;
  EXPECT_EQ(dispatch::row_for(call), &rows[0]);
  const CudaCall ampere = call_on(kAmpere, "forward", DType::bfloat16, 128);
  EXPECT_THAT(candidates(*dispatch::row_for(ampere)),
              ::testing::ElementsAre("triton_forward", "fused_mma"));
  const CudaCall float32 = call_on(kHopper, "forward", DType::float32, 128);
  EXPECT_THAT(candidates(*dispatch::row_for(float32)),
              ::testing::ElementsAre("triton_forward", "fused_tf32", "fused_tf32x3"));
  const CudaCall kvcache32 = call_on(kAmpere, "kvcache", DType::float32, 128);
  EXPECT_THAT(candidates(*dispatch::row_for(kvcache32)), ::testing::ElementsAre("triton_kvcache"));
  EXPECT_THROW(dispatch::row_for(call_on(kHopper, "prefill", DType::float16, 128)), fattn::Error);
}

#if !FATTN_TEST_WITH_CUDA

TEST(CudaRefusal, WithoutTheCudaBackendEveryKernelIsRefused) {
  const CudaCall call = call_on(kHopper, "forward", DType::float16, 128);
  for (const dispatch::KernelRow& k : dispatch::kKernels) {
    if (k.engine == dispatch::Engine::cuda_cpp) {
      EXPECT_EQ(fattn::cuda_refusal(std::string(k.name), call),
                "this build of fattn has no CUDA backend (rebuild with -DFATTN_CUDA=ON)");
    }
  }
}

#else

TEST(CudaRefusal, NamesOutsideTheTablesCppKernelsAreErrors) {
  const CudaCall call = call_on(kHopper, "forward", DType::float16, 128);
  EXPECT_THROW(fattn::cuda_refusal("fused_nothing", call), fattn::Error);
  EXPECT_THROW(fattn::cuda_refusal("triton_forward", call), fattn::Error);
  EXPECT_THROW(fattn::cuda_refusal("fused_mma", call_on(kHopper, "prefill", DType::float16, 128)),
               fattn::Error);
  for (const dispatch::KernelRow& k : dispatch::kKernels) {
    if (k.engine == dispatch::Engine::cuda_cpp) {
      EXPECT_NO_THROW(fattn::cuda_refusal(std::string(k.name), call)) << k.name;
    }
  }
}

using fattn::cuda::Kernel;

bool built_at(const std::vector<int>& dims, int dim) {
  return std::find(dims.begin(), dims.end(), dim) != dims.end();
}

TEST(CudaRefusal, HopperTmaForward) {
  if (!built_at(fattn::cuda::tma_head_dims(), 128)) GTEST_SKIP() << "this build has no fused_tma at D = 128";
  CudaCall call = call_on(kHopper, "forward", DType::float16, 128);
  EXPECT_EQ(fattn::cuda_refusal("fused_tma", call), "");
  EXPECT_THAT(fattn::cuda_refusal("fused_tma_variants", call), HasSubstr("none of them"));
  EXPECT_THAT(fattn::cuda_refusal("fused_tma", call_on(kAmpere, "forward", DType::float16, 128)),
              HasSubstr("runs on compute capability 9.0 (Hopper) only, got 8.0"));
  EXPECT_THAT(fattn::cuda_refusal("fused_tma", call_on(kHopper, "forward", DType::float32, 128)),
              HasSubstr("takes float16 or bfloat16, got float32"));
  EXPECT_THAT(fattn::cuda_refusal("fused_tma", call_on(kHopper, "kvcache", DType::float16, 128)),
              HasSubstr("forward entry, got kvcache"));
  call.window_right = 16;  // the band's upper edge alone: the plain instantiation runs it
  EXPECT_EQ(fattn::cuda_refusal("fused_tma", call), "");
  EXPECT_THAT(fattn::cuda_refusal("fused_tma_variants", call), HasSubstr("none of them"));
  call.window_left = 32;
  EXPECT_THAT(fattn::cuda_refusal("fused_tma", call),
              HasSubstr("left window (window_left) (fused_tma_variants takes them)"));
  EXPECT_EQ(fattn::cuda_refusal("fused_tma_variants", call), "");
  call.attn_mask = true;
  EXPECT_THAT(fattn::cuda_refusal("fused_tma_variants", call), HasSubstr("takes no attn_mask"));
}

TEST(CudaRefusal, MmaSyncForwards) {
  CudaCall call = call_on(kAmpere, "forward", DType::bfloat16, 128);
  EXPECT_EQ(fattn::cuda_refusal("fused_mma", call), "");
  EXPECT_EQ(fattn::cuda_refusal("fused_mma", call_on(kHopper, "forward", DType::bfloat16, 128)), "");
  EXPECT_THAT(fattn::cuda_refusal("fused_mma", call_on({7, 5}, "forward", DType::bfloat16, 128)),
              HasSubstr("compute capability 8.0 or newer (cp.async, bf16 and tf32 mma.sync), got 7.5"));
  call.window_right = 16;  // the band's upper edge: every kernel takes it
  EXPECT_EQ(fattn::cuda_refusal("fused_mma", call), "");
  call.softcap = true;
  EXPECT_THAT(fattn::cuda_refusal("fused_mma", call), HasSubstr("the fused_mma CUDA kernel takes no softcap"));
  EXPECT_THAT(fattn::cuda_refusal("fused_mma", call_on(kAmpere, "forward", DType::float32, 128)),
              HasSubstr("the fused_mma CUDA kernel takes float16 or bfloat16, got float32"));
  CudaCall float32 = call_on(kAmpere, "forward", DType::float32, 64);
  EXPECT_EQ(fattn::cuda_refusal("fused_tf32x3", float32), "");
  EXPECT_THAT(fattn::cuda_refusal("fused_tf32", float32), HasSubstr("needs allow_tf32 = true, got false"));
  float32.allow_tf32 = true;
  EXPECT_EQ(fattn::cuda_refusal("fused_tf32", float32), "");
  EXPECT_EQ(fattn::cuda_refusal("fused_tf32x3", float32), "");
  EXPECT_THAT(fattn::cuda_refusal("fused_tf32x3", call_on(kAmpere, "forward", DType::float16, 64)),
              HasSubstr("takes float32, got float16"));
}

TEST(CudaRefusal, Decode) {
  CudaCall call = call_on(kAmpere, "kvcache", DType::float16, 128);
  call.window_left = 256;
  call.sinks = true;  // every variant
  EXPECT_EQ(fattn::cuda_refusal("decode", call), "");
  EXPECT_EQ(fattn::cuda_refusal("decode", call_on(kHopper, "kvcache", DType::bfloat16, 72)), "");
  EXPECT_THAT(fattn::cuda_refusal("decode", call_on(kAmpere, "kvcache", DType::float32, 128)),
              HasSubstr("the CUDA decode kernel takes float16 or bfloat16, got float32"));
  EXPECT_THAT(fattn::cuda_refusal("decode", call_on(kAmpere, "kvcache", DType::float16, 100)),
              HasSubstr("head dim 100: the CUDA decode kernel takes multiples of 8"));
  EXPECT_THAT(fattn::cuda_refusal("decode", call_on(kAmpere, "forward", DType::float16, 128)),
              HasSubstr("decode runs the dispatch table's kvcache entry, got forward"));
  EXPECT_THAT(fattn::cuda_refusal("decode", call_on({7, 5}, "kvcache", DType::float16, 128)),
              HasSubstr("got 7.5"));
}

TEST(CudaRefusal, HopperBackward) {
  if (fattn::cuda::backward_head_dims().empty()) {
    EXPECT_THAT(fattn::cuda_refusal("backward_tma", call_on(kHopper, "backward", DType::float16, 64)),
                HasSubstr("this build has no Hopper backward"));
    return;
  }
  CudaCall call = call_on(kHopper, "backward", DType::float16, 128);
  call.window_left = 64;
  call.alibi = true;
  EXPECT_EQ(fattn::cuda_refusal("backward_tma", call), "");
  EXPECT_THAT(fattn::cuda_refusal("backward_tma", call_on(kHopper, "backward", DType::float32, 128)),
              HasSubstr("the Hopper backward takes float16 or bfloat16, got float32"));
  call.attn_mask = true;
  EXPECT_THAT(fattn::cuda_refusal("backward_tma", call), HasSubstr("the Hopper backward takes no attn_mask"));
  EXPECT_THAT(fattn::cuda_refusal("backward_tma", call_on(kHopper, "backward", DType::bfloat16, 256)),
              HasSubstr("head dims up to 128, got 256"));
  EXPECT_THAT(fattn::cuda_refusal("backward_tma", call_on(kAmpere, "backward", DType::bfloat16, 64)),
              HasSubstr("runs on compute capability 9.0 (sm_90a), got 8.0"));
}

// Impl::automatic's forward: the table's first C++ candidate that takes the call, else
// kernel_for's (whose plan then says why it does not take the call).
// The verified list for one test, the build's restored after it.
class VerifiedList {
 public:
  explicit VerifiedList(const std::vector<std::string>& kernels) {
    fattn::set_cuda_verified_kernels(kernels);
  }
  ~VerifiedList() { fattn::cuda::restore_build_verified_kernels(); }
};

TEST(AutomaticKernel, TakesTheTablesFirstCppCandidate) {
  using fattn::cuda::automatic_kernel_for;
  const VerifiedList none({});  // nothing verified: the table's order alone
  const auto tma_at = [](int dim) {
    return built_at(fattn::cuda::tma_head_dims(), dim) ? Kernel::fused_tma : Kernel::fused_mma;
  };
  for (int dim : {64, 128}) {
    EXPECT_EQ(automatic_kernel_for(call_on(kHopper, "forward", DType::float16, dim)), tma_at(dim)) << dim;
    CudaCall variants = call_on(kHopper, "forward", DType::bfloat16, dim);
    variants.window_left = 128;
    variants.softcap = true;
    EXPECT_EQ(automatic_kernel_for(variants), tma_at(dim)) << dim;
    EXPECT_EQ(fattn::cuda::tma_measured_head_dim(dim), tma_at(dim) == Kernel::fused_tma) << dim;
  }
  for (int dim : {32, 96, 256}) {
    EXPECT_EQ(automatic_kernel_for(call_on(kHopper, "forward", DType::float16, dim)), Kernel::fused_mma) << dim;
    EXPECT_FALSE(fattn::cuda::tma_measured_head_dim(dim)) << dim;
  }
  EXPECT_EQ(automatic_kernel_for(call_on(kAmpere, "forward", DType::float16, 128)), Kernel::fused_mma);
  CudaCall float32 = call_on(kHopper, "forward", DType::float32, 128);
  EXPECT_EQ(automatic_kernel_for(float32), Kernel::fused_tf32x3);
  float32.allow_tf32 = true;
  EXPECT_EQ(automatic_kernel_for(float32), Kernel::fused_tf32);
  // Nothing takes it: kernel_for's choice, refused later by its plan, naming the reason.
  CudaCall masked = call_on(kHopper, "forward", DType::float16, 128);
  masked.attn_mask = true;
  EXPECT_EQ(automatic_kernel_for(masked), Kernel::fused_mma);
  EXPECT_EQ(automatic_kernel_for(call_on({0, 0}, "forward", DType::float16, 128)), Kernel::fused_mma);
}

TEST(AutomaticKernel, TakesTheFirstVerifiedCandidate) {
  using fattn::cuda::automatic_kernel_for;
  if (!built_at(fattn::cuda::tma_head_dims(), 128)) GTEST_SKIP() << "this build has no fused_tma at D = 128";
  const CudaCall call = call_on(kHopper, "forward", DType::bfloat16, 128);
  {
    const VerifiedList list({"fused_mma@sm_90"});
    EXPECT_EQ(automatic_kernel_for(call), Kernel::fused_mma);  // fused_tma unverified: skipped
  }
  {
    const VerifiedList list({"fused_mma@sm_90", "fused_tma@sm_90"});
    EXPECT_EQ(automatic_kernel_for(call), Kernel::fused_tma);
  }
  {
    const VerifiedList list({"fused_tma@sm_80"});  // another architecture verifies nothing here
    EXPECT_EQ(automatic_kernel_for(call), Kernel::fused_tma);  // none verified: the first
    EXPECT_EQ(automatic_kernel_for(call_on(kAmpere, "forward", DType::bfloat16, 128)),
              Kernel::fused_mma);
  }
  EXPECT_THROW(fattn::set_cuda_verified_kernels({"fused_mma"}), fattn::Error);
}

TEST(AutomaticKernel, UnverifiedIsAnErrorWhereRequired) {
  // The build's list (no host took the warning over): a kernel it does not verify is an Error
  // under FATTN_REQUIRE_VERIFIED=1, and runs (with a warning) without it.
  fattn::cuda::restore_build_verified_kernels();
  CudaCall call = call_on(kHopper, "forward", DType::bfloat16, 128);
  call.window_left = 64;  // fused_tma_variants: no GPU run has verified it
  if (!built_at(fattn::cuda::tma_head_dims(), 128)) GTEST_SKIP() << "this build has no fused_tma at D = 128";
  ASSERT_FALSE(fattn::cuda::verified("fused_tma_variants", "sm_90"));
  EXPECT_EQ(fattn::cuda::automatic_kernel_for(call), Kernel::fused_tma);
  setenv("FATTN_REQUIRE_VERIFIED", "1", 1);
  EXPECT_THROW(
      {
        try {
          fattn::cuda::automatic_kernel_for(call);
        } catch (const fattn::Error& e) {
          EXPECT_THAT(e.what(), HasSubstr("python -m fattn.selftest"));
          throw;
        }
      },
      fattn::Error);
  unsetenv("FATTN_REQUIRE_VERIFIED");
}

TEST(CudaVerified, TheBuildsListNamesTheTablesCppKernels) {
  fattn::cuda::restore_build_verified_kernels();
  for (const std::string& entry : fattn::cuda_verified_kernels()) {
    const std::size_t at = entry.find('@');
    ASSERT_NE(at, std::string::npos) << entry;
    const dispatch::KernelRow* kernel = dispatch::kernel_named(entry.substr(0, at));
    ASSERT_NE(kernel, nullptr) << entry;
    EXPECT_EQ(kernel->engine, dispatch::Engine::cuda_cpp) << entry;
  }
}

#endif

}  // namespace
