// fattn-bench — unit tests of the FLOP and arithmetic-intensity models (model.hpp).
// Every expected value is worked out by hand in the comment beside it.
#include <gtest/gtest.h>

#include "model.hpp"
#include "model_table.hpp"

namespace fattn_bench {
namespace {

using fattn::Causal;

Shape square(std::int64_t seq, Causal causal = Causal::none) {
  Shape s;  // B = Hq = Hkv = 1, D = 64
  s.q_len = s.kv_len = seq;
  s.causal = causal;
  return s;
}

Shape rectangular(std::int64_t q_len, std::int64_t kv_len, Causal causal) {
  Shape s = square(q_len, causal);
  s.kv_len = kv_len;
  return s;
}

TEST(Flops, NonCausalIsFourBHSSD) {
  // 4 · 128 · 128 · 64 = 4194304
  EXPECT_EQ(flops(square(128)), 4194304);
  // B=2, Hq=8: 16 × that = 67108864
  Shape s = square(128);
  s.batch = 2;
  s.q_heads = 8;
  s.kv_heads = 8;
  EXPECT_EQ(flops(s), 67108864);
}

TEST(VisiblePairs, TopLeftSquare) {
  // rows see 1, 2, 3, 4 keys: 10
  EXPECT_EQ(visible_pairs(square(4, Causal::top_left)), 10);
  // S = 128: 128 · 129 / 2 = 8256
  EXPECT_EQ(visible_pairs(square(128, Causal::top_left)), 8256);
  // 4 · 10 · 64 = 2560
  EXPECT_EQ(flops(square(4, Causal::top_left)), 2560);
}

TEST(VisiblePairs, TopLeftRectangular) {
  // Sq=2, Sk=4: min(4,1) + min(4,2) = 3
  EXPECT_EQ(visible_pairs(rectangular(2, 4, Causal::top_left)), 3);
  // Sq=6, Sk=4: 1 + 2 + 3 + 4 + 4 + 4 = 18
  EXPECT_EQ(visible_pairs(rectangular(6, 4, Causal::top_left)), 18);
}

TEST(VisiblePairs, BottomRight) {
  // Square: offset 0, same as top-left: 10
  EXPECT_EQ(visible_pairs(square(4, Causal::bottom_right)), 10);
  // Sq=2, Sk=4, offset 2: row 0 sees keys 0..2 (3), row 1 sees 0..3 (4): 7
  EXPECT_EQ(visible_pairs(rectangular(2, 4, Causal::bottom_right)), 7);
  // Sq=4, Sk=2, offset −2: rows 0, 1 see nothing (0), row 2 sees 1, row 3 sees 2: 3
  const Shape tall = rectangular(4, 2, Causal::bottom_right);
  EXPECT_EQ(visible_keys(tall, 0), 0);
  EXPECT_EQ(visible_keys(tall, 1), 0);
  EXPECT_EQ(visible_keys(tall, 2), 1);
  EXPECT_EQ(visible_keys(tall, 3), 2);
  EXPECT_EQ(visible_pairs(tall), 3);
  // rows that see nothing contribute 0 FLOPs: 4 · 3 · 64 = 768
  EXPECT_EQ(flops(tall), 768);
}

TEST(FusedModel, EachTensorOnce) {
  // Q, K, V, O: 128 · 64 = 8192 floats each, 32768 floats = 131072 bytes
  EXPECT_EQ(fused_bytes(square(128)), 131072);
  // 4194304 / 131072 = 32
  EXPECT_DOUBLE_EQ(fused_ai(square(128)), 32.0);
}

TEST(FusedModel, GroupedQueryHeadsAndLse) {
  Shape s = square(256);
  s.batch = 2;
  s.q_heads = 8;
  s.kv_heads = 2;
  s.head_dim = 128;
  s.lse_written = true;
  // |Q| = |O| = 2·8·256·128 = 524288; |K| = |V| = 2·2·256·128 = 131072;
  // |LSE| = 2·8·256 = 4096. 2·524288 + 2·131072 + 4096 = 1314816 floats = 5259264 bytes
  EXPECT_EQ(fused_bytes(s), 5259264);
}

TEST(FusedModel, KvRereadPerQueryTile) {
  // Br = 32: 4 query tiles, each reads K and V (2 · 128 · 64 = 16384 floats): 65536,
  // plus Q and O (16384): 81920 floats = 327680 bytes; 4194304 / 327680 = 12.8
  EXPECT_EQ(fused_bytes_kv_reread(square(128), 32), 327680);
  EXPECT_DOUBLE_EQ(fused_ai_kv_reread(square(128), 32), 12.8);
  // Causal top-left: tiles end at rows 31, 63, 95, 127 and visit 32, 64, 96, 128 keys
  // = 320; K/V 2 · 320 · 64 = 40960 + Q, O 16384 = 57344 floats = 229376 bytes.
  // FLOPs 4 · 8256 · 64 = 2113536; AI = 2113536 / 229376 = 129 / 14
  const Shape causal = square(128, Causal::top_left);
  EXPECT_EQ(fused_bytes_kv_reread(causal, 32), 229376);
  EXPECT_DOUBLE_EQ(fused_ai_kv_reread(causal, 32), 129.0 / 14.0);
}

TEST(FusedModel, KvRereadPartialLastTile) {
  // Sq = Sk = 40, D = 64, Br = 32: 2 tiles. Non-causal: 2 · 40 keys = 80;
  // K/V 2 · 80 · 64 = 10240, Q and O 2 · 40 · 64 = 5120: 15360 floats = 61440 bytes
  EXPECT_EQ(fused_bytes_kv_reread(square(40), 32), 61440);
  // Top-left: tile 0 ends at row 31 (32 keys), tile 1 at row 39 (40 keys): 72;
  // K/V 2 · 72 · 64 = 9216 + 5120 = 14336 floats = 57344 bytes
  EXPECT_EQ(fused_bytes_kv_reread(square(40, Causal::top_left), 32), 57344);
}

TEST(NaiveModel, SevenPassesOverTheScores) {
  // fused bytes 131072 + 7 passes · 128·128 scores · 4 bytes (458752) = 589824
  EXPECT_EQ(naive_bytes(square(128)), 589824);
  // 4194304 / 589824 = 64 / 9
  EXPECT_DOUBLE_EQ(naive_ai(square(128)), 64.0 / 9.0);
  // Causal S = 4, D = 64: fused 4 · 4·64 · 4 = 4096 bytes; scores 10 visible:
  // 7 · 10 · 4 = 280: 4376 bytes
  EXPECT_EQ(naive_bytes(square(4, Causal::top_left)), 4376);
}

TEST(NaiveModel, LessIntenseThanFused) {
  for (std::int64_t seq : {128, 1024, 4096})
    for (Causal c : {Causal::none, Causal::top_left})
      EXPECT_LT(naive_ai(square(seq, c)), fused_ai(square(seq, c))) << seq;
}

Shape half(Shape s) {
  s.element_bytes = kHalfBytes;
  return s;
}

TEST(SoftmaxFlops, EachKindApart) {
  // S = 128: N = 16384 scores; max 1, exp 2, sum 1, scale 2 per score
  const SoftmaxFlops f = softmax_flops(square(128));
  EXPECT_EQ(f.max, 16384);
  EXPECT_EQ(f.exp, 32768);
  EXPECT_EQ(f.sum, 16384);
  EXPECT_EQ(f.scale, 32768);
  EXPECT_EQ(f.total(), 98304);  // 6 · 16384
  // Causal S = 4: 10 visible scores → 60
  EXPECT_EQ(softmax_flops(square(4, Causal::top_left)).total(), 60);
}

TEST(NaiveStages, Fp32AtS128) {
  // |Q| = |K| = |V| = |O| = 128 · 64 = 8192 floats = 32768 bytes; N = 16384 scores
  const Shape s = square(128);
  const Traffic qk = naive_stage_traffic(s, NaiveStage::qk_gemm);
  EXPECT_EQ(qk.q, 32768);
  EXPECT_EQ(qk.k, 32768);
  EXPECT_EQ(qk.scores, 65536);  // write S: 16384 · 4
  EXPECT_EQ(qk.total(), 131072);
  // 2 · 16384 · 64 = 2097152 FLOPs; 2097152 / 131072 = 16
  EXPECT_EQ(naive_stage_flops(s, NaiveStage::qk_gemm), 2097152);
  EXPECT_DOUBLE_EQ(naive_stage_ai(s, NaiveStage::qk_gemm), 16.0);
  // softmax: 5 passes · 16384 · 4 = 327680 bytes; 98304 FLOPs; AI 0.3
  EXPECT_EQ(naive_stage_traffic(s, NaiveStage::softmax).total(), 327680);
  EXPECT_DOUBLE_EQ(naive_stage_ai(s, NaiveStage::softmax), 0.3);
  // P·V: read P 65536 + V 32768 + write O 32768 = 131072; AI 16
  const Traffic pv = naive_stage_traffic(s, NaiveStage::pv_gemm);
  EXPECT_EQ(pv.scores, 65536);
  EXPECT_EQ(pv.v, 32768);
  EXPECT_EQ(pv.o, 32768);
  EXPECT_DOUBLE_EQ(naive_stage_ai(s, NaiveStage::pv_gemm), 16.0);
  // The stages add up to the whole: 131072 + 327680 + 131072 = 589824
  EXPECT_EQ(naive_bytes(s), 589824);
}

TEST(NaiveStages, HalfPrecisionHalvesTheBytes) {
  // 16-bit: every byte count halves, FLOPs do not: AI doubles
  const Shape s = half(square(128));
  EXPECT_EQ(naive_stage_traffic(s, NaiveStage::qk_gemm).total(), 65536);
  EXPECT_DOUBLE_EQ(naive_stage_ai(s, NaiveStage::qk_gemm), 32.0);
  EXPECT_DOUBLE_EQ(naive_stage_ai(s, NaiveStage::softmax), 0.6);  // 98304 / 163840
  EXPECT_EQ(fused_bytes(s), 65536);                               // 4 · 8192 · 2
  EXPECT_DOUBLE_EQ(fused_ai(s), 64.0);                            // 4194304 / 65536
  // The logsumexp stays float32: 128 rows · 4 bytes, in the softmax stage
  Shape with_lse = s;
  with_lse.lse_written = true;
  EXPECT_EQ(naive_stage_traffic(with_lse, NaiveStage::softmax).lse, 512);
  EXPECT_EQ(fused_bytes(with_lse), 65536 + 512);
}

TEST(NaiveStages, LongSequences) {
  // S = 1024, D = 64: |Q| = 2^16 floats, N = 2^20 scores, FLOPs 4 · 2^20 · 64 = 2^28.
  // naive bytes 4 · (4 · 2^16 + 7 · 2^20) = 2^18 · 116: AI = 2^10 / 116 = 256 / 29
  EXPECT_DOUBLE_EQ(naive_ai(square(1024)), 256.0 / 29.0);
  // fused bytes 4 · 4 · 2^16 = 2^20: AI = 2^8 = 256 (= S / 4 in fp32)
  EXPECT_DOUBLE_EQ(fused_ai(square(1024)), 256.0);
  // S = 4096: |Q| = 2^18, N = 2^24, FLOPs 2^32. Q·Kᵀ: 2^31 FLOPs over
  // 4 · (2 · 2^18 + 2^24) = 2^20 · 66 bytes: AI = 2^11 / 66 = 1024 / 33
  EXPECT_DOUBLE_EQ(naive_stage_ai(square(4096), NaiveStage::qk_gemm), 1024.0 / 33.0);
  // naive 4 · (4 · 2^18 + 7 · 2^24) = 2^22 · 113: AI = 2^10 / 113; fused 2^32 / 2^22 = 1024
  EXPECT_DOUBLE_EQ(naive_ai(square(4096)), 1024.0 / 113.0);
  EXPECT_DOUBLE_EQ(fused_ai(square(4096)), 1024.0);
}

TEST(ModelTable, RowsAgreeWithTheModel) {
  // 2 dtypes × 4 lengths × (3 stages + naive total + fused + fused K/V re-read) = 48 rows
  const auto rows = model_table(64, 32);
  ASSERT_EQ(rows.size(), 48u);
  for (std::size_t first = 0; first < rows.size(); first += 6) {
    const auto& qk = rows[first];
    const auto& total = rows[first + 3];
    EXPECT_EQ(qk["stage"], "qk_gemm");
    EXPECT_EQ(total["stage"], "total");
    // the three stages add up to the naive total
    const std::int64_t stages = rows[first]["bytes"].get<std::int64_t>() +
                                rows[first + 1]["bytes"].get<std::int64_t>() +
                                rows[first + 2]["bytes"].get<std::int64_t>();
    EXPECT_EQ(stages, total["bytes"].get<std::int64_t>());
    Shape s = square(total["S"].get<std::int64_t>());
    s.element_bytes = total["element_bytes"].get<std::int64_t>();
    EXPECT_EQ(total["bytes"].get<std::int64_t>(), naive_bytes(s));
    EXPECT_EQ(rows[first + 4]["bytes"].get<std::int64_t>(), fused_bytes(s));
    EXPECT_EQ(rows[first + 5]["bytes"].get<std::int64_t>(), fused_bytes_kv_reread(s, 32));
  }
  // S = 128, fp32, Q·Kᵀ: 131072 bytes, AI 16 (NaiveStages.Fp32AtS128)
  EXPECT_EQ(rows[0]["bytes"], 131072);
  EXPECT_DOUBLE_EQ(rows[0]["ai"].get<double>(), 16.0);
}

TEST(QueryTileRows, PerIsa) {
  // src/cpu/common/tiling.hpp: query_vecs × floats per vector
  EXPECT_EQ(query_tile_rows(fattn::Isa::avx512), 64);  // Tiling<64>: 4 vectors of 16 floats
  EXPECT_EQ(query_tile_rows(fattn::Isa::avx2), 24);  // Tiling<32>: 3 vectors of 8 floats
  EXPECT_EQ(query_tile_rows(fattn::Isa::portable), 8);
  EXPECT_EQ(query_tile_rows(fattn::Isa::automatic), query_tile_rows(fattn::best_cpu_isa()));
}

}  // namespace
}  // namespace fattn_bench
