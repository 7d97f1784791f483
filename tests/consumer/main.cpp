// Uses the installed fattn package: one fused forward pass (causal, a sliding window, a
// softcap) checked against the float64 reference row by row. Exits non-zero on any mismatch.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <fattn/fattn.hpp>

int main() {
  const std::int64_t batch = 1, heads = 2, seq = 77, head_dim = 64;
  std::vector<float> q(batch * heads * seq * head_dim), k(q.size()), v(q.size());
  std::vector<float> out(q.size(), NAN);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = normal(rng);

  using fattn::TensorView;
  const auto qv = TensorView::bhsd(q.data(), batch, heads, seq, head_dim);
  const auto kv = TensorView::bhsd(k.data(), batch, heads, seq, head_dim);
  const auto vv = TensorView::bhsd(v.data(), batch, heads, seq, head_dim);
  fattn::Options options;
  options.causal = fattn::Causal::top_left;
  options.window_left = 20;  // a sliding window and a softcap, from the installed headers
  options.softcap = 5.0;
  fattn::attention_forward(qv, kv, vv, TensorView::bhsd(out.data(), batch, heads, seq, head_dim),
                           nullptr, options);

  double worst = 0.0;
  std::vector<double> ref(head_dim);
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t i = 0; i < seq; ++i) {
      fattn::reference_row(qv, kv, vv, options, 0, h, i, ref.data());
      for (std::int64_t d = 0; d < head_dim; ++d)
        worst = std::fmax(worst, std::fabs(out[(h * seq + i) * head_dim + d] - ref[d]));
    }
  std::printf("fattn %s (%s): max abs error vs reference %.3g\n", fattn::version(),
              fattn::to_string(fattn::best_cpu_isa()), worst);
  return worst <= 1e-5 ? 0 : 1;
}
