// fattn — validation of attention_varlen's arguments, and its ragged Problem.
#include <algorithm>
#include <sstream>
#include <string>

#include "model/checks.hpp"
#include "model/kv_cache_problem.hpp"
#include "model/varlen_problem.hpp"

namespace fattn::detail {
namespace {

// Offsets of the packed sequences: (B + 1) int32, from 0, non-decreasing, to `total`.
std::vector<std::int64_t> check_offsets(const char* name, const TensorView& cu,
                                        const char* total_name, std::int64_t total) {
  check_view(name, cu, 1, DType::int32, Device::cpu);
  if (cu.size(0) < 2) {
    std::ostringstream m;
    m << name << " must hold B + 1 >= 2 offsets, got " << cu.size(0);
    fail(m.str());
  }
  const auto* c = static_cast<const std::int32_t*>(cu.data);
  const std::int64_t n = cu.size(0), s = cu.stride(0);
  std::vector<std::int64_t> starts(static_cast<std::size_t>(n));
  for (std::int64_t b = 0; b < n; ++b) {
    starts[static_cast<std::size_t>(b)] = c[b * s];
    const std::int64_t least = b == 0 ? 0 : c[(b - 1) * s];
    if (b == 0 ? c[0] == 0 : c[b * s] >= least) continue;
    std::ostringstream m;
    m << name << "[" << b << "] must be " << (b == 0 ? "0" : ">= the offset before it, ")
      << (b == 0 ? "" : std::to_string(least)) << ", got " << c[b * s];
    fail(m.str());
  }
  if (c[(n - 1) * s] != total) {
    std::ostringstream m;
    m << name << "[" << n - 1 << "] (the last offset) must equal " << total_name << " = " << total
      << ", got " << c[(n - 1) * s];
    fail(m.str());
  }
  return starts;
}

// Offsets of sequences of keys on pages: (B + 1) int32, from 0, non-decreasing (the total
// is the cache's business, not a tensor's rows). Returns each sequence's keys.
std::vector<std::int64_t> lengths_of_offsets(const TensorView& cu, std::int64_t batch) {
  check_view("cu_seqlens_k", cu, 1, DType::int32, Device::cpu);
  expect_size("cu_seqlens_k", cu, 0, "sequences + 1", "cu_seqlens_q.size(0)", batch + 1);
  const auto* c = static_cast<const std::int32_t*>(cu.data);
  const std::int64_t s = cu.stride(0);
  std::vector<std::int64_t> keys;
  if (c[0] != 0) fail("cu_seqlens_k[0] must be 0, got " + std::to_string(c[0]));
  for (std::int64_t b = 0; b < batch; ++b) {
    if (c[(b + 1) * s] < c[b * s]) {
      std::ostringstream m;
      m << "cu_seqlens_k[" << b + 1 << "] must be >= the offset before it, " << c[b * s]
        << ", got " << c[(b + 1) * s];
      fail(m.str());
    }
    keys.push_back(std::int64_t{c[(b + 1) * s]} - c[b * s]);
  }
  return keys;
}

// seqused_k (B) int32: the keys each sequence uses, 0 <= seqused_k[b] <= most[b] (what
// most_name says of it).
std::vector<std::int64_t> check_seqused(const TensorView& used, std::int64_t batch,
                                        const std::vector<std::int64_t>& most,
                                        const char* most_name) {
  check_view("seqused_k", used, 1, DType::int32, Device::cpu);
  expect_size("seqused_k", used, 0, "sequences", "cu_seqlens_q.size(0) - 1", batch);
  const auto* u = static_cast<const std::int32_t*>(used.data);
  std::vector<std::int64_t> keys;
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t n = u[b * used.stride(0)], cap = most[static_cast<std::size_t>(b)];
    if (n < 0 || n > cap) {
      std::ostringstream m;
      m << "seqused_k[" << b << "] must be in [0, " << cap << "] (" << most_name << "), got "
        << n;
      fail(m.str());
    }
    keys.push_back(n);
  }
  return keys;
}

// The options with (B, Hq) ALiBi slopes' first row as (Hq): the packed tensors are checked
// as one batch-1 problem, and the slopes' batch against the offsets afterwards.
struct FirstRowOptions {
  Options options;
  TensorView slopes;
  explicit FirstRowOptions(const Options& all) : options(all) {
    const TensorView* a = all.alibi_slopes;
    if (!a || a->rank != 2) return;
    slopes = *a;
    slopes.rank = 1;
    slopes.sizes = {a->size(1), 0, 0, 0};
    slopes.strides = {a->stride(1), 0, 0, 0};
    options.alibi_slopes = &slopes;
  }
};

void reject_mask(const Options& options) {
  if (options.attn_mask)
    fail("attention_varlen takes no attn_mask (its sequences have their own lengths); "
         "window, softcap, alibi_slopes and sinks it takes");
}

// The packed queries' checks that make_problem does not do, then their offsets.
void check_packed_queries(const TensorView& q, const TensorView& cu_q, VarlenProblem* call) {
  if (q.size(0) != 1) {
    std::ostringstream m;
    m << "q.size(0) must be 1 for packed sequences (total_q, Hq, D) viewed as (1, Hq, total_q, "
         "D), got "
      << q.size(0);
    fail(m.str());
  }
  call->q_starts = check_offsets("cu_seqlens_q", cu_q, "q's total rows", q.size(2));
}

// Packed keys: their offsets, cu_seqlens_k beside cu_seqlens_q.
void check_packed_keys(const TensorView& k, const TensorView& cu_q, const TensorView& cu_k,
                       VarlenProblem* call) {
  call->k_starts = check_offsets("cu_seqlens_k", cu_k, "k's total rows", k.size(2));
  if (cu_k.size(0) != cu_q.size(0)) {
    std::ostringstream m;
    m << "cu_seqlens_k.size(0) must equal cu_seqlens_q.size(0) = " << cu_q.size(0) << ", got "
      << cu_k.size(0);
    fail(m.str());
  }
}

// Fills the ragged description of `call` (its Problem made from the views, its offsets
// checked).
void make_ragged(const TensorView& cu_q, const Options& options, VarlenProblem* call) {
  const std::int64_t batch = cu_q.size(0) - 1;
  if (options.alibi_slopes && options.alibi_slopes->rank == 2)
    expect_size("alibi_slopes", *options.alibi_slopes, 0, "sequences",
                "cu_seqlens_q.size(0) - 1", batch);
  Problem& p = call->p;
  p.ragged = {call->q_starts.data(), call->k_starts.data(),
              call->k_used.empty() ? nullptr : call->k_used.data()};
  p.batch = batch;
  p.q_len = p.kv_len = 0;
  for (std::int64_t b = 0; b < batch; ++b) {
    p.q_len = std::max(p.q_len, p.queries_of(b));
    p.kv_len = std::max(p.kv_len, p.keys_of(b));
  }
  if (options.alibi_slopes && options.alibi_slopes->rank == 2)
    p.mods.alibi_batch = options.alibi_slopes->stride(0);
  // Each sequence has its own band (Problem::sequence); the whole problem's spans them all.
  p.band_lo = -kUnboundedBand;
  p.band_hi = kUnboundedBand;
}

}  // namespace

VarlenProblem::VarlenProblem(const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& cu_q, const TensorView& cu_k,
                             const TensorView* out, const TensorView* lse,
                             const Options& options) {
  reject_mask(options);
  expect_no_q8_0_cache("attention_varlen", "q8_0 caches: attention_forward", q, k, v);
  p = make_problem(q, k, v, out, lse, FirstRowOptions(options).options);
  check_packed_queries(q, cu_q, this);
  check_packed_keys(k, cu_q, cu_k, this);
  make_ragged(cu_q, options, this);
}

VarlenProblem::VarlenProblem(const TensorView& q, const KvCache& cache, const TensorView& cu_q,
                             const TensorView* cu_k, const TensorView* out,
                             const TensorView* lse, const Options& options) {
  reject_mask(options);
  expect_no_q8_0_cache("attention_varlen", "q8_0 caches: attention_forward", q, cache.k,
                       cache.v);
  const FirstRowOptions first_row(options);  // alive while its slopes view is read
  p = cache.block_table ? make_paged_problem(q, cache.k, cache.v, out, lse, first_row.options)
                        : make_problem(q, cache.k, cache.v, out, lse, first_row.options);
  check_packed_queries(q, cu_q, this);
  const std::int64_t batch = cu_q.size(0) - 1;
  if (!cache.block_table) {
    if (!cu_k) fail("cu_seqlens_k must be given for keys packed in k and v (no block_table)");
    check_packed_keys(cache.k, cu_q, *cu_k, this);
    if (cache.seqlens) {
      std::vector<std::int64_t> rows(static_cast<std::size_t>(batch));
      for (std::int64_t b = 0; b < batch; ++b)
        rows[static_cast<std::size_t>(b)] = k_starts[static_cast<std::size_t>(b) + 1] -
                                            k_starts[static_cast<std::size_t>(b)];
      k_used = check_seqused(*cache.seqlens, batch, rows, "its rows in cu_seqlens_k");
    }
    make_ragged(cu_q, options, this);
    return;
  }
  const TensorView& table = *cache.block_table;
  const PageGeometry g =
      check_page_table(table, "k", cache.k, batch, "cu_seqlens_q.size(0) - 1", Device::cpu);
  std::vector<std::int64_t> keys;
  if (cache.seqlens) {
    keys = check_seqused(*cache.seqlens, batch,
                         std::vector<std::int64_t>(static_cast<std::size_t>(batch), g.capacity),
                         "block_table.size(1) × block_size, the keys a sequence's pages hold");
  } else {
    if (!cu_k)
      fail("a paged varlen call needs cu_seqlens_k or seqused_k (the keys of each sequence)");
    keys = lengths_of_offsets(*cu_k, batch);
    for (std::int64_t b = 0; b < batch; ++b)
      if (keys[static_cast<std::size_t>(b)] > g.capacity) {
        std::ostringstream m;
        m << "sequence " << b << " has " << keys[static_cast<std::size_t>(b)]
          << " keys (cu_seqlens_k[" << b + 1 << "] - cu_seqlens_k[" << b
          << "]), more than its pages hold: block_table.size(1) × block_size = " << g.capacity;
        fail(m.str());
      }
  }
  check_pages_used(table, "k", g, keys);
  k_starts.assign(1, 0);
  for (const std::int64_t n : keys) k_starts.push_back(k_starts.back() + n);
  p.k.pages = p.v.pages = pages_of_table(table, g.block_size);
  make_ragged(cu_q, options, this);
}

VarlenProblem::VarlenProblem(const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& out, const TensorView& dout, const TensorView& lse,
                             const TensorView& cu_q, const TensorView& cu_k, const TensorView& dq,
                             const TensorView& dk, const TensorView& dv, const Options& options,
                             const TensorView* dsinks) {
  reject_mask(options);
  p = make_backward_problem(q, k, v, out, dout, lse, nullptr, dq, dk, dv,
                            FirstRowOptions(options).options, dsinks);
  check_packed_queries(q, cu_q, this);
  check_packed_keys(k, cu_q, cu_k, this);
  make_ragged(cu_q, options, this);
}

}  // namespace fattn::detail
