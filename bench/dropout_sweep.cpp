// fattn-bench --dropout (see dropout_sweep.hpp).
#include "dropout_sweep.hpp"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <random>

#include <nlohmann/json.hpp>

#include "ceilings.hpp"
#include "contention.hpp"
#include "report.hpp"
#include "timing.hpp"

namespace fattn_bench {
namespace {

// (B, H, S, D) of the case's dtype: float32 values or 16-bit bits.
struct Tensor {
  std::vector<float> f32;
  std::vector<std::uint16_t> b16;
  fattn::DType dtype;
  std::int64_t B, H, S, D;
  Tensor(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d, fattn::DType t,
         std::mt19937_64* engine)
      : dtype(t), B(b), H(h), S(s), D(d) {
    const auto n = static_cast<std::size_t>(b * h * s * d);
    std::normal_distribution<float> normal;
    if (t == fattn::DType::float32) {
      f32.resize(n);
      for (float& x : f32) x = engine ? normal(*engine) + 1e-6f : 0.0f;
    } else {
      b16.resize(n);
      for (std::uint16_t& x : b16) x = engine ? fattn::to_16bit(normal(*engine) + 1e-6f, t) : 0;
    }
  }
  fattn::TensorView view() {
    void* data = f32.empty() ? static_cast<void*>(b16.data()) : static_cast<void*>(f32.data());
    return fattn::TensorView::bhsd(data, B, H, S, D, dtype);
  }
};

// (median ms of a, median ms of b, median of the per-repetition ratios b / a), the two
// alternated, the first of each repetition alternating too.
struct Pair {
  double a_ms, b_ms, ratio;
};
Pair alternated(const std::function<void()>& a, const std::function<void()>& b, int reps, int warmup) {
  for (int w = 0; w < warmup; ++w) a(), b();
  std::vector<double> ta, tb, ratio;
  for (int r = 0; r < reps; ++r) {
    double x, y;
    if (r % 2) y = milliseconds(b), x = milliseconds(a);
    else x = milliseconds(a), y = milliseconds(b);
    ta.push_back(x), tb.push_back(y), ratio.push_back(y / x);
  }
  return {median(ta), median(tb), median(ratio)};
}

DropoutResult measure(const DropoutConfig& c, fattn::DType dtype, std::int64_t S, std::int64_t D) {
  std::mt19937_64 engine(c.seed);
  Tensor q(c.batch, c.q_heads, S, D, dtype, &engine), k(c.batch, c.kv_heads, S, D, dtype, &engine),
      v(c.batch, c.kv_heads, S, D, dtype, &engine), dout(c.batch, c.q_heads, S, D, dtype, &engine);
  Tensor out(c.batch, c.q_heads, S, D, dtype, nullptr), out_dropped = out, dq = out, dk = k, dv = v;
  std::vector<float> lse(static_cast<std::size_t>(c.batch * c.q_heads * S));
  std::vector<float> lse_dropped = lse;
  const fattn::TensorView lse_view = fattn::TensorView::lse(lse.data(), c.batch, c.q_heads, S);
  const fattn::TensorView lse_dropped_view =
      fattn::TensorView::lse(lse_dropped.data(), c.batch, c.q_heads, S);
  fattn::Options none;
  none.causal = c.causal;
  none.num_threads = c.threads;
  none.impl = fattn::Impl::fused;
  none.isa = c.isa;
  fattn::Options dropped = none;
  dropped.dropout_p = c.p;
  dropped.dropout_seed = c.seed;
  const CpuSharing sharing;
  const Pair forward = alternated(
      [&] { fattn::attention_forward(q.view(), k.view(), v.view(), out.view(), &lse_view, none); },
      [&] {
        fattn::attention_forward(q.view(), k.view(), v.view(), out_dropped.view(), &lse_dropped_view,
                                 dropped);
      },
      c.reps, c.warmup);
  const Pair backward = alternated(
      [&] {
        fattn::attention_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse_view,
                                  nullptr, dq.view(), dk.view(), dv.view(), none);
      },
      [&] {
        fattn::attention_backward(q.view(), k.view(), v.view(), out_dropped.view(), dout.view(),
                                  lse_dropped_view, nullptr, dq.view(), dk.view(), dv.view(), dropped);
      },
      c.reps, c.warmup);
  DropoutResult r;
  r.dtype = dtype, r.seq = S, r.head_dim = D;
  r.forward_ms = forward.a_ms, r.forward_dropout_ms = forward.b_ms, r.forward_ratio = forward.ratio;
  r.backward_ms = backward.a_ms, r.backward_dropout_ms = backward.b_ms;
  r.backward_ratio = backward.ratio;
  r.others_cores = sharing.others_cores();
  // The mask's keep rate over the first head's (query, key) pairs, from the library's mask.
  const std::int64_t n = std::min<std::int64_t>(S, 512);
  std::vector<std::uint8_t> keep(static_cast<std::size_t>(n * n));
  fattn::dropout_mask(dropped, 1, 1, n, n, keep.data());
  r.kept = static_cast<double>(std::count(keep.begin(), keep.end(), 1)) / static_cast<double>(keep.size());
  return r;
}

}  // namespace

std::vector<DropoutResult> run_dropout_sweep(const DropoutConfig& config) {
  std::vector<DropoutResult> results;
  for (const fattn::DType dtype : config.dtypes)
    for (const std::int64_t D : config.head_dims)
      for (const std::int64_t S : config.seq_lens) {
        std::fprintf(stderr, "%s D=%lld S=%lld ...\n", fattn::to_string(dtype),
                     static_cast<long long>(D), static_cast<long long>(S));
        results.push_back(measure(config, dtype, S, D));
      }
  return results;
}

void print_dropout_table(std::FILE* out, const DropoutConfig& c,
                         const std::vector<DropoutResult>& results) {
  std::fprintf(out,
               "\ndropout p=%.2f against p=0, fused (isa %s), B=%lld Hq=%lld Hkv=%lld, %s, %d threads, "
               "median of %d repetitions (alternated); ratio: median of the per-repetition "
               "ratios (dropout / none)\n\n",
               c.p, fattn::to_string(c.isa), static_cast<long long>(c.batch), static_cast<long long>(c.q_heads),
               static_cast<long long>(c.kv_heads), fattn::to_string(c.causal), c.threads, c.reps);
  print_table_header(out, {"dtype", "D", "S", "forward ms", "with dropout", "ratio",
                           "backward ms", "with dropout", "ratio", "kept", "others' cores"});
  for (const DropoutResult& r : results)
    std::fprintf(out, "| %s | %lld | %lld | %.2f | %.2f | %.3fx | %.2f | %.2f | %.3fx | %.4f | %.2f%s |\n",
                 fattn::to_string(r.dtype), static_cast<long long>(r.head_dim),
                 static_cast<long long>(r.seq), r.forward_ms, r.forward_dropout_ms, r.forward_ratio,
                 r.backward_ms, r.backward_dropout_ms, r.backward_ratio, r.kept, r.others_cores,
                 r.others_cores > kBusyCores ? " (busy)" : "");
}

void write_dropout_json(const std::string& path, const DropoutConfig& c,
                        const std::vector<DropoutResult>& results) {
  nlohmann::json j;
  j["config"] = {{"dropout_p", c.p}, {"isa", fattn::to_string(c.isa)}, {"batch", c.batch}, {"q_heads", c.q_heads},
                 {"kv_heads", c.kv_heads}, {"causal", fattn::to_string(c.causal)},
                 {"threads", c.threads}, {"reps", c.reps}, {"warmup", c.warmup},
                 {"cpu", cpu_model_name()}, {"fattn", fattn::version()}, {"date", iso8601_now()}};
  for (const DropoutResult& r : results)
    j["results"].push_back({{"dtype", fattn::to_string(r.dtype)}, {"D", r.head_dim}, {"S", r.seq},
                            {"forward_ms", r.forward_ms}, {"forward_dropout_ms", r.forward_dropout_ms},
                            {"forward_ratio", r.forward_ratio}, {"backward_ms", r.backward_ms},
                            {"backward_dropout_ms", r.backward_dropout_ms},
                            {"backward_ratio", r.backward_ratio}, {"kept", r.kept},
                            {"others_cores", r.others_cores}});
  std::ofstream(path) << j.dump(2) << "\n";
}

}  // namespace fattn_bench
