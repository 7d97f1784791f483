// ggml-fattn tests — FLASH_ATTN_EXT on the fattn backend against a float64 reference,
// beside ggml's CPU kernel on the same graph: fattn's error ≤ 2× ggml's own (plus float32
// rounding), on the graphs llama.cpp builds (K/V as strided views of a cache, a causal
// mask with the cache's unused cells hidden, sliding windows, ALiBi, softcap, sinks, GQA,
// two sequences in one batch) and on masks no band describes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fattn/fattn.hpp"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-fattn.h"
#include "ggml.h"

namespace {

constexpr float kNegInf = -INFINITY;

enum class MaskKind { causal, window, alibi, random, two_sequences, hidden, none };

struct Case {
  ggml_type type;
  std::int64_t D, Hq, Hkv, n_q, n_past, n_ctx;  // cache cells n_ctx ≥ n_past + n_q (the rest unused)
  MaskKind mask;
  float softcap = 0.0f, max_bias = 0.0f;
  bool sinks = false;
  std::int64_t window = 0;
};

std::string name(const Case& c) {
  const char* masks[] = {"causal", "window", "alibi", "random", "two_sequences", "hidden", "none"};
  return std::string(ggml_type_name(c.type)) + "_D" + std::to_string(c.D) + "_H" +
         std::to_string(c.Hq) + "x" + std::to_string(c.Hkv) + "_q" + std::to_string(c.n_q) +
         "_past" + std::to_string(c.n_past) + "_" + masks[static_cast<int>(c.mask)] +
         (c.softcap != 0.0f ? "_softcap" : "") + (c.sinks ? "_sinks" : "");
}

// The mask llama.cpp builds (0 visible, −inf hidden; ALiBi: −|distance|), n_kv × rows_pad.
std::vector<float> make_mask(const Case& c, std::int64_t n_kv, std::int64_t rows_pad, std::mt19937& rng) {
  std::vector<float> m(static_cast<std::size_t>(n_kv * rows_pad), kNegInf);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < c.n_q; ++i) {
    const std::int64_t pos = c.n_past + i;  // the query's position; cell j holds position j
    for (std::int64_t j = 0; j < n_kv; ++j) {
      float& x = m[static_cast<std::size_t>(i * n_kv + j)];
      const bool causal = j <= pos;
      switch (c.mask) {
        case MaskKind::causal: x = causal ? 0.0f : kNegInf; break;
        case MaskKind::window: x = causal && pos - j < c.window ? 0.0f : kNegInf; break;
        case MaskKind::alibi: x = causal ? -static_cast<float>(pos - j) : kNegInf; break;
        case MaskKind::random: x = uniform(rng) < -0.6f ? kNegInf : uniform(rng); break;
        case MaskKind::two_sequences:  // cells alternate between sequences; so do queries
          x = causal && (j % 2 == i % 2) ? 0.0f : kNegInf; break;
        case MaskKind::hidden: x = i == 1 ? kNegInf : (causal ? 0.0f : kNegInf); break;
        case MaskKind::none: break;
      }
    }
  }
  return m;
}

// The queries as ggml's kernel multiplies them: rounded to a 16-bit cache's type (fattn
// rounds them alike); a q8_0 cache's are taken exact (fattn multiplies float32 queries
// with the widened cache, where ggml quantizes them to q8_0 too: the reference is exact).
float round_to(ggml_type type, float x) {
  if (type == GGML_TYPE_F16) return ggml_fp16_to_fp32(ggml_fp32_to_fp16(x));
  if (type == GGML_TYPE_BF16) return ggml_bf16_to_fp32(ggml_fp32_to_bf16(x));
  return x;
}

void store(ggml_type type, float x, void* dst) {
  if (type == GGML_TYPE_F16) *static_cast<ggml_fp16_t*>(dst) = ggml_fp32_to_fp16(x);
  else if (type == GGML_TYPE_BF16) *static_cast<ggml_bf16_t*>(dst) = ggml_fp32_to_bf16(x);
  else *static_cast<float*>(dst) = x;
}

// values as a cache of `type` with rows of `row` values: the bytes to set, and values
// replaced by what the cache holds (rounded, or quantized by ggml and widened back).
std::vector<std::uint8_t> cache_bytes(ggml_type type, std::int64_t row, std::vector<float>& values) {
  const auto n = static_cast<std::int64_t>(values.size());
  if (type == GGML_TYPE_Q8_0) {
    std::vector<std::uint8_t> raw(static_cast<std::size_t>(n / row) * ggml_row_size(type, row));
    ggml_quantize_chunk(type, values.data(), raw.data(), 0, n / row, row, nullptr);
    ggml_get_type_traits(type)->to_float(raw.data(), values.data(), n);
    return raw;
  }
  std::vector<std::uint8_t> raw(static_cast<std::size_t>(n) * ggml_type_size(type));
  for (std::size_t e = 0; e < values.size(); ++e) {
    values[e] = round_to(type, values[e]);
    store(type, values[e], raw.data() + e * ggml_type_size(type));
  }
  return raw;
}

float slope(float max_bias, std::int64_t n_head, std::int64_t h) {
  if (max_bias <= 0.0f) return 1.0f;
  const auto log2 = static_cast<std::int64_t>(1) << static_cast<int>(std::floor(std::log2(n_head)));
  const double m0 = std::pow(2.0, -max_bias / static_cast<double>(log2));
  const double m1 = std::pow(2.0, -(max_bias / 2.0) / static_cast<double>(log2));
  return static_cast<float>(h < log2 ? std::pow(m0, h + 1) : std::pow(m1, 2 * (h - log2) + 1));
}

struct Outputs {
  std::vector<float> ggml_cpu, fattn, reference;
  ggml_backend_fattn_counts counts{};
};

Outputs run_case(const Case& c) {
  std::mt19937 rng(1234 + static_cast<unsigned>(c.D * 7 + c.n_q * 13 + c.n_past));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::int64_t n_kv = std::min(c.n_ctx, (c.n_past + c.n_q + 255) / 256 * 256);  // as llama.cpp pads
  const std::int64_t rows_pad = (c.n_q + 63) / 64 * 64;
  const bool masked = c.mask != MaskKind::none;

  ggml_init_params params{64 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true};
  ggml_context* ctx = ggml_init(params);
  // The cache as llama.cpp keeps it: [D·Hkv, n_ctx]; K and V are views [D, n_kv, Hkv].
  ggml_tensor* k_cache = ggml_new_tensor_2d(ctx, c.type, c.D * c.Hkv, c.n_ctx);
  ggml_tensor* v_cache = ggml_new_tensor_2d(ctx, c.type, c.D * c.Hkv, c.n_ctx);
  ggml_tensor* q_rows = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.D, c.Hq, c.n_q);
  ggml_tensor* mask = masked ? ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_kv, rows_pad) : nullptr;
  ggml_tensor* sinks = c.sinks ? ggml_new_tensor_1d(ctx, GGML_TYPE_F32, c.Hq) : nullptr;
  auto cache_view = [&](ggml_tensor* cache) {
    ggml_tensor* t = ggml_view_3d(ctx, cache, c.D, c.Hkv, n_kv, ggml_row_size(c.type, c.D),
                                  cache->nb[1], 0);
    return ggml_permute(ctx, t, 0, 2, 1, 3);
  };
  ggml_tensor* q = ggml_permute(ctx, q_rows, 0, 2, 1, 3);
  ggml_tensor* out = ggml_flash_attn_ext(ctx, q, cache_view(k_cache), cache_view(v_cache), mask,
                                         1.0f / std::sqrt(static_cast<float>(c.D)), c.max_bias, c.softcap);
  ggml_flash_attn_ext_add_sinks(out, sinks);
  ggml_cgraph* graph = ggml_new_graph(ctx);
  ggml_build_forward_expand(graph, out);
  ggml_backend_buffer_t buffer = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_cpu_buffer_type());

  // Inputs: fresh random values, some large logits.
  std::vector<float> kf(static_cast<std::size_t>(c.D * c.Hkv * c.n_ctx)), vf(kf.size()),
      qf(static_cast<std::size_t>(c.D * c.Hq * c.n_q)), sink_values(static_cast<std::size_t>(c.Hq));
  for (float& x : kf) x = normal(rng);
  for (float& x : vf) x = normal(rng);
  for (float& x : qf) x = normal(rng) * 1.5f;
  for (float& x : sink_values) x = normal(rng) * 3.0f;
  const std::vector<std::uint8_t> k_raw = cache_bytes(c.type, c.D * c.Hkv, kf);
  const std::vector<std::uint8_t> v_raw = cache_bytes(c.type, c.D * c.Hkv, vf);
  ggml_backend_tensor_set(k_cache, k_raw.data(), 0, ggml_nbytes(k_cache));
  ggml_backend_tensor_set(v_cache, v_raw.data(), 0, ggml_nbytes(v_cache));
  ggml_backend_tensor_set(q_rows, qf.data(), 0, ggml_nbytes(q_rows));
  std::vector<float> mf;
  if (masked) {
    mf = make_mask(c, n_kv, rows_pad, rng);
    std::vector<ggml_fp16_t> mh(mf.size());
    for (std::size_t e = 0; e < mf.size(); ++e) {
      mh[e] = ggml_fp32_to_fp16(mf[e]);
      mf[e] = ggml_fp16_to_fp32(mh[e]);
    }
    ggml_backend_tensor_set(mask, mh.data(), 0, ggml_nbytes(mask));
  }
  if (sinks) ggml_backend_tensor_set(sinks, sink_values.data(), 0, ggml_nbytes(sinks));

  Outputs r;
  const std::size_t n_out = static_cast<std::size_t>(ggml_nelements(out));
  auto compute = [&](ggml_backend_t backend, std::vector<float>* result) {
    std::vector<float> poison(n_out, NAN);
    ggml_backend_tensor_set(out, poison.data(), 0, ggml_nbytes(out));
    EXPECT_EQ(ggml_backend_graph_compute(backend, graph), GGML_STATUS_SUCCESS);
    result->resize(n_out);
    ggml_backend_tensor_get(out, result->data(), 0, ggml_nbytes(out));
  };
  ggml_backend_t cpu = ggml_backend_cpu_init();
  ggml_backend_cpu_set_n_threads(cpu, 2);
  compute(cpu, &r.ggml_cpu);
  ggml_backend_t fattn = ggml_backend_fattn_init();
  ggml_backend_fattn_set_n_threads(fattn, 2);
  EXPECT_TRUE(ggml_backend_supports_op(fattn, out));
  compute(fattn, &r.fattn);
  r.counts = ggml_backend_fattn_get_counts(fattn);
  ggml_backend_free(fattn);
  ggml_backend_free(cpu);
  ggml_backend_buffer_free(buffer);
  ggml_free(ctx);

  // float64 reference, ggml's semantics: q rounded to the cache's type for Q·Kᵀ;
  // s = scale·q·k, softcap, + slope·mask; sinks join the denominator; out [D, Hq, n_q].
  r.reference.assign(n_out, 0.0f);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  for (std::int64_t i = 0; i < c.n_q; ++i)
    for (std::int64_t h = 0; h < c.Hq; ++h) {
      const std::int64_t hk = h / (c.Hq / c.Hkv);
      std::vector<double> s(static_cast<std::size_t>(n_kv), -INFINITY), o(static_cast<std::size_t>(c.D), 0.0);
      double max = -INFINITY;
      for (std::int64_t j = 0; j < n_kv; ++j) {
        const double m = masked ? mf[static_cast<std::size_t>(i * n_kv + j)] : 0.0;
        if (m == -INFINITY) continue;
        double dot = 0.0;
        for (std::int64_t d = 0; d < c.D; ++d)
          dot += static_cast<double>(round_to(c.type, qf[static_cast<std::size_t>((i * c.Hq + h) * c.D + d)])) *
                 kf[static_cast<std::size_t>(j * c.Hkv * c.D + hk * c.D + d)];
        double x = dot * scale;
        if (c.softcap != 0.0f) x = c.softcap * std::tanh(x / c.softcap);
        x += static_cast<double>(slope(c.max_bias, c.Hq, h)) * m;
        s[static_cast<std::size_t>(j)] = x;
        max = std::max(max, x);
      }
      const double sink = c.sinks ? sink_values[static_cast<std::size_t>(h)] : -INFINITY;
      max = std::max(max, sink);
      double sum = max == -INFINITY ? 0.0 : std::exp(sink - max);
      for (std::int64_t j = 0; j < n_kv; ++j) {
        if (s[static_cast<std::size_t>(j)] == -INFINITY) continue;
        const double p = std::exp(s[static_cast<std::size_t>(j)] - max);
        sum += p;
        for (std::int64_t d = 0; d < c.D; ++d)
          o[static_cast<std::size_t>(d)] += p * vf[static_cast<std::size_t>(j * c.Hkv * c.D + hk * c.D + d)];
      }
      for (std::int64_t d = 0; d < c.D; ++d)
        r.reference[static_cast<std::size_t>((i * c.Hq + h) * c.D + d)] =
            static_cast<float>(sum == 0.0 ? 0.0 : o[static_cast<std::size_t>(d)] / sum);
    }
  return r;
}

double max_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double e = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    e = std::max(e, std::abs(static_cast<double>(got[i]) - ref[i]));
  }
  return e;
}

class BackendTest : public ::testing::TestWithParam<Case> {};

TEST_P(BackendTest, WithinTwiceGgmlsError) {
  const Case& c = GetParam();
  const Outputs r = run_case(c);
  const double ggml_error = max_error(r.ggml_cpu, r.reference);
  const double fattn_error = max_error(r.fattn, r.reference);
  // 2× ggml's error, and never below float32 rounding of the outputs (ggml's float32
  // path can be exact to a few ulps where fattn's exp2 differs by as many).
  EXPECT_LE(fattn_error, 2.0 * ggml_error + 2e-6) << "ggml's error " << ggml_error;
  EXPECT_EQ(r.counts.on_fattn, 1);
  EXPECT_EQ(r.counts.on_ggml_cpu, 0);
}

std::vector<Case> cases() {
  std::vector<Case> all;
  for (ggml_type type : {GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_F32, GGML_TYPE_Q8_0}) {
    all.push_back({type, 128, 32, 8, 1, 700, 1024, MaskKind::causal});    // decode
    all.push_back({type, 64, 8, 2, 37, 300, 1024, MaskKind::causal});     // a prefill chunk
    all.push_back({type, 128, 8, 8, 70, 0, 512, MaskKind::causal});       // a first prefill
    if (type != GGML_TYPE_Q8_0)  // q8_0 rows are blocks of 32
      all.push_back({type, 80, 4, 1, 9, 200, 512, MaskKind::window, 0.0f, 0.0f, false, 64});
    else
      all.push_back({type, 96, 4, 1, 9, 200, 512, MaskKind::window, 0.0f, 0.0f, false, 64});
    all.push_back({type, 64, 8, 8, 17, 100, 512, MaskKind::alibi, 0.0f, 8.0f});
    all.push_back({type, 96, 4, 2, 5, 60, 256, MaskKind::random});
    all.push_back({type, 64, 4, 2, 12, 80, 256, MaskKind::two_sequences});
    all.push_back({type, 256, 4, 1, 3, 90, 256, MaskKind::hidden, 30.0f, 0.0f, true});
    all.push_back({type, type == GGML_TYPE_Q8_0 ? 32 : 112, 4, 4, 6, 40, 64, MaskKind::none,
                   0.0f, 0.0f, true});
  }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Graphs, BackendTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return name(info.param); });

// What supports_op refuses: ggml's kernel keeps those nodes (never a wrong answer).
TEST(Backend, RefusesWhatItCannotMatch) {
  ggml_init_params params{48 * ggml_tensor_overhead(), nullptr, true};
  ggml_context* ctx = ggml_init(params);
  ggml_backend_dev_t dev = ggml_backend_reg_dev_get(ggml_backend_fattn_reg(), 0);
  auto attention = [&](ggml_type k_type, ggml_type v_type, std::int64_t dk, std::int64_t dv) {
    ggml_tensor* q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, dk, 4, 8, 1);
    ggml_tensor* k = ggml_new_tensor_4d(ctx, k_type, dk, 64, 2, 1);
    ggml_tensor* v = ggml_new_tensor_4d(ctx, v_type, dv, 64, 2, 1);
    return ggml_flash_attn_ext(ctx, q, k, v, nullptr, 0.1f, 0.0f, 0.0f);
  };
  EXPECT_TRUE(ggml_backend_dev_supports_op(dev, attention(GGML_TYPE_F16, GGML_TYPE_F16, 128, 128)));
  EXPECT_TRUE(ggml_backend_dev_supports_op(dev, attention(GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 128, 128)));
  EXPECT_FALSE(ggml_backend_dev_supports_op(dev, attention(GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 128, 128)));
  EXPECT_FALSE(ggml_backend_dev_supports_op(dev, attention(GGML_TYPE_Q8_0, GGML_TYPE_F16, 128, 128)));
  EXPECT_FALSE(ggml_backend_dev_supports_op(dev, attention(GGML_TYPE_F16, GGML_TYPE_BF16, 128, 128)));
  EXPECT_FALSE(ggml_backend_dev_supports_op(dev, attention(GGML_TYPE_F16, GGML_TYPE_F16, 192, 128)));
  EXPECT_FALSE(ggml_backend_dev_supports_op(dev, attention(GGML_TYPE_F16, GGML_TYPE_F16, 576, 576)));
  ggml_tensor* sparse = attention(GGML_TYPE_F16, GGML_TYPE_F16, 64, 64);
  ggml_flash_attn_ext_set_n_kv_max(sparse, 8);
  EXPECT_FALSE(ggml_backend_dev_supports_op(dev, sparse));
  ggml_tensor* mul = ggml_mul_mat(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 8, 8),
                                  ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 8, 8));
  EXPECT_FALSE(ggml_backend_dev_supports_op(dev, mul));
  ggml_free(ctx);
}

// fattn's q8_0 format is ggml's block_q8_0: fattn quantizes as ggml does, byte for byte,
// and widens as ggml does, value for value.
TEST(Backend, Q8_0IsGgmlsBlockFormat) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const std::int64_t n = 32 * 64;
  std::vector<float> values(static_cast<std::size_t>(n));
  for (float& x : values) x = normal(rng);
  values[5] = 0.0f;
  std::fill(values.begin() + 64, values.begin() + 96, 0.0f);  // an all-zero block: scale 0
  std::vector<std::uint8_t> ours(static_cast<std::size_t>(fattn::q8_0_row_bytes(n))),
      theirs(ggml_row_size(GGML_TYPE_Q8_0, n));
  ASSERT_EQ(ours.size(), theirs.size());
  fattn::quantize_q8_0(values.data(), n, ours.data());
  ggml_quantize_chunk(GGML_TYPE_Q8_0, values.data(), theirs.data(), 0, 1, n, nullptr);
  EXPECT_EQ(ours, theirs);
  std::vector<float> ours_wide(values.size()), theirs_wide(values.size());
  fattn::dequantize_q8_0(theirs.data(), n, ours_wide.data());
  ggml_get_type_traits(GGML_TYPE_Q8_0)->to_float(theirs.data(), theirs_wide.data(), n);
  EXPECT_EQ(ours_wide, theirs_wide);
}

// A node fattn's checks refuse at run time (here a NaN scale, which supports_op would have
// refused) runs on ggml's CPU kernel, found through ggml's registry: the same bits as the
// CPU backend's, counted, never a failed graph.
TEST(Backend, RefusedAtRunTimeRunsOnGgmlsKernel) {
  ggml_init_params params{16 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true};
  ggml_context* ctx = ggml_init(params);
  ggml_tensor* q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 64, 5, 4, 1);
  ggml_tensor* k = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 64, 96, 2, 1);
  ggml_tensor* v = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 64, 96, 2, 1);
  ggml_tensor* out = ggml_flash_attn_ext(ctx, q, k, v, nullptr, NAN, 0.0f, 0.0f);
  ggml_cgraph* graph = ggml_new_graph(ctx);
  ggml_build_forward_expand(graph, out);
  ggml_backend_buffer_t buffer = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_cpu_buffer_type());
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (ggml_tensor* t : {q, k, v}) {
    std::vector<float> values(static_cast<std::size_t>(ggml_nelements(t)));
    for (float& x : values) x = normal(rng);
    const std::vector<std::uint8_t> raw = cache_bytes(t->type, t->ne[0], values);
    ggml_backend_tensor_set(t, raw.data(), 0, ggml_nbytes(t));
  }
  auto compute = [&](ggml_backend_t backend) {
    std::vector<float> result(static_cast<std::size_t>(ggml_nelements(out)), 1.0f);
    ggml_backend_tensor_set(out, result.data(), 0, ggml_nbytes(out));
    EXPECT_EQ(ggml_backend_graph_compute(backend, graph), GGML_STATUS_SUCCESS);
    ggml_backend_tensor_get(out, result.data(), 0, ggml_nbytes(out));
    return result;
  };
  ggml_backend_t cpu = ggml_backend_cpu_init();
  ggml_backend_t fattn = ggml_backend_fattn_init();
  EXPECT_FALSE(ggml_backend_supports_op(fattn, out));
  const std::vector<float> by_cpu = compute(cpu), by_fattn = compute(fattn);
  EXPECT_EQ(std::memcmp(by_cpu.data(), by_fattn.data(), by_cpu.size() * sizeof(float)), 0);
  const ggml_backend_fattn_counts counts = ggml_backend_fattn_get_counts(fattn);
  EXPECT_EQ(counts.on_fattn, 0);
  EXPECT_EQ(counts.on_ggml_cpu, 1);
  ggml_backend_free(fattn);
  ggml_backend_free(cpu);
  ggml_backend_buffer_free(buffer);
  ggml_free(ctx);
}

}  // namespace
