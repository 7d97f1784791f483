// fattn — validation of a KV-cache call: every check runs before the append writes.
#include <algorithm>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "model/checked.hpp"
#include "model/checks.hpp"
#include "model/kv_cache_problem.hpp"

namespace fattn::detail {
namespace {

struct Named {
  const char* name;
  Extent extent;
};

std::int32_t element(const TensorView& t, std::int64_t i, std::int64_t j = 0) {
  return static_cast<const std::int32_t*>(t.data)[i * t.stride(0) + j * (t.rank > 1 ? t.stride(1) : 0)];
}

// Cache capacity per sequence, in keys, and whether the block table is valid for the keys
// each sequence will hold. A contiguous cache is one page of S_cache keys per sequence.
struct Geometry {
  bool paged;
  std::int64_t batch, kv_heads;
  PageGeometry pages;
  Extent k, v;  // the caches' bytes
};

Geometry check_cache(const TensorView& q, const KvCache& cache, DType kv_dtype) {
  const std::int64_t batch = q.size(0), head_dim = q.size(3);
  const Extent k = check_view("k_cache", cache.k, 4, kv_dtype, q.device);
  const Extent v = check_view("v_cache", cache.v, 4, kv_dtype, q.device);
  for (int d = 0; d < 4; ++d)
    expect_size("v_cache", cache.v, d, "as k_cache", dim_name("k_cache", d), cache.k.size(d));
  expect_size("k_cache", cache.k, 3, "head dim", "q.size(3)", head_dim);
  const std::int64_t kv_heads = cache.k.size(1);
  if (q.size(1) % kv_heads != 0) {
    std::ostringstream m;
    m << "q.size(1) (query heads) must be a multiple of k_cache.size(1) (kv heads) = " << kv_heads
      << ", got " << q.size(1);
    fail(m.str());
  }
  if (!cache.block_table) {
    expect_size("k_cache", cache.k, 0, "batch", "q.size(0)", batch);
    return {false, batch, kv_heads, {cache.k.size(2), cache.k.size(2), cache.k.size(0), {0, 0}}, k, v};
  }
  return {true, batch, kv_heads,
          check_page_table(*cache.block_table, "k_cache", cache.k, batch, "q.size(0)", q.device), k, v};
}

// The seqlens view: (B) int32 on q's device; required with an append. Its bytes (empty
// without seqlens).
Extent check_seqlens_view(const KvCache& cache, const Geometry& g, std::int64_t new_len,
                          Device device) {
  if (!cache.seqlens) {
    if (new_len > 0) fail("k_new and v_new need seqlens: the position at which to append");
    return {0, 0};
  }
  const Extent extent = check_view("seqlens", *cache.seqlens, 1, DType::int32, device);
  expect_size("seqlens", *cache.seqlens, 0, "batch", "q.size(0)", g.batch);
  return extent;
}

// Keys per sequence before and after the append: seqlens[b] >= 0 and
// seqlens[b] + new_len <= capacity, both within int32 (host memory: read here).
void check_lengths(const KvCache& cache, const Geometry& g, std::int64_t new_len,
                   std::vector<std::int32_t>* old_lengths, std::vector<std::int32_t>* lengths) {
  if (!cache.seqlens) return;
  const TensorView& s = *cache.seqlens;
  for (std::int64_t b = 0; b < g.batch; ++b) {
    const std::int64_t before = element(s, b), after = before + new_len;
    if (before < 0) {
      std::ostringstream m;
      m << "seqlens[" << b << "] must be >= 0, got " << before;
      fail(m.str());
    }
    if (after > g.pages.capacity || after > std::numeric_limits<std::int32_t>::max()) {
      std::ostringstream m;
      m << "seqlens[" << b << "] + k_new.size(2) = " << before << " + " << new_len << " = "
        << after << " keys exceed the cache's capacity of " << g.pages.capacity
        << " keys per sequence ("
        << (g.paged ? "block_table.size(1) × block_size" : "k_cache.size(2)") << ")";
      fail(m.str());
    }
    old_lengths->push_back(static_cast<std::int32_t>(before));
    lengths->push_back(static_cast<std::int32_t>(after));
  }
}

// Every block a sequence uses names a page of the cache.
void check_block_table(const KvCache& cache, const Geometry& g,
                       const std::vector<std::int32_t>& lengths) {
  if (!g.paged) return;
  std::vector<std::int64_t> keys(lengths.begin(), lengths.end());
  if (keys.empty()) keys.assign(static_cast<std::size_t>(g.batch), g.pages.capacity);
  check_pages_used(*cache.block_table, "k_cache", g.pages, keys);
}

// No two sequences append to the same slot of a page.
void check_append_slots(const KvCache& cache, const Geometry& g,
                        const std::vector<std::int32_t>& old_lengths, std::int64_t new_len) {
  if (!g.paged || new_len == 0) return;
  struct Slots {
    std::int64_t page, first, last, b;
  };
  std::vector<Slots> writes;
  for (std::int64_t b = 0; b < g.batch; ++b) {
    const std::int64_t begin = old_lengths[static_cast<std::size_t>(b)], end = begin + new_len;
    const std::int64_t bs = g.pages.block_size;
    for (std::int64_t j = begin; j < end; j = (j / bs + 1) * bs)
      writes.push_back({element(*cache.block_table, b, j / bs), j % bs,
                        std::min(end, (j / bs + 1) * bs) - 1 - j / bs * bs,
                        b});
  }
  std::sort(writes.begin(), writes.end(), [](const Slots& x, const Slots& y) {
    return std::tie(x.page, x.first) < std::tie(y.page, y.first);
  });
  for (std::size_t n = 1; n < writes.size(); ++n) {
    const Slots &a = writes[n - 1], &c = writes[n];
    if (a.page == c.page && c.first <= a.last) {
      std::ostringstream m;
      m << "sequences " << std::min(a.b, c.b) << " and " << std::max(a.b, c.b)
        << " both append to slots of page " << a.page
        << " (block_table): the append would write one key twice";
      fail(m.str());
    }
  }
}

}  // namespace

PageGeometry check_page_table(const TensorView& table, const char* k_name, const TensorView& k,
                              std::int64_t batch, const char* batch_source, Device device) {
  const Extent extent = check_view("block_table", table, 2, DType::int32, device);
  expect_size("block_table", table, 0, "batch", batch_source, batch);
  PageGeometry g{k.size(2), 0, k.size(0), extent};
  if (g.block_size % 16 != 0) {
    std::ostringstream m;
    m << k_name << ".size(2) (block_size, keys per page) must be a multiple of 16 with a "
         "block_table, got "
      << g.block_size;
    fail(m.str());
  }
  if (table.stride(1) != 1 && table.size(1) > 1) {
    std::ostringstream m;
    m << "block_table.stride(1) must be 1 (contiguous rows), got " << table.stride(1);
    fail(m.str());
  }
  if (!checked_mul(table.size(1), g.block_size, &g.capacity))
    fail("block_table.size(1) × block_size overflows 64 bits");
  return g;
}

void check_pages_used(const TensorView& table, const char* k_name, const PageGeometry& g,
                      const std::vector<std::int64_t>& keys) {
  for (std::size_t b = 0; b < keys.size(); ++b)
    for (std::int64_t n = 0; n * g.block_size < keys[b]; ++n) {
      const std::int64_t page = element(table, static_cast<std::int64_t>(b), n);
      if (page < 0 || page >= g.num_blocks) {
        std::ostringstream m;
        m << "block_table[" << b << "][" << n << "] = " << page << " is outside [0, "
          << g.num_blocks << ") (" << k_name << ".size(0), the cache's pages), and sequence "
          << b << " uses that block";
        fail(m.str());
      }
    }
}

Pages pages_of_table(const TensorView& table, std::int64_t block_size) {
  return {static_cast<const std::int32_t*>(table.data), table.stride(0), block_size};
}

KvCacheProblem::KvCacheProblem(const TensorView& q, const KvCache& cache, const TensorView* kn,
                               const TensorView* vn, const TensorView* out, const TensorView* lse,
                               const Options& options) {
  if (options.attn_mask)
    fail("attention_kvcache takes no attn_mask (its keys are each sequence's cache length); "
         "window, softcap, alibi_slopes and sinks it takes");
  if (options.dropout_p != 0.0)
    fail("attention_kvcache takes dropout_p = 0 (it serves inference), got " +
         std::to_string(options.dropout_p));
  const DType dtype = q.dtype;
  const Device device = q.device;
  if (dtype != DType::float32 && dtype != DType::bfloat16 && dtype != DType::float16) {
    std::ostringstream m;
    m << "attention_kvcache takes float32, bfloat16 or float16 q, k_cache and v_cache, got "
         "q.dtype = "
      << to_string(dtype);
    fail(m.str());
  }
  const Extent q_extent = check_view("q", q, 4, dtype, device);
  expect_head_dim(q.size(3));
  // The cache: q's dtype, or q8_0 (float32 q, k_new, v_new and out; the append quantizes).
  const DType kv_dtype = kv_dtype_of(q, cache.k, cache.v);
  const Geometry g = check_cache(q, cache, kv_dtype);
  if ((kn == nullptr) != (vn == nullptr)) fail("k_new and v_new must be given together");
  std::vector<Named> inputs{{"q", q_extent}, {"k_cache", g.k}, {"v_cache", g.v}};
  if (kn) {
    inputs.push_back({"k_new", check_view("k_new", *kn, 4, dtype, device)});
    inputs.push_back({"v_new", check_view("v_new", *vn, 4, dtype, device)});
    const std::int64_t sizes[4] = {g.batch, g.kv_heads, kn->size(2), q.size(3)};
    const char* meanings[4] = {"batch", "kv heads", "new keys", "head dim"};
    const char* sources[4] = {"q.size(0)", "k_cache.size(1)", "k_new.size(2)", "q.size(3)"};
    for (int d = 0; d < 4; ++d) {
      expect_size("k_new", *kn, d, meanings[d], sources[d], sizes[d]);
      expect_size("v_new", *vn, d, meanings[d], sources[d], sizes[d]);
    }
    new_len = kn->size(2);
    // The append writes the caches: they must be outputs fit to be written.
    expect_no_self_overlap("k_cache", cache.k);
    expect_no_self_overlap("v_cache", cache.v);
    expect_disjoint("k_cache", inputs[1].extent, "v_cache", inputs[2].extent);
    for (std::size_t c = 1; c < 3; ++c)    // k_cache, v_cache
      for (std::size_t n = 3; n < 5; ++n)  // k_new, v_new
        expect_disjoint(inputs[c].name, inputs[c].extent, inputs[n].name, inputs[n].extent);
  }
  const Extent seqlens_extent = check_seqlens_view(cache, g, new_len, device);
  // On the CPU the lengths and the block table are read and checked here; on CUDA they
  // stay on the device, where the kernels check them (cuda/decode.cuh) without the host
  // waiting for the GPU.
  if (device == Device::cpu) {
    check_lengths(cache, g, new_len, &old_lengths, &lengths);
    check_block_table(cache, g, lengths);
    check_append_slots(cache, g, old_lengths, new_len);
  }
  if (cache.seqlens) inputs.push_back({"seqlens", seqlens_extent});
  if (cache.block_table) inputs.push_back({"block_table", g.pages.table});
  Extent out_extent{0, 0};
  if (out) {
    out_extent = check_view("out", *out, 4, dtype, device);
    for (int d = 0; d < 4; ++d) expect_size("out", *out, d, "as q", dim_name("q", d), q.size(d));
    expect_no_self_overlap("out", *out);
    for (const Named& in : inputs) expect_disjoint("out", out_extent, in.name, in.extent);
    if (lse) {
      const Extent lse_extent = check_view("lse", *lse, 3, DType::float32, device);
      const char* meanings[3] = {"batch", "query heads", "query sequence"};
      for (int d = 0; d < 3; ++d) expect_size("lse", *lse, d, meanings[d], dim_name("q", d), q.size(d));
      expect_no_self_overlap("lse", *lse);
      for (const Named& in : inputs) expect_disjoint("lse", lse_extent, in.name, in.extent);
      expect_disjoint("lse", lse_extent, "out", out_extent);
    }
  }

  p.batch = g.batch;
  p.q_heads = q.size(1);
  p.kv_heads = g.kv_heads;
  p.q_len = q.size(2);
  p.kv_len = g.pages.capacity;
  p.head_dim = q.size(3);
  p.scale = checked_scale(options, p.head_dim);
  p.causal = options.causal;
  p.dtype = dtype;
  p.kv_q8_0 = kv_dtype == DType::q8_0;
  const VariantExtents variants = check_variants(options, q, &p);
  expect_disjoint("out", out_extent, "alibi_slopes", variants.alibi);
  expect_disjoint("out", out_extent, "sinks", variants.sinks);
  p.q = strided(static_cast<const float*>(q.data), q);
  p.k = strided(static_cast<const float*>(cache.k.data), cache.k);
  p.v = strided(static_cast<const float*>(cache.v.data), cache.v);
  k_cache = strided(static_cast<float*>(cache.k.data), cache.k);
  v_cache = strided(static_cast<float*>(cache.v.data), cache.v);
  if (out) p.out = strided(static_cast<float*>(out->data), *out);
  if (lse) p.lse = strided(static_cast<float*>(lse->data), *lse);
  if (kn) {
    k_new = strided(static_cast<const float*>(kn->data), *kn);
    v_new = strided(static_cast<const float*>(vn->data), *vn);
  }
  p.paging.seqlens = lengths.empty() ? nullptr : lengths.data();
  if (g.paged) {
    const Pages pages = pages_of_table(*cache.block_table, g.pages.block_size);
    p.k.pages = p.v.pages = k_cache.pages = v_cache.pages = pages;
  }
}

// Copies the new keys and values into the cache element by element, as bits: E is a
// type of the dtype's size.
template <class E>
void append_as(const KvCacheProblem& c) {
  const Strided<E> k_cache = retype<E>(c.k_cache), v_cache = retype<E>(c.v_cache);
  const Strided<const E> k_new = retype<const E>(c.k_new), v_new = retype<const E>(c.v_new);
  const Problem& p = c.p;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.kv_heads; ++h)
      for (std::int64_t t = 0; t < c.new_len; ++t) {
        const std::int64_t j = c.old_lengths[static_cast<std::size_t>(b)] + t;
        E* kd = k_cache.row(b, h, j);
        E* vd = v_cache.row(b, h, j);
        const E* ks = k_new.row(b, h, t);
        const E* vs = v_new.row(b, h, t);
        for (std::int64_t d = 0; d < p.head_dim; ++d) {
          kd[d * k_cache.dim] = ks[d * k_new.dim];
          vd[d * v_cache.dim] = vs[d * v_new.dim];
        }
      }
}

// Quantizes each new key and value row (float32) into its q8_0 cache row: fattn's
// quantize_q8_0, ggml's rounding, as llama.cpp's copy of new tokens into a Q8_0 cache.
void append_quantized(const KvCacheProblem& c) {
  const Problem& p = c.p;
  const Strided<std::uint8_t> k_cache = retype<std::uint8_t>(c.k_cache),
                              v_cache = retype<std::uint8_t>(c.v_cache);
  std::vector<float> row(static_cast<std::size_t>(p.head_dim));
  auto quantize = [&](const float* src, std::int64_t dim_stride, std::uint8_t* dst) {
    for (std::int64_t d = 0; d < p.head_dim; ++d) row[static_cast<std::size_t>(d)] = src[d * dim_stride];
    quantize_q8_0(row.data(), p.head_dim, dst);
  };
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.kv_heads; ++h)
      for (std::int64_t t = 0; t < c.new_len; ++t) {
        const std::int64_t j = c.old_lengths[static_cast<std::size_t>(b)] + t;
        quantize(c.k_new.row(b, h, t), c.k_new.dim, k_cache.row(b, h, j));
        quantize(c.v_new.row(b, h, t), c.v_new.dim, v_cache.row(b, h, j));
      }
}

void KvCacheProblem::append() const {
  if (p.kv_q8_0) return append_quantized(*this);
  if (element_size(p.dtype) == 2) return append_as<std::uint16_t>(*this);
  append_as<float>(*this);
}

}  // namespace fattn::detail
