// fattn-bench — the model table (see model_table.hpp).
#include "model_table.hpp"

#include "model.hpp"

namespace fattn_bench {
namespace {

nlohmann::ordered_json traffic_json(const Traffic& t) {
  return {{"Q", t.q}, {"K", t.k}, {"V", t.v}, {"O", t.o}, {"scores", t.scores}, {"LSE", t.lse}};
}

nlohmann::ordered_json softmax_json(const SoftmaxFlops& f) {
  return {{"max", f.max}, {"exp", f.exp}, {"sum", f.sum}, {"scale", f.scale}};
}

// One row. matmul_flops and softmax are the work the row's kernel or stage does;
// ai = (matmul_flops + softmax total) / bytes.
nlohmann::ordered_json row(const Shape& s, const char* impl, const char* stage,
                           std::int64_t matmul_flops, const SoftmaxFlops& softmax,
                           const Traffic& traffic) {
  const std::int64_t bytes = traffic.total();
  const std::int64_t all_flops = matmul_flops + softmax.total();
  return {{"dtype", s.element_bytes == kFloatBytes ? "float32" : "16-bit"},
          {"element_bytes", s.element_bytes},
          {"S", s.q_len},
          {"D", s.head_dim},
          {"impl", impl},
          {"stage", stage},
          {"matmul_flops", matmul_flops},
          {"softmax_flops", softmax_json(softmax)},
          {"traffic_bytes", traffic_json(traffic)},
          {"bytes", bytes},
          {"ai", static_cast<double>(all_flops) / static_cast<double>(bytes)},
          {"ai_matmul_only", static_cast<double>(matmul_flops) / static_cast<double>(bytes)}};
}

Traffic sum(const Traffic& a, const Traffic& b) {
  return {a.q + b.q, a.k + b.k, a.v + b.v, a.o + b.o, a.scores + b.scores, a.lse + b.lse};
}

}  // namespace

nlohmann::ordered_json model_table(std::int64_t head_dim, int query_tile_rows) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (std::int64_t element_bytes : {kFloatBytes, kHalfBytes}) {
    for (std::int64_t seq : kModelSeqLens) {
      Shape s;
      s.q_len = s.kv_len = seq;
      s.head_dim = head_dim;
      s.element_bytes = element_bytes;
      const SoftmaxFlops softmax = softmax_flops(s), none{};
      Traffic naive_total;
      for (NaiveStage stage : kNaiveStages) {
        const bool is_softmax = stage == NaiveStage::softmax;
        const Traffic t = naive_stage_traffic(s, stage);
        naive_total = sum(naive_total, t);
        rows.push_back(row(s, "naive", to_string(stage),
                           is_softmax ? 0 : naive_stage_flops(s, stage), is_softmax ? softmax : none,
                           t));
      }
      rows.push_back(row(s, "naive", "total", flops(s), softmax, naive_total));
      rows.push_back(row(s, "fused", "total", flops(s), softmax, fused_traffic(s)));
      Traffic reread;  // Q and O once; K and V per query tile (model.hpp)
      reread.q = reread.o = fused_traffic(s).q;
      reread.k = reread.v = (fused_bytes_kv_reread(s, query_tile_rows) - 2 * reread.q) / 2;
      nlohmann::ordered_json r = row(s, "fused_kv_reread", "total", flops(s), softmax, reread);
      r["query_tile_rows"] = query_tile_rows;
      rows.push_back(r);
    }
  }
  return rows;
}

}  // namespace fattn_bench
