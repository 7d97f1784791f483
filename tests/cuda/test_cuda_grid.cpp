// fattn CUDA tests — the grid: every CUDA kernel against the float64 host reference
// over sequence lengths (odd, around tile edges), Sq != Sk, head dims (compiled and
// padded), causal alignments, GQA, memory layouts and scales.
#include "cuda/kernels.hpp"
#include "cuda/tile_config.hpp"
#include "util/cuda_case.hpp"

namespace fattn_cuda_test {
namespace {

class CudaGrid : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { FATTN_REQUIRE_GPU(); }
};

TEST_P(CudaGrid, MatchesFloat64Reference) {
  if (!compiled_for(GetParam()))
    GTEST_SKIP() << "no kernel for this head dim (FATTN_CUDA_HEAD_DIMS, cuda::max_tall_head_dim)";
  if (const std::string why = why_not_here(GetParam()); !why.empty()) GTEST_SKIP() << why;
  run_case(GetParam());
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) { return info.param.name(); }

constexpr Causal kCausals[] = {Causal::none, Causal::top_left, Causal::bottom_right};

// Sq = Sk over odd lengths and tile edges (64- and 128-row, 64/32-key tiles), GQA 2:1.
std::vector<Case> seq_len_cases() {
  std::vector<Case> cases;
  for (int s : {1, 7, 63, 65, 113, 127, 129, 1023})
    for (Causal causal : kCausals)
      for (auto [dtype, kernel, tile_rows] : all_kernels()) {
        Case c;
        c.dtype = dtype;
        c.kernel = kernel;
        c.tile_rows = tile_rows;
        c.Sq = c.Sk = s;
        c.causal = causal;
        cases.push_back(c);
      }
  return cases;
}

// Sq != Sk: bottom_right with Sq > Sk has queries that see no key (0 and -inf).
std::vector<Case> cross_cases() {
  std::vector<Case> cases;
  for (auto [sq, sk] : {std::pair{1, 1023}, {1023, 1}, {7, 65}, {65, 7}, {113, 1023}, {1023, 113},
                        {63, 64}, {64, 63}, {129, 200}})
    for (Causal causal : kCausals)
      for (auto [dtype, kernel, tile_rows] : all_kernels()) {
        Case c;
        c.dtype = dtype;
        c.kernel = kernel;
        c.tile_rows = tile_rows;
        c.Sq = sq;
        c.Sk = sk;
        c.causal = causal;
        cases.push_back(c);
      }
  return cases;
}

// Head dims: compiled ones and others in [16, 256] (zero-padded to the next compiled
// one; 17, 20 and 24 are not whole 16-byte chunks in 16-bit and take the repack path).
std::vector<Case> head_dim_cases() {
  std::vector<Case> cases;
  for (int d : {16, 17, 20, 24, 32, 40, 48, 64, 80, 96, 112, 128, 136, 200, 256})
    for (Causal causal : {Causal::none, Causal::bottom_right})
      for (auto [dtype, kernel, tile_rows] : all_kernels()) {
        Case c;
        c.dtype = dtype;
        c.kernel = kernel;
        c.tile_rows = tile_rows;
        c.D = d;
        c.Sq = 65;
        c.Sk = 113;
        c.causal = causal;
        cases.push_back(c);
      }
  return cases;
}

// GQA / MQA with several batches.
std::vector<Case> gqa_cases() {
  std::vector<Case> cases;
  for (int hkv : {1, 2, 3, 6})
    for (auto [dtype, kernel, tile_rows] : all_kernels()) {
      Case c;
      c.dtype = dtype;
      c.kernel = kernel;
      c.tile_rows = tile_rows;
      c.B = 2;
      c.Hq = 6;
      c.Hkv = hkv;
      c.Sq = 113;
      c.Sk = 65;
      c.causal = Causal::top_left;
      cases.push_back(c);
    }
  return cases;
}

// Strided layouts: BSHD, NaN-padded gaps (direct cp.async path), misaligned (repack
// path); without lse; scales of either sign and zero.
std::vector<Case> layout_cases() {
  std::vector<Case> cases;
  for (Layout layout : {Layout::bshd, Layout::padded, Layout::misaligned})
    for (int d : {64, 96, 20})
      for (auto [dtype, kernel, tile_rows] : all_kernels()) {
        Case c;
        c.dtype = dtype;
        c.kernel = kernel;
        c.tile_rows = tile_rows;
        c.D = d;
        c.B = 2;
        c.Hq = 4;
        c.Hkv = 2;
        c.Sq = 70;
        c.Sk = 129;
        c.causal = Causal::bottom_right;
        c.layout = layout;
        c.with_lse = d != 96;
        cases.push_back(c);
      }
  for (double scale : {0.0, -0.37, 2.5})
    for (auto [dtype, kernel, tile_rows] : all_kernels()) {
      Case c;
      c.dtype = dtype;
      c.kernel = kernel;
      c.tile_rows = tile_rows;
      c.Sq = 65;
      c.Sk = 130;
      c.causal = Causal::bottom_right;
      c.scale = scale;
      cases.push_back(c);
    }
  return cases;
}

// Long rows: many key tiles, the online softmax's rescaling over 30+ tiles. Rows are
// sampled for the host reference.
std::vector<Case> long_cases() {
  std::vector<Case> cases;
  for (Causal causal : {Causal::none, Causal::bottom_right})
    for (int d : {64, 128})
      for (auto [dtype, kernel, tile_rows] : all_kernels()) {
        if (kernel == Kernel::reference) continue;
        Case c;
        c.dtype = dtype;
        c.kernel = kernel;
        c.tile_rows = tile_rows;
        c.D = d;
        c.Hq = c.Hkv = 1;
        c.Sq = 2049;
        c.Sk = 2100;
        c.causal = causal;
        c.row_step = 37;
        cases.push_back(c);
      }
  return cases;
}

// The variants, on the kernels that take them (kernels.hpp's takes_variants: the TMA kernel's
// variant instantiation and the float64 reference): windows (left, right, both; narrower
// than a key tile and wider than several, so blocks skip whole tiles below the band),
// softcap, ALiBi, sinks, alone and together, over causal alignments, Sq != Sk, GQA, padded
// head dims and layouts.
// (The float64 reference in float32 only: its 16-bit loads are the plain grid's.)
std::vector<KernelCase> variant_kernels() {
  std::vector<KernelCase> kernels;
  for (const KernelCase& k : all_kernels())
    if (fattn::cuda::takes_variants(k.kernel) &&
        (k.kernel != Kernel::reference || k.dtype == DType::float32))
      kernels.push_back(k);
  return kernels;
}

std::vector<Case> variant_cases() {
  struct Variant {
    int left, right;
    double softcap;
    bool alibi, sinks;
  };
  const Variant variants[] = {
      {0, 0, 0.0, false, false},    {7, -1, 0.0, false, false},    {-1, 9, 0.0, false, false},
      {130, 3, 0.0, false, false},  {300, -1, 0.0, false, false},  {-1, -1, 5.0, false, false},
      {-1, -1, 0.0, true, false},   {-1, -1, 0.0, false, true},    {64, 0, 30.0, true, true},
      {200, 200, 0.0, false, true},
  };
  std::vector<Case> cases;
  for (const Variant& v : variants)
    for (auto [sq, sk] : {std::pair{257, 700}, {700, 257}, {1, 513}, {129, 129}})
      for (Causal causal : kCausals)
        for (auto [dtype, kernel, tile_rows] : variant_kernels()) {
          Case c;
          c.dtype = dtype;
          c.kernel = kernel;
          c.tile_rows = tile_rows;
          c.Sq = sq;
          c.Sk = sk;
          c.D = sq == 129 ? 80 : 128;  // 80: padded to the 128 kernel
          c.Hq = 4;
          c.Hkv = 2;
          c.causal = causal;
          c.window_left = v.left;
          c.window_right = v.right;
          c.softcap = v.softcap;
          c.alibi = v.alibi;
          c.sinks = v.sinks;
          if (sq == 1) c.layout = Layout::bshd;
          cases.push_back(c);
        }
  // Long rows under a narrow window: most key tiles outside the band, a few masked.
  for (int d : {64, 128})
    for (auto [dtype, kernel, tile_rows] : variant_kernels()) {
      if (kernel == Kernel::reference) continue;
      Case c;
      c.dtype = dtype;
      c.kernel = kernel;
      c.D = d;
      c.Hq = c.Hkv = 1;
      c.Sq = 2049;
      c.Sk = 2100;
      c.causal = Causal::bottom_right;
      c.window_left = 333;
      c.softcap = 20.0;
      c.sinks = true;
      c.with_lse = d == 128;
      c.row_step = 37;
      cases.push_back(c);
    }
  return cases;
}

// fused_tma at its other ring depth (tile_config.hpp, tma_alternative_stages): the phases of
// a deeper ring over many key tiles, causal both alignments, Sq != Sk.
std::vector<Case> ring_cases() {
  std::vector<Case> cases;
  for (int d : {64, 128})
    for (auto [sq, sk] : {std::pair{129, 129}, {1023, 1100}, {65, 2049}})
      for (Causal causal : kCausals)
        for (DType dtype : {DType::float16, DType::bfloat16}) {
          Case c;
          c.dtype = dtype;
          c.kernel = Kernel::fused_tma;
          c.stages = fattn::cuda::tma_alternative_stages(d);
          c.D = d;
          c.Sq = sq;
          c.Sk = sk;
          c.causal = causal;
          c.row_step = sq > 1000 ? 17 : 1;
          cases.push_back(c);
        }
  return cases;
}

// The persistent TMA kernels with one or two blocks, so that a block walks many query tiles:
// the K/V ring's slots and phases carried from tile to tile, Q's reload behind q_empty, the
// deferred release of each tile's last K stage, the ping-pong hand-overs per tile; tiles
// whose rows see no key (bottom-right, Sq > Sk), several batches and heads, GQA.
std::vector<Case> persistent_cases() {
  std::vector<Case> cases;
  for (Kernel kernel : {Kernel::fused_tma_persistent, Kernel::fused_tma_pingpong})
    for (int blocks : {1, 2})
      for (int d : {64, 128})
        for (auto [sq, sk] : {std::pair{300, 300}, {1023, 113}, {129, 1023}})
          for (Causal causal : kCausals)
            for (DType dtype : {DType::float16, DType::bfloat16}) {
              Case c;
              c.dtype = dtype;
              c.kernel = kernel;
              c.blocks = blocks;
              c.D = d;
              c.B = 2;
              c.Hq = 3;
              c.Hkv = 1;
              c.Sq = sq;
              c.Sk = sk;
              c.causal = causal;
              c.row_step = sq > 1000 ? 7 : 1;
              cases.push_back(c);
            }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(SeqLen, CudaGrid, ::testing::ValuesIn(seq_len_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Cross, CudaGrid, ::testing::ValuesIn(cross_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(HeadDim, CudaGrid, ::testing::ValuesIn(head_dim_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Gqa, CudaGrid, ::testing::ValuesIn(gqa_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Layout, CudaGrid, ::testing::ValuesIn(layout_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Long, CudaGrid, ::testing::ValuesIn(long_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Variants, CudaGrid, ::testing::ValuesIn(variant_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Ring, CudaGrid, ::testing::ValuesIn(ring_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Persistent, CudaGrid, ::testing::ValuesIn(persistent_cases()), case_name);

// A small subset for compute-sanitizer (memcheck, racecheck): every kernel once, with
// a partial key tile, a causal diagonal, GQA, a padded head dim and the repack path.
class CudaSanitize : public CudaGrid {};
TEST_P(CudaSanitize, MatchesFloat64Reference) {
  if (!compiled_for(GetParam()))
    GTEST_SKIP() << "no kernel for this head dim (FATTN_CUDA_HEAD_DIMS, cuda::max_tall_head_dim)";
  if (const std::string why = why_not_here(GetParam()); !why.empty()) GTEST_SKIP() << why;
  run_case(GetParam());
}

std::vector<Case> sanitize_cases() {
  std::vector<Case> cases;
  for (auto [dtype, kernel, tile_rows] : all_kernels()) {
    Case c;
    c.dtype = dtype;
    c.kernel = kernel;
    c.tile_rows = tile_rows;
    c.Sq = 70;
    c.Sk = 100;
    c.causal = Causal::bottom_right;
    cases.push_back(c);
    if (kernel == Kernel::reference) continue;
    c.D = 40;  // padded to 64
    c.layout = Layout::misaligned;
    cases.push_back(c);
    c.D = 256;  // the largest shared-memory footprint
    c.layout = Layout::padded;
    c.Sq = 20;
    c.Sk = 33;
    cases.push_back(c);
  }
  // one block walking every tile of a persistent kernel (racecheck / synccheck over the
  // hand-overs between tiles)
  for (Kernel kernel : {Kernel::fused_tma_persistent, Kernel::fused_tma_pingpong}) {
    Case c;
    c.dtype = DType::bfloat16;
    c.kernel = kernel;
    c.blocks = 1;
    c.B = 2;
    c.Sq = 200;
    c.Sk = 150;
    c.causal = Causal::bottom_right;
    cases.push_back(c);
  }
  for (auto [dtype, kernel, tile_rows] : variant_kernels()) {  // tiles skipped below the band
    Case c;
    c.dtype = dtype;
    c.kernel = kernel;
    c.Sq = 300;
    c.Sk = 400;
    c.D = 128;
    c.causal = Causal::bottom_right;
    c.window_left = 70;
    c.softcap = 10.0;
    c.alibi = c.sinks = true;
    cases.push_back(c);
  }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Small, CudaSanitize, ::testing::ValuesIn(sanitize_cases()), case_name);

}  // namespace
}  // namespace fattn_cuda_test
