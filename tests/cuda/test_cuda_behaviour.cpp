// fattn CUDA tests — behaviour beyond accuracy: fully masked rows, NaN propagation,
// streams and graph capture (3 launches for naive), determinism, working memory,
// and the CUDA path's error messages.
#include <gmock/gmock.h>

#include <functional>

#include "cuda/kernels.hpp"
#include "util/cuda_case.hpp"

namespace fattn_cuda_test {
namespace {

using ::testing::HasSubstr;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const fattn::Error& e) {
    return e.what();
  }
  return "(no fattn::Error thrown)";
}

// A case's random inputs and poisoned outputs, on the host and on the device.
DeviceCase upload_case(const Case& c) { return to_device(make_case_tensors(c)); }

// ---- semantics --------------------------------------------------------------------------

// bottom_right with Sq > Sk: the first Sq - Sk queries see no key: exactly 0 and -inf.
TEST(CudaBehaviour, FullyMaskedRowsAreZeroWithLseMinusInf) {
  FATTN_REQUIRE_GPU();
  for (auto [dtype, kernel, tile_rows] : kernels_here()) {
    Case c;
    c.dtype = dtype;
    c.kernel = kernel;
    c.tile_rows = tile_rows;
    c.Sq = 100;
    c.Sk = 5;
    c.causal = Causal::bottom_right;
    SCOPED_TRACE(c.name());
    DeviceCase t = upload_case(c);
    Options options;
    options.causal = c.causal;
    fattn::cuda::forward_with(t.q.view, t.k.view, t.v.view, t.out.view, &t.lse.view, options, kernel,
                              tile_rows);
    CUDA_OK(cudaDeviceSynchronize());
    t.download();
    for (int h = 0; h < c.Hq; ++h)
      for (int i = 0; i < c.Sq; ++i) {
        const bool masked = i < c.Sq - c.Sk;
        if (masked) {
          EXPECT_EQ(t.host.lse.get(0, h, i), -std::numeric_limits<float>::infinity()) << "row " << i;
          for (int d = 0; d < c.D; ++d) ASSERT_EQ(t.host.out.get(0, h, i, d), 0.0f) << "row " << i;
        } else {
          EXPECT_TRUE(std::isfinite(t.host.lse.get(0, h, i))) << "row " << i;
        }
      }
  }
}

// A NaN input reaches exactly the rows whose scores or values it enters (as on the
// CPU: tests/test_robustness.cpp), never a row that does not see its key.
TEST(CudaBehaviour, NaNPropagates) {
  FATTN_REQUIRE_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (auto [dtype, kernel, tile_rows] : kernels_here()) {
    Case c;
    c.dtype = dtype;
    c.kernel = kernel;
    c.tile_rows = tile_rows;
    // the persistent kernels in one block, walking every tile: the slow path's scratch (a
    // tile's last K stage) while the next tile's loads are under way
    if (kernel == Kernel::fused_tma_persistent || kernel == Kernel::fused_tma_pingpong) c.blocks = 1;
    c.Sq = c.Sk = 70;
    SCOPED_TRACE(c.name());
    run_case(c, [&](Tensor& q, Tensor&, Tensor&) { q.set(0, 1, 3, 0, nan); });  // one row
    run_case(c, [&](Tensor&, Tensor& k, Tensor&) { k.set(0, 0, 0, 5, nan); });  // every row
    c.causal = Causal::top_left;  // key 69 is seen by query 69 only: the mask must hide it
    run_case(c, [&](Tensor&, Tensor& k, Tensor&) { k.set(0, 0, 69, 1, nan); });
    // A value at key 37 reaches rows >= 37 only, also on the diagonal tile where the
    // tensor-core P·V would add 0·NaN to rows 0..36 (and 0·inf for an infinity).
    run_case(c, [&](Tensor&, Tensor&, Tensor& v) { v.set(0, 0, 37, 20, nan); });
    run_case(c, [&](Tensor&, Tensor&, Tensor& v) { v.set(0, 0, 37, 3, inf); });
    // bottom_right, Sk = Sq + 200: key 210 is seen by rows >= 10, and its tile is not the
    // last one a block reads (the wgmma kernels' slow path inside the pipelined loop).
    c.causal = Causal::bottom_right;
    c.Sq = 100;
    c.Sk = 300;
    run_case(c, [&](Tensor&, Tensor&, Tensor& v) { v.set(0, 0, 210, 5, nan); });
    // bottom_right, Sq > Sk: rows that see no key are 0 whatever the values hold.
    c.Sq = 70;
    c.Sk = 4;
    run_case(c, [&](Tensor&, Tensor&, Tensor& v) { v.set(0, 0, 0, 7, nan); });
    if (!fattn::cuda::takes_variants(kernel)) continue;
    // The variants: a NaN score stays NaN through the softcap; a value below the band's
    // lower edge reaches only the rows whose window holds its key (rows 10-30 of key 10 with
    // window_left = 20), also where a block loads its tile for other keys (rows 128-255
    // start at key 108: tile 0 of 128 keys, key 10 hidden from every one of them).
    c.causal = Causal::none;
    c.Sq = c.Sk = 70;
    c.softcap = 5.0;
    run_case(c, [&](Tensor&, Tensor& k, Tensor&) { k.set(0, 0, 0, 5, nan); });
    c.softcap = 0.0;
    c.causal = Causal::bottom_right;
    c.Sq = c.Sk = 300;
    c.window_left = 20;
    run_case(c, [&](Tensor&, Tensor&, Tensor& v) { v.set(0, 0, 10, 5, nan); });
    run_case(c, [&](Tensor&, Tensor&, Tensor& v) { v.set(0, 0, 10, 9, inf); });
  }
}

// Logits of magnitude ~1e4 (as tests/test_robustness.cpp does on the CPU): every row
// must subtract its running max (no overflow), and O(1) differences between logits
// of ~1e4 must survive. Tolerance: run_case's rule (the plain pipeline computes its
// logits in float32 from the same inputs) plus the CPU suite's 64·2^-24·max|logit|.
TEST(CudaBehaviour, HugeLogits) {
  FATTN_REQUIRE_GPU();
  for (auto [dtype, kernel, tile_rows] : kernels_here())
    for (Causal causal : {Causal::none, Causal::bottom_right}) {
      Case c;
      c.dtype = dtype;
      c.kernel = kernel;
      c.tile_rows = tile_rows;
      c.Sq = 200;
      c.Sk = 190;
      c.causal = causal;
      c.extra_tol = 64.0 * std::ldexp(1.0, -24) * 1e4;  // the CPU suite's kLogitC·u·max|logit|
      SCOPED_TRACE(c.name());
      // Spread: q·2000 gives logits over about ±1e4.
      run_case(c, [](Tensor& q, Tensor&, Tensor&) {
        for (std::int64_t h = 0; h < q.size(1); ++h)
          for (std::int64_t i = 0; i < q.size(2); ++i)
            for (std::int64_t d = 0; d < q.size(3); ++d) q.set(0, h, i, d, q.get(0, h, i, d) * 2000.0f);
      });
      // Offset: dim 0 carries ±800 · 100 / 8 = ±1e4 on every logit of a row.
      run_case(c, [](Tensor& q, Tensor& k, Tensor&) {
        for (std::int64_t h = 0; h < q.size(1); ++h)
          for (std::int64_t i = 0; i < q.size(2); ++i) q.set(0, h, i, 0, i % 2 ? -800.0f : 800.0f);
        for (std::int64_t h = 0; h < k.size(1); ++h)
          for (std::int64_t j = 0; j < k.size(2); ++j) k.set(0, h, j, 0, 100.0f);
      });
    }
}

// Running twice gives the same bits (no atomics, no order-dependent reductions).
TEST(CudaBehaviour, Deterministic) {
  FATTN_REQUIRE_GPU();
  for (auto [dtype, kernel, tile_rows] : kernels_here()) {
    Case c;
    c.dtype = dtype;
    c.kernel = kernel;
    c.tile_rows = tile_rows;
    c.Sq = 300;
    c.Sk = 1000;
    c.causal = Causal::bottom_right;
    SCOPED_TRACE(c.name());
    DeviceCase t = upload_case(c);
    Options options;
    options.causal = c.causal;
    fattn::cuda::forward_with(t.q.view, t.k.view, t.v.view, t.out.view, &t.lse.view, options, kernel,
                              tile_rows);
    CUDA_OK(cudaDeviceSynchronize());
    t.download();
    const Tensor first = t.host.out.clone(), first_lse = t.host.lse.clone();
    CUDA_OK(cudaMemset(t.out.buffer.get(), fattn_test::kDevicePoisonByte, t.out.buffer.bytes()));
    fattn::cuda::forward_with(t.q.view, t.k.view, t.v.view, t.out.view, &t.lse.view, options, kernel,
                              tile_rows);
    CUDA_OK(cudaDeviceSynchronize());
    t.download();
    EXPECT_TRUE(first.same_bytes(t.host.out)) << "out differs between two runs";
    EXPECT_TRUE(first_lse.same_bytes(t.host.lse)) << "lse differs between two runs";
  }
}

// ---- streams and launches -------------------------------------------------------------

// Captured on a user stream into a CUDA graph: the kernel nodes are fattn's launches
// (naive: 3; fused: 1, plus one repack per input it cannot read directly), every
// launch and allocation honours Options::cuda_stream, and the graph runs.
TEST(CudaBehaviour, GraphCaptureCountsLaunches) {
  FATTN_REQUIRE_GPU();
  EXPECT_EQ(fattn::cuda::naive_launch_count(), 3);
  struct Expect {
    DType dtype;
    Kernel kernel;
    Layout layout;
    int kernels;
    int tile_rows = 0;
  };
  for (const Expect& e : {Expect{DType::float16, Kernel::naive, Layout::bhsd, 3},
                          Expect{DType::float32, Kernel::naive, Layout::padded, 3},
                          Expect{DType::float16, Kernel::fused_mma, Layout::bhsd, 1},
                          Expect{DType::float16, Kernel::fused_mma, Layout::bshd, 1, 128},
                          Expect{DType::bfloat16, Kernel::fused_mma, Layout::misaligned, 4},
                          Expect{DType::float32, Kernel::fused_tf32x3, Layout::padded, 1},
                          Expect{DType::float32, Kernel::fused_tf32, Layout::bhsd, 1, 128},
                          Expect{DType::float32, Kernel::fused_fma, Layout::bshd, 1},
                          Expect{DType::float32, Kernel::reference, Layout::bhsd, 1},
                          Expect{DType::bfloat16, Kernel::fused_wgmma, Layout::bshd, 1},
                          Expect{DType::float16, Kernel::fused_wgmma, Layout::misaligned, 4},
                          Expect{DType::float16, Kernel::fused_wgmma_pipelined, Layout::padded, 1},
                          Expect{DType::bfloat16, Kernel::fused_tma, Layout::bshd, 1},
                          Expect{DType::float16, Kernel::fused_tma, Layout::misaligned, 4},
                          Expect{DType::float16, Kernel::fused_tma, Layout::padded, 1}}) {
    if (!fattn::cuda::runs_on_current_device(e.kernel) || skipped_by_environment(e.kernel)) continue;
    Case c;
    c.dtype = e.dtype;
    c.kernel = e.kernel;
    c.tile_rows = e.tile_rows;
    c.layout = e.layout;
    c.Sq = 100;
    c.Sk = 130;
    c.causal = Causal::top_left;
    SCOPED_TRACE(c.name());
    DeviceCase t = upload_case(c);
    cudaStream_t stream = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    Options options;
    options.causal = c.causal;
    options.cuda_stream = stream;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    std::string error;
    try {
      fattn::cuda::forward_with(t.q.view, t.k.view, t.v.view, t.out.view, &t.lse.view, options, e.kernel,
                                e.tile_rows);
    } catch (const fattn::Error& x) {
      error = x.what();
    }
    cudaGraph_t graph = nullptr;
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    ASSERT_EQ(error, "");
    std::size_t count = 0;
    CUDA_OK(cudaGraphGetNodes(graph, nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count);
    CUDA_OK(cudaGraphGetNodes(graph, nodes.data(), &count));
    int kernels = 0;
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type;
      CUDA_OK(cudaGraphNodeGetType(node, &type));
      kernels += type == cudaGraphNodeTypeKernel;
    }
    EXPECT_EQ(kernels, e.kernels);
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    t.download();
    for (int i = 0; i < c.Sq; ++i) ASSERT_TRUE(std::isfinite(t.host.out.get(0, 1, i, 3))) << "row " << i;
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// ---- working memory (no GPU needed: nothing is launched) ------------------------------

TensorView fake(DType dtype, std::int64_t B, std::int64_t H, std::int64_t S, std::int64_t D,
                std::uintptr_t address) {
  return TensorView::bhsd(reinterpret_cast<void*>(address), B, H, S, D, dtype, fattn::Device::cuda);
}

TEST(CudaBehaviour, ExtraBytes) {
  constexpr std::uintptr_t base = std::uintptr_t{1} << 32;  // 16-byte aligned, never touched
  const auto q = fake(DType::float16, 2, 8, 300, 64, base);
  const auto k = fake(DType::float16, 2, 4, 500, 64, base + (1u << 28));
  const auto v = fake(DType::float16, 2, 4, 500, 64, base + (2u << 28));
  Options options;
  options.impl = fattn::Impl::naive;
  const std::int64_t scores = 2 * 8 * 300 * 500 * 4;  // a multiple of 256
  EXPECT_EQ(fattn::extra_bytes(q, k, v, options), scores);
  options.impl = fattn::Impl::fused;
  EXPECT_EQ(fattn::extra_bytes(q, k, v, options), 0);
  options.impl = fattn::Impl::reference;
  EXPECT_EQ(fattn::extra_bytes(q, k, v, options), 0);
  // A misaligned q is repacked: B·H·S·D elements, rounded up to 256 bytes.
  const auto q_odd = fake(DType::float16, 2, 8, 300, 64, base + 2);
  options.impl = fattn::Impl::fused;
  EXPECT_EQ(fattn::extra_bytes(q_odd, k, v, options), 2 * 8 * 300 * 64 * 2);
  // A head dim that is not a whole number of 16-byte chunks: rows padded to 24.
  const auto q20 = fake(DType::float16, 1, 1, 10, 20, base);
  const auto k20 = fake(DType::float16, 1, 1, 10, 20, base + (1u << 28));
  const auto v20 = fake(DType::float16, 1, 1, 10, 20, base + (2u << 28));
  EXPECT_EQ(fattn::extra_bytes(q20, k20, v20, options), 3 * 512);  // 480 B each, rounded
  EXPECT_EQ(fattn::cuda::extra_bytes_with(q20, k20, v20, options, Kernel::naive), 512);  // 400 B
}

// ---- errors ---------------------------------------------------------------------------------

TEST(CudaBehaviour, HeadDimStrideMustBeOne) {
  constexpr std::uintptr_t base = std::uintptr_t{1} << 32;
  auto q = fake(DType::float32, 1, 2, 16, 32, base);
  const auto k = fake(DType::float32, 1, 2, 16, 32, base + (1u << 28));
  const auto v = fake(DType::float32, 1, 2, 16, 32, base + (2u << 28));
  const auto out = fake(DType::float32, 1, 2, 16, 32, base + (3u << 28));
  q.strides = {2 * 16 * 64, 16 * 64, 64, 2};  // every other element
  EXPECT_THAT(error_of([&] { fattn::attention_forward(q, k, v, out, nullptr); }),
              HasSubstr("q.stride(3) (head dim) must be 1 for CUDA tensors, got 2"));
  EXPECT_THAT(error_of([&] { fattn::extra_bytes(q, k, v); }),
              HasSubstr("q.stride(3) (head dim) must be 1 for CUDA tensors"));
}

TEST(CudaBehaviour, KernelMustMatchDtype) {
  constexpr std::uintptr_t base = std::uintptr_t{1} << 32;
  const auto q = fake(DType::float32, 1, 1, 16, 64, base);
  const auto k = fake(DType::float32, 1, 1, 16, 64, base + (1u << 28));
  const auto v = fake(DType::float32, 1, 1, 16, 64, base + (2u << 28));
  const auto out = fake(DType::float32, 1, 1, 16, 64, base + (3u << 28));
  EXPECT_THAT(error_of([&] { fattn::cuda::forward_with(q, k, v, out, nullptr, {}, Kernel::fused_mma); }),
              HasSubstr("the fused_mma CUDA kernel takes float16 or bfloat16, got float32"));
  const auto h = fake(DType::float16, 1, 1, 16, 64, base);
  EXPECT_THAT(error_of([&] { fattn::cuda::extra_bytes_with(h, h, h, {}, Kernel::fused_fma); }),
              HasSubstr("the fused_fma CUDA kernel takes float32, got float16"));
  EXPECT_THAT(error_of([&] { fattn::cuda::extra_bytes_with(h, h, h, {}, Kernel::fused_tf32); }),
              HasSubstr("the fused_tf32 CUDA kernel takes float32, got float16"));
  EXPECT_THAT(error_of([&] { fattn::cuda::extra_bytes_with(q, k, v, {}, Kernel::fused_wgmma); }),
              HasSubstr("the fused_wgmma CUDA kernel takes float16 or bfloat16, got float32"));
  EXPECT_THAT(
      error_of([&] { fattn::cuda::extra_bytes_with(q, k, v, {}, Kernel::fused_wgmma_pipelined); }),
      HasSubstr("the fused_wgmma_pipelined CUDA kernel takes float16 or bfloat16, got float32"));
  EXPECT_THAT(error_of([&] { fattn::cuda::extra_bytes_with(q, k, v, {}, Kernel::fused_tma); }),
              HasSubstr("the fused_tma CUDA kernel takes float16 or bfloat16, got float32"));
}

// The variants (a left window, softcap, ALiBi, sinks) run on the kernels that take them; the
// others refuse them by name before any launch, saying which do. A right window alone (the
// band's upper edge, as the causal limit) every kernel takes.
TEST(CudaBehaviour, KernelsWithoutVariantsRefuseThem) {
  constexpr std::uintptr_t base = std::uintptr_t{1} << 32;
  const auto h = fake(DType::float16, 1, 2, 16, 64, base);
  const auto f = fake(DType::float32, 1, 2, 16, 64, base);
  Options left;
  left.window_left = 3;
  Options capped;
  capped.softcap = 30.0;
  for (Kernel kernel : {Kernel::fused_mma, Kernel::fused_wgmma, Kernel::fused_wgmma_pipelined, Kernel::naive})
    EXPECT_THAT(error_of([&] { fattn::cuda::extra_bytes_with(h, h, h, left, kernel); }),
                HasSubstr(std::string("the ") + fattn::cuda::to_string(kernel) +
                          " CUDA kernel takes no left window (window_left) (the fused_tma kernel"));
  EXPECT_THAT(error_of([&] { fattn::cuda::extra_bytes_with(f, f, f, capped, Kernel::fused_tf32x3); }),
              HasSubstr("the fused_tf32x3 CUDA kernel takes no softcap"));
  Options right;
  right.window_right = 3;
  EXPECT_EQ(error_of([&] { fattn::cuda::extra_bytes_with(h, h, h, right, Kernel::fused_mma); }),
            "(no fattn::Error thrown)");
  Options whole;  // a left window wider than every diagonal hides nothing: no variant
  whole.window_left = 15;
  EXPECT_EQ(error_of([&] { fattn::cuda::extra_bytes_with(h, h, h, whole, Kernel::fused_mma); }),
            "(no fattn::Error thrown)");
  Options masked;  // no C++ kernel takes an attn_mask: said before anything is checked
  const auto mask = fake(DType::float16, 1, 2, 16, 16, base + (1u << 28));
  masked.attn_mask = &mask;
  EXPECT_THAT(error_of([&] { fattn::extra_bytes(h, h, h, masked); }),
              HasSubstr("the CUDA C++ kernels take no attn_mask yet"));
  for (Kernel kernel : {Kernel::fused_tma, Kernel::reference})  // below the api layer too
    EXPECT_THAT(error_of([&] { fattn::cuda::extra_bytes_with(h, h, h, masked, kernel); }),
                HasSubstr(std::string("the ") + fattn::cuda::to_string(kernel) +
                          " CUDA kernel takes no attn_mask"));
}

// fused_wgmma: head dims up to its largest compiled one (64 and 128; smaller ones padded),
// fused_tma up to 256; 128-row tiles only, compute capability 9.0 only. Checked before any
// launch.
TEST(CudaBehaviour, WgmmaLimitsAreChecked) {
  constexpr std::uintptr_t base = std::uintptr_t{1} << 32;
  const std::vector<int> dims = fattn::cuda::wgmma_head_dims();
  const auto h256 = fake(DType::float16, 1, 1, 16, 256, base);
  if (dims.empty()) {
    EXPECT_THAT(error_of([&] { fattn::cuda::extra_bytes_with(h256, h256, h256, {}, Kernel::fused_wgmma); }),
                HasSubstr("this build has no fused_wgmma CUDA kernel"));
    return;
  }
  std::string listed;
  for (int d : dims) {
    EXPECT_TRUE(d == 64 || d == 128) << d;  // the dims of its instructions
    listed += (listed.empty() ? "" : ", ") + std::to_string(d);
  }
  EXPECT_THAT(error_of([&] { fattn::cuda::extra_bytes_with(h256, h256, h256, {}, Kernel::fused_wgmma); }),
              HasSubstr("head dim 256 is larger than every head dim the fused_wgmma CUDA kernel is "
                        "built for (" + listed + "); use the fused_mma kernel"));
  const auto h40 = fake(DType::float16, 1, 1, 16, 40, base);
  EXPECT_EQ(fattn::cuda::extra_bytes_with(h40, h40, h40, {}, Kernel::fused_wgmma), 0);  // padded to 64
  const auto h = fake(DType::bfloat16, 1, 1, 16, 64, base);
  const auto out = fake(DType::bfloat16, 1, 1, 16, 64, base + (3u << 28));
  EXPECT_THAT(error_of([&] { fattn::cuda::forward_with(h, h, h, out, nullptr, {}, Kernel::fused_wgmma, 64); }),
              HasSubstr("tile_rows = 64 is not a tile height of the fused_wgmma CUDA kernel (0, or 128)"));
  EXPECT_THAT(
      error_of([&] { fattn::cuda::forward_with(h, h, h, out, nullptr, {}, Kernel::fused_wgmma_pipelined, 64); }),
      HasSubstr("tile_rows = 64 is not a tile height of the fused_wgmma_pipelined CUDA kernel"));
  // The TMA kernel: the same device, 128-row tiles, and 256 beside those head dims (200
  // padded to it); nothing above.
  EXPECT_EQ(fattn::cuda::tma_head_dims().back(), 256);
  EXPECT_EQ(fattn::cuda::extra_bytes_with(h256, h256, h256, {}, Kernel::fused_tma), 0);
  const auto h200 = fake(DType::float16, 1, 1, 16, 200, base);
  EXPECT_EQ(fattn::cuda::extra_bytes_with(h200, h200, h200, {}, Kernel::fused_tma), 0);
  EXPECT_EQ(fattn::cuda::extra_bytes_with(h40, h40, h40, {}, Kernel::fused_tma), 0);  // padded to 64
  EXPECT_THAT(error_of([&] { fattn::cuda::forward_with(h, h, h, out, nullptr, {}, Kernel::fused_tma, 64); }),
              HasSubstr("tile_rows = 64 is not a tile height of the fused_tma CUDA kernel (0, or 128)"));
  // Its ring depth: the table's or the alternative, the plain forward only, fused_tma only.
  EXPECT_THAT(error_of([&] { fattn::cuda::forward_with(h, h, h, out, nullptr, {}, Kernel::fused_tma, 0, 7); }),
              HasSubstr("stages = 7 is not a ring depth the fused_tma CUDA kernel is built with at "
                        "head dim 64 (0, 3 or 4)"));
  Options windowed;
  windowed.window_left = 3;
  EXPECT_THAT(error_of([&] { fattn::cuda::forward_with(h, h, h, out, nullptr, windowed, Kernel::fused_tma, 0, 4); }),
              HasSubstr("takes the variants (left window (window_left)) at its table's depth only"));
  EXPECT_THAT(error_of([&] { fattn::cuda::forward_with(h, h, h, out, nullptr, {}, Kernel::fused_mma, 0, 3); }),
              HasSubstr("stages = 3: only the fused_tma CUDA kernel takes a ring depth"));
  if (!why_no_gpu().empty() || fattn::cuda::runs_on_current_device(Kernel::fused_wgmma)) return;
  // A GPU other than compute capability 9.0: a clear error, no launch.
  Case c;
  c.dtype = DType::float16;
  c.kernel = Kernel::fused_wgmma;
  DeviceCase t = upload_case(c);
  EXPECT_THAT(error_of([&] {
                fattn::cuda::forward_with(t.q.view, t.k.view, t.v.view, t.out.view, nullptr, {},
                                          Kernel::fused_wgmma);
              }),
              HasSubstr("the fused_wgmma CUDA kernel is built for sm_90a and runs on compute "
                        "capability 9.0 (Hopper) only"));
}

// forward_with's tile_rows: 0, 64 or 128 for the tensor-core kernels; 128 only up to
// max_tall_head_dim (tile_config.hpp). Checked before any device memory is touched.
TEST(CudaBehaviour, TileRowsAreChecked) {
  constexpr std::uintptr_t base = std::uintptr_t{1} << 32;
  const auto h = fake(DType::float16, 1, 1, 16, 64, base);
  const auto out = fake(DType::float16, 1, 1, 16, 64, base + (3u << 28));
  EXPECT_THAT(error_of([&] { fattn::cuda::forward_with(h, h, h, out, nullptr, {}, Kernel::fused_mma, 96); }),
              HasSubstr("tile_rows = 96 is not a tile height of the fused_mma CUDA kernel (0, or 64 or 128"));
  const auto f = fake(DType::float32, 1, 1, 16, 64, base);
  const auto fout = fake(DType::float32, 1, 1, 16, 64, base + (3u << 28));
  EXPECT_THAT(error_of([&] { fattn::cuda::forward_with(f, f, f, fout, nullptr, {}, Kernel::fused_fma, 64); }),
              HasSubstr("tile_rows = 64 is not a tile height of the fused_fma CUDA kernel"));
  EXPECT_EQ(fattn::cuda::max_tall_head_dim(), 128);
  const auto h256 = fake(DType::float16, 1, 1, 16, 256, base);
  const auto out256 = fake(DType::float16, 1, 1, 16, 256, base + (3u << 28));
  EXPECT_THAT(
      error_of([&] { fattn::cuda::forward_with(h256, h256, h256, out256, nullptr, {}, Kernel::fused_mma, 128); }),
      HasSubstr("tile_rows = 128 needs a head dim of at most 128, got 256"));
}

// float32 runs 3xTF32 unless the caller allows TF32 (as torch's allow_tf32 does).
TEST(CudaBehaviour, AllowTf32SelectsPlainTf32) {
  using fattn::Impl;
  EXPECT_EQ(fattn::cuda::kernel_for(Impl::automatic, DType::float32), Kernel::fused_tf32x3);
  EXPECT_EQ(fattn::cuda::kernel_for(Impl::automatic, DType::float32, true), Kernel::fused_tf32);
  EXPECT_EQ(fattn::cuda::kernel_for(Impl::fused, DType::float32, true), Kernel::fused_tf32);
  EXPECT_EQ(fattn::cuda::kernel_for(Impl::automatic, DType::float16, true), Kernel::fused_mma);
  EXPECT_EQ(fattn::cuda::kernel_for(Impl::naive, DType::float32, true), Kernel::naive);
}

// Impl::automatic with 16-bit inputs runs the TMA kernel where it runs (a Hopper device, a
// build with it) at the head dims measured faster (64, 128); everything else as kernel_for.
TEST(CudaBehaviour, AutomaticRunsTheTmaKernelOnHopperAtItsHeadDims) {
  using fattn::Impl;
  fattn::Options options;
  const bool tma = fattn::cuda::runs_on_current_device(Kernel::fused_tma);
  for (int d : {64, 128})
    EXPECT_EQ(fattn::cuda::automatic_kernel(options, DType::bfloat16, d),
              tma && fattn::cuda::tma_measured_head_dim(d) ? Kernel::fused_tma : Kernel::fused_mma);
  EXPECT_EQ(fattn::cuda::automatic_kernel(options, DType::float16, 96), Kernel::fused_mma);
  EXPECT_EQ(fattn::cuda::automatic_kernel(options, DType::float32, 128), Kernel::fused_tf32x3);
  options.impl = Impl::fused;  // the mma.sync kernel by name
  EXPECT_EQ(fattn::cuda::automatic_kernel(options, DType::float16, 128), Kernel::fused_mma);
  EXPECT_FALSE(fattn::cuda::tma_measured_head_dim(96));
}

// Options::device_allocator: the working memory comes from it (once, the size
// extra_bytes reports) and goes back to it; the result is the same as with
// fattn's own cudaMallocAsync.
TEST(CudaBehaviour, DeviceAllocatorProvidesWorkingMemory) {
  FATTN_REQUIRE_GPU();
  struct Counting {
    int allocations = 0, frees = 0;
    std::int64_t bytes = 0;
  } counts;
  fattn::DeviceAllocator allocator;
  allocator.context = &counts;
  allocator.allocate = [](void* ctx, std::int64_t bytes, void*) -> void* {
    auto* c = static_cast<Counting*>(ctx);
    void* p = nullptr;
    if (cudaMalloc(&p, static_cast<std::size_t>(bytes)) != cudaSuccess) return nullptr;
    ++c->allocations;
    c->bytes += bytes;
    return p;
  };
  allocator.deallocate = [](void* ctx, void* p, void* stream) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream));  // a plain cudaFree needs it
    cudaFree(p);
    ++static_cast<Counting*>(ctx)->frees;
  };
  Case c;
  c.dtype = DType::float16;
  c.Sq = 70;
  c.Sk = 90;
  DeviceCase t = upload_case(c);
  Options options;
  options.impl = fattn::Impl::naive;
  fattn::attention_forward(t.q.view, t.k.view, t.v.view, t.out.view, &t.lse.view, options);
  CUDA_OK(cudaDeviceSynchronize());
  t.download();
  const Tensor own = t.host.out.clone();
  options.device_allocator = &allocator;
  CUDA_OK(cudaMemset(t.out.buffer.get(), fattn_test::kDevicePoisonByte, t.out.buffer.bytes()));
  fattn::attention_forward(t.q.view, t.k.view, t.v.view, t.out.view, &t.lse.view, options);
  CUDA_OK(cudaDeviceSynchronize());
  t.download();
  EXPECT_EQ(counts.allocations, 1);
  EXPECT_EQ(counts.frees, 1);
  EXPECT_EQ(counts.bytes, fattn::extra_bytes(t.q.view, t.k.view, t.v.view, options));
  EXPECT_TRUE(t.host.out.same_bytes(own));  // same kernels, same bits
  // An allocator that has no memory: a clear error, nothing launched.
  allocator.allocate = [](void*, std::int64_t, void*) -> void* { return nullptr; };
  EXPECT_THAT(error_of([&] {
                fattn::attention_forward(t.q.view, t.k.view, t.v.view, t.out.view, &t.lse.view, options);
              }),
              HasSubstr("the device allocator returned no memory for"));
}

TEST(CudaBehaviour, HostPointersAreRejected) {
  std::vector<float> host(4 * 64 * 16);
  const auto q = TensorView::bhsd(host.data(), 1, 1, 16, 64, DType::float32, fattn::Device::cuda);
  const auto k = TensorView::bhsd(host.data() + 1024, 1, 1, 16, 64, DType::float32, fattn::Device::cuda);
  const auto v = TensorView::bhsd(host.data() + 2048, 1, 1, 16, 64, DType::float32, fattn::Device::cuda);
  const auto out = TensorView::bhsd(host.data() + 3072, 1, 1, 16, 64, DType::float32, fattn::Device::cuda);
  const std::string error = error_of([&] { fattn::attention_forward(q, k, v, out, nullptr); });
  if (!why_no_gpu().empty()) {
    EXPECT_THAT(error, HasSubstr("no CUDA device is usable"));
    return;
  }
  EXPECT_THAT(error, HasSubstr("q is marked Device::cuda, but its data pointer is host memory"));
}

TEST(CudaBehaviour, HeadDimAboveTheBuiltList) {
  const std::vector<int> dims = fattn::cuda::supported_head_dims();
  ASSERT_FALSE(dims.empty());
  EXPECT_FALSE(fattn::cuda::supported_head_dims_text().empty());
  if (dims.back() >= 256) GTEST_SKIP() << "every head dim up to 256 has a fused kernel in this build";
  constexpr std::uintptr_t base = std::uintptr_t{1} << 32;
  const int d = 256;
  const auto q = fake(DType::float16, 1, 1, 16, d, base);
  EXPECT_THAT(error_of([&] { fattn::extra_bytes(q, q, q); }),
              HasSubstr("is larger than every head dim the fused CUDA kernels are built for (" +
                        fattn::cuda::supported_head_dims_text() + ")"));
}

}  // namespace
}  // namespace fattn_cuda_test
