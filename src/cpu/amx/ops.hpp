// fattn — the tile operations of the AMX kernels: float32 attention on bfloat16 tiles.
//
// Intel AMX (Sapphire Rapids and later) multiplies bfloat16 tiles into float32:
// TDPBF16PS adds a 16×32 by 32×16 product to a 16×16 float32 tile in 16 cycles,
// 512 multiply-adds a cycle against the two AVX-512 FMA ports' 32. It accumulates
// like an FMA chain (float32, round to nearest even, denormals flushed).
//
// float32 accuracy from bfloat16 (8 significant bits): each operand is split exactly,
//   x = hi + mid + lo     hi = x rounded to 8 bits, mid = the rest truncated to 8 bits,
//                         lo = what remains (at most 8 bits, so a bfloat16 too; for
//                         normal x — denormals lose bits below 2^-133, see pair())
// and a·b is summed from the six partial products above float32's rounding,
//   hi·lo + hi·mid + mid·mid + mid·hi + lo·hi + hi·hi      (the largest last)
// The three left out (mid·lo, lo·mid, lo·lo) are below 2^-24·|a·b| together: one
// float32 rounding. Six products at 16× the FMA rate: 2.7× the FMA peak for Q·Kᵀ and
// P·V (the GPU's 3×TF32 is the same idea). Measured errors: tests/test_forward.cpp.
//
// Operands in memory (bf16 = the upper 16 bits of the float32 part, as uint16), the three
// parts of a row side by side:
//   K parts   [Sk_pad][3][Dp]               K rows: A tiles of 16 keys × 32 dims
//   Vᵀ parts  [Sk_pad/Bc][Dp][3][Bc]        V transposed, per key tile: A tiles of 16 dims × 32 keys
//   Q parts   [Dp/2][3][Br][2]              dims paired per query (VNNI): B tiles
//   P parts   [Bc/2][3][Br][2]              keys paired per query (VNNI): B tiles
// and the float32 tiles of the FMA kernel: st [Bc][Br] = K·Qᵀ (keys × queries, so the
// softmax stays vertical) and ot [Dp][Br] = (P·V)ᵀ. Dp is a multiple of 32 (the reduction
// step of one TDPBF16PS), Sk_pad of Bc; the padding is zeros.
// Why parts side by side and Vᵀ per key tile: a tile load reads 16 rows; with the parts
// a multiple of 4 KiB apart (whole matrices per part) or Vᵀ rows Sk_pad·2 bytes apart,
// the rows of the six operand tiles of a product fell into the same few L1 sets and
// evicted each other: D=128 products ran at 40-45 % of the AMX rate (an rdtsc split of
// the tile loop, docs/perf-log.md "AMX kernels").
#pragma once

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BW__)
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "cpu/amx/tiles.hpp"
#include "cpu/common/tile_ops.hpp"
#include "cpu/common/transpose.hpp"

namespace fattn::cpu {

using bf16 = std::uint16_t;

// No vector work to interleave with the tile products (see AmxOps::mma_split).
struct NoTask {
  bool step() { return false; }
};

template <class S>
struct AmxOps {
  using Fma = TileOps<S>;  // Q and O transposes, the naive path's softmax: the FMA kernel's
  static constexpr int Br = Fma::Br;
  static constexpr int Bc = Fma::Bc;
  static constexpr int kParts = 3;
  static constexpr int kTileRows = ::fattn::cpu::kTileRows;  // rows of a tile register
  static constexpr int kChunk = 32;     // bfloat16 per tile row: one TDPBF16PS's reduction
  static constexpr int kBlock = 2 * kTileRows;  // a 2×2 block of 16×16 accumulators
  static_assert(Br % kBlock == 0 && Bc % kBlock == 0, "tiles are whole 2×2 blocks");

  static std::int64_t round_up(std::int64_t n) { return (n + kChunk - 1) / kChunk * kChunk; }

  // Tile registers: 0-3 the 2×2 accumulator block, 4-5 two A tiles, 6-7 two B tiles,
  // every one 16 rows × 64 bytes. The configuration is per thread: each work item loads
  // it and releases the tiles at the end (Scope).
  struct Scope {
    Scope() { load_tile_config(); }
    ~Scope() { _tile_release(); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
  };

  // --- splitting float32 into three bfloat16 parts ------------------------------------
  struct Parts {
    __m512i hi, mid, lo;  // float32 bit patterns whose low 16 bits are zero
  };
  static Parts split(__m512 x) {
    const __m512i top = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    // Rounding: add half a bfloat16 ulp to the magnitude bits, then truncate.
    const __m512i hi = _mm512_and_si512(
        _mm512_add_epi32(_mm512_castps_si512(x), _mm512_set1_epi32(0x8000)), top);
    const __m512 rest = _mm512_sub_ps(x, _mm512_castsi512_ps(hi));  // exact: ≤ 16 bits
    const __m512i mid = _mm512_and_si512(_mm512_castps_si512(rest), top);
    const __m512 lo = _mm512_sub_ps(rest, _mm512_castsi512_ps(mid));  // exact: ≤ 8 bits
    return {hi, mid, _mm512_castps_si512(lo)};
  }
  // 16 bfloat16 pairs (a_k, b_k), a in the low half of each 32-bit word (VNNI order).
  // b's low 16 bits are masked off: a part of a denormal input is not a bfloat16 (no
  // implicit bit, so the exactness argument above fails) and keeps bits down there;
  // dropping them costs < 2^-133 absolute, and AMX reads denormal bfloat16 as zero anyway.
  static __m512i pair(__m512i a, __m512i b) {
    constexpr int kAOrBAndC = 0xF8;  // ternary-logic truth table of a | (b & c)
    return _mm512_ternarylogic_epi32(_mm512_srli_epi32(a, 16), b,
                                     _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)), kAOrBAndC);
  }
  // 16 bfloat16 from one part, for the row-major (A-tile) operands.
  static void store16(bf16* dst, __m512i part) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(part, 16)));
  }
  // The three parts of 16 values to dst, dst + part_stride, dst + 2·part_stride.
  static void store_parts(bf16* dst, std::int64_t part_stride, __m512 x) {
    const Parts parts = split(x);
    store16(dst, parts.hi);
    store16(dst + part_stride, parts.mid);
    store16(dst + 2 * part_stride, parts.lo);
  }
  // Whether some lane is NaN, ±Inf or so large that its rounded part would be: those
  // would not split exactly, and the callers fall back to the FMA kernel.
  static __mmask16 not_splittable(__m512 x) {
    return _mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(3.0e38f), _CMP_NLE_UQ);
  }

  // Elements of one VNNI row pair (2·Br bf16) and of the three parts of it.
  static constexpr int kPairRow = 2 * Br;
  static constexpr int kPairRows = kParts * kPairRow;

  // 16 lanes of two rows a, b split and paired into the three parts of a VNNI row pair:
  // dst, dst + part_stride, dst + 2·part_stride (64-byte aligned).
  static void store_pair_parts(bf16* dst, __m512 a, __m512 b,
                               std::int64_t part_stride = kPairRow) {
    const Parts pa = split(a), pb = split(b);
    _mm512_store_si512(dst, pair(pa.hi, pb.hi));
    _mm512_store_si512(dst + part_stride, pair(pa.mid, pb.mid));
    _mm512_store_si512(dst + 2 * part_stride, pair(pa.lo, pb.lo));
  }

  // rows [0, n) of src (float32, [rows][Br]) into VNNI parts,
  // dst[(r/2)·kPairRows + part·kPairRow + 2·i + r%2]; rows [n, n_pad) read as zero.
  // n_pad is even. For Q (rows = dims) and P (rows = keys). Returns false if some value
  // cannot be split (not_splittable).
  static bool split_pairs(const float* src, std::int64_t n, std::int64_t n_pad, bf16* dst) {
    __mmask16 bad = 0;
    for (std::int64_t r = 0; r < n_pad; r += 2)
      for (int u = 0; u < Br; u += 16) {
        const __m512 a = r < n ? _mm512_load_ps(src + r * Br + u) : _mm512_setzero_ps();
        const __m512 b = r + 1 < n ? _mm512_load_ps(src + (r + 1) * Br + u) : _mm512_setzero_ps();
        bad |= not_splittable(a) | not_splittable(b);
        store_pair_parts(dst + r / 2 * kPairRows + 2 * u, a, b);
      }
    return bad == 0;
  }

  // A 16×16 block of a head's rows (16 rows from `row`, 16 dims from `dim`), zero
  // outside [0, rows) × [0, dims); any strides.
  static void load_block16(const detail::Strided<const float>& t, std::int64_t b, std::int64_t h,
                           std::int64_t row, std::int64_t rows, std::int64_t dim,
                           std::int64_t dims, __m512 r[16]) {
    const std::int64_t nr = std::min<std::int64_t>(16, rows - row);
    const std::int64_t nd = std::min<std::int64_t>(16, dims - dim);
    const __mmask16 lanes =
        static_cast<__mmask16>(nd >= 16 ? 0xFFFFu : nd <= 0 ? 0u : (1u << nd) - 1);
    for (int k = 0; k < 16; ++k) {
      if (k >= nr || nd <= 0) {
        r[k] = _mm512_setzero_ps();
      } else if (t.dim == 1) {
        r[k] = _mm512_maskz_loadu_ps(lanes, t.row(b, h, row + k) + dim);
      } else {
        alignas(64) float tmp[16] = {};
        for (std::int64_t d = 0; d < nd; ++d) tmp[d] = t.row(b, h, row + k)[(dim + d) * t.dim];
        r[k] = _mm512_load_ps(tmp);
      }
    }
  }

  // Keys padded to whole key tiles, dims to whole reduction chunks.
  static std::int64_t padded_keys(std::int64_t n) { return (n + Bc - 1) / Bc * Bc; }

  // Calls f(j, d, block) for each 16×16 block of rows [0, rows) × dims [0, dims) of a head
  // (load_block16; rows_pad, dims_pad multiples of 16 past them read as zero). Returns
  // false if some value cannot be split (see not_splittable).
  template <class F>
  static bool each_block16(const detail::Strided<const float>& t, std::int64_t b, std::int64_t h,
                           std::int64_t rows, std::int64_t rows_pad, std::int64_t dims,
                           std::int64_t dims_pad, F f) {
    __mmask16 bad = 0;
    __m512 r[16];
    for (std::int64_t j = 0; j < rows_pad; j += 16)
      for (std::int64_t d = 0; d < dims_pad; d += 16) {
        load_block16(t, b, h, j, rows, d, dims, r);
        for (int row = 0; row < 16; ++row) bad |= not_splittable(r[row]);
        f(j, d, r);
      }
    return bad == 0;
  }

  // K rows of one head into parts [n_pad][3][Dp]. Same return as each_block16.
  static bool pack_k(const detail::Strided<const float>& k, std::int64_t b, std::int64_t h,
                     std::int64_t n, std::int64_t D, bf16* dst) {
    const std::int64_t Dp = round_up(D);
    return each_block16(k, b, h, n, padded_keys(n), D, Dp,
                        [&](std::int64_t j, std::int64_t d, __m512 r[16]) {
                          for (int row = 0; row < 16; ++row)
                            store_parts(dst + (j + row) * kParts * Dp + d, Dp, r[row]);
                        });
  }

  // V rows of one head, transposed, into parts [n_pad/Bc][Dp][3][Bc]. Same return.
  static bool pack_v_transposed(const detail::Strided<const float>& v, std::int64_t b,
                                std::int64_t h, std::int64_t n, std::int64_t D, bf16* dst) {
    const std::int64_t Dp = round_up(D);
    return each_block16(v, b, h, n, padded_keys(n), D, Dp,
                        [&](std::int64_t j, std::int64_t d, __m512 r[16]) {
                          transpose16x16(r);  // r[k] = dim d+k of keys j..j+15
                          for (int k = 0; k < 16; ++k)
                            store_parts(dst + j / Bc * Dp * kParts * Bc + (d + k) * kParts * Bc +
                                            j % Bc,
                                        Bc, r[k]);
                        });
  }

  // Rows [i0, i0 + Br) of one head (a query tile; rows from `rows` on read as zero) with
  // the rows paired, as the B operand of a product that reduces over them (dK += dS·Q,
  // dV += P·dO): parts [Br/2][3][Dp][2], dst[(i/2)·3·2Dp + part·2Dp + 2·d + i%2].
  // Same return as each_block16.
  static bool pack_row_pairs(const detail::Strided<const float>& t, std::int64_t b,
                             std::int64_t h, std::int64_t i0, std::int64_t rows, std::int64_t D,
                             bf16* dst) {
    const std::int64_t Dp = round_up(D), pair_row = kParts * 2 * Dp;
    __mmask16 bad = 0;
    __m512 r[16];
    for (int rb = 0; rb < Br; rb += 16)
      for (std::int64_t d = 0; d < Dp; d += 16) {
        load_block16(t, b, h, i0 + rb, rows, d, D, r);
        for (int k = 0; k < 16; k += 2) {
          bad |= not_splittable(r[k]) | not_splittable(r[k + 1]);
          store_pair_parts(dst + (rb + k) / 2 * pair_row + 2 * d, r[k], r[k + 1], 2 * Dp);
        }
      }
    return bad == 0;
  }

  // Whether every value of rows [0, n) of one head splits exactly (Q is read through
  // load_q_transposed per tile; this only checks it).
  static bool splittable_rows(const detail::Strided<const float>& t, std::int64_t b,
                              std::int64_t h, std::int64_t n, std::int64_t D) {
    return each_block16(t, b, h, n, n, D, D, [](std::int64_t, std::int64_t, __m512*) {});
  }

  // --- tile products --------------------------------------------------------------------
  // An operand's two tiles of one part: base of part 0, parts part_stride elements apart,
  // rows row_bytes apart, the second tile `second` elements after the first.
  struct Operand {
    const bf16* base;
    std::int64_t part_stride, row_bytes, second;
  };
  // The two layouts the products read. Split rows (K, Vᵀ, the backward's A): each row holds
  // its kParts parts of `part` elements one after the other; tile rows are its rows, from
  // `first`, the second tile 16 rows further.
  [[gnu::always_inline]] static Operand split_rows_operand(const bf16* first,
                                                           std::int64_t part) {
    const std::int64_t row = kParts * part;
    return {first, part, row * 2, kTileRows * row};
  }
  // VNNI row pairs (queries, P, the backward's X: pair_row elements a pair and part, kParts
  // parts a pair): tile rows are the pairs of reduction chunk `chunk` (a multiple of 32),
  // from column col; the second tile 16 columns further.
  // Chunk and Column are the callers' own index types: the index arithmetic stays theirs.
  template <class Chunk, class Column>
  [[gnu::always_inline]] static Operand row_pairs_operand(const bf16* pairs,
                                                          std::int64_t pair_row, Chunk chunk,
                                                          Column col) {
    const std::int64_t pair_rows = kParts * pair_row;
    return {pairs + chunk / 2 * pair_rows + 2 * col, pair_row, pair_rows * 2, 2 * kTileRows};
  }
  // (GCC's tile intrinsics are macros that paste the register number: literals only.)
  // GCC 12's tile loads are asm statements without a memory clobber: nothing stops the
  // compiler from moving the vector stores that wrote a tile's data (the split parts,
  // the rescaled accumulator) after the load. This fence keeps them before it.
  static void memory_fence() { __asm__ volatile("" ::: "memory"); }
  static void load_a(const Operand& x, int part) {
    memory_fence();
    const bf16* p = x.base + part * x.part_stride;
    _tile_loadd(4, p, x.row_bytes);
    _tile_loadd(5, p + x.second, x.row_bytes);
  }
  static void load_b(const Operand& x, int part) {
    memory_fence();
    const bf16* p = x.base + part * x.part_stride;
    _tile_loadd(6, p, x.row_bytes);
    _tile_loadd(7, p + x.second, x.row_bytes);
  }
  // The four products of a 2×2 block, in the order that frees the operand loaded next
  // first: without tile register renaming, a load must wait until the products reading
  // its register have run, and the next products wait for the load.
  enum class Next { a, b };
  template <Next next>
  static void mma_2x2() {
    if constexpr (next == Next::a) {  // A tile 4, then 5
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    } else {  // B tile 6, then 7
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  // Accumulators 0-3 += A·B over one 32-wide reduction chunk, from the six partial
  // products; accumulator 2·row + column pairs A tile `row` with B tile `column`.
  // Order: hi·lo, hi·mid, mid·mid, mid·hi, lo·hi, hi·hi, each step changing one operand:
  // 14 tile loads a chunk (the order before, smallest first, took 16; the product phases
  // ran 0-7 % faster, within this VM's noise: docs/perf-log.md, "AMX backward").
  // `task` (may be null): vector work of another query tile, a slice after each group of
  // four products, so that the core runs it while the tile unit multiplies (Task::step()).
  template <class Task>
  static void mma_split(const Operand& a, const Operand& b, Task* task) {
    enum { hi = 0, mid = 1, lo = 2 };
    auto products = [task](auto next) {
      mma_2x2<decltype(next)::value>();
      if (task) task->step();
    };
    using NextA = std::integral_constant<Next, Next::a>;
    using NextB = std::integral_constant<Next, Next::b>;
    load_a(a, hi);
    load_b(b, lo);
    products(NextB{});
    load_b(b, mid);
    products(NextA{});
    load_a(a, mid);
    products(NextB{});
    load_b(b, hi);
    products(NextA{});
    load_a(a, lo);
    products(NextA{});
    load_a(a, hi);
    products(NextA{});  // the next chunk's first load is an A
  }
  static void store_2x2(float* c, std::int64_t row_floats) {
    const std::int64_t bytes = row_floats * 4;
    _tile_stored(0, c, bytes);
    _tile_stored(1, c + 16, bytes);
    _tile_stored(2, c + 16 * row_floats, bytes);
    _tile_stored(3, c + 16 * row_floats + 16, bytes);
    memory_fence();  // tile stores have no memory clobber either: vector reads come after
  }
  static void load_2x2(const float* c, std::int64_t row_floats) {
    memory_fence();
    const std::int64_t bytes = row_floats * 4;
    _tile_loadd(0, c, bytes);
    _tile_loadd(1, c + 16, bytes);
    _tile_loadd(2, c + 16 * row_floats, bytes);
    _tile_loadd(3, c + 16 * row_floats + 16, bytes);
  }
  // Runs what mma_split left of `task` (it runs a slice after each group of products).
  template <class Task>
  [[gnu::always_inline]] static void finish_task(Task* task) {
    while (task && task->step()) {
    }
  }

  // Lanes of query vector v (queries 16v … 16v+15 of the tile) that see a key whose
  // first seeing query is `first` (Band::first_seeing).
  static __mmask16 visible_lanes(std::int64_t first, int v) {
    const std::int64_t hidden = first - 16 * v;  // leading lanes that do not see it
    if (hidden <= 0) return 0xFFFF;
    if (hidden >= 16) return 0;
    return static_cast<__mmask16>(0xFFFFu << hidden);
  }

  // On a diagonal tile (diag not null), whether every query of the 32-query block at
  // `query` is hidden from the keys of the block at `key`: such blocks are skipped (their
  // scores are masked afterwards, their probabilities are zero).
  static bool hidden_block(const typename Fma::Band* diag, std::int64_t key, int query) {
    return diag && diag->first_seeing(key) > query + kBlock - 1;
  }
  // st[j][i] = Σ_d K[j0+j][d]·qt[d][i] for the 32-key chunks that cover nj keys.
  // k_parts: the head's K parts (pack_k). task: as mma_split's; finished before returning.
  template <class Task = NoTask>
  static void scores_tile(const bf16* k_parts, std::int64_t Dp, std::int64_t j0, std::int64_t nj,
                          const bf16* q_parts, float* st,
                          const typename Fma::Band* diag = nullptr, Task* task = nullptr) {
    const std::int64_t k_row = kParts * Dp;
    for (int qb = 0; qb < Br; qb += kBlock)
      for (std::int64_t kb = 0; kb < nj; kb += kBlock) {
        if (hidden_block(diag, kb, qb)) continue;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (std::int64_t c = 0; c < Dp; c += kChunk)
          mma_split(split_rows_operand(k_parts + (j0 + kb) * k_row + c, Dp),
                    row_pairs_operand(q_parts, kPairRow, c, qb), task);
        store_2x2(st + kb * Br + qb, Br);
      }
    finish_task(task);
  }

  // ot[d][i] += Σ_j V[j0+j][d]·P[j][i] for the 32-key chunks that cover nj keys (P's
  // rows past nj are zero). v_parts: the head's Vᵀ parts (pack_v_transposed); j0 is a
  // multiple of Bc.
  template <class Task = NoTask>
  static void pv_tile(const bf16* v_parts, std::int64_t j0, std::int64_t nj, const bf16* p_parts,
                      std::int64_t Dp, float* ot, const typename Fma::Band* diag = nullptr,
                      Task* task = nullptr) {
    constexpr std::int64_t v_row = kParts * Bc;
    const bf16* v_tile = v_parts + j0 / Bc * Dp * v_row;
    for (int qb = 0; qb < Br; qb += kBlock)
      for (std::int64_t db = 0; db < Dp; db += kBlock) {
        load_2x2(ot + db * Br + qb, Br);
        for (std::int64_t kc = 0; kc < nj; kc += kChunk) {
          if (hidden_block(diag, kc, qb)) continue;  // P is zero there
          mma_split(split_rows_operand(v_tile + db * v_row + kc, Bc),
                    row_pairs_operand(p_parts, kPairRow, kc, qb), task);
        }
        store_2x2(ot + db * Br + qb, Br);
      }
    finish_task(task);
  }

  // acc[j][d] += Σ_i A[j][i]·X[i][d] for the 32-key blocks that cover nj keys: the
  // backward's products that reduce over the queries of a tile (dV += P·dO, dK += dS·Q).
  // a_rows: A split by rows, [Bc][3][Br] (keys × queries, split_rows); x_pairs: X with
  // the queries paired (pack_row_pairs); acc [Bc][Dp]. On a diagonal tile the 32×32
  // blocks with every pair hidden are skipped (A is zero there).
  template <class Task = NoTask>
  static void rows_tile(const bf16* a_rows, std::int64_t nj, const bf16* x_pairs, std::int64_t Dp,
                        float* acc, const typename Fma::Band* diag = nullptr,
                        Task* task = nullptr) {
    constexpr std::int64_t a_row = kParts * Br;
    for (std::int64_t kb = 0; kb < nj; kb += kBlock)
      for (std::int64_t db = 0; db < Dp; db += kBlock) {
        load_2x2(acc + kb * Dp + db, Dp);
        for (int qc = 0; qc < Br; qc += kChunk) {
          if (hidden_block(diag, kb, qc)) continue;
          mma_split(split_rows_operand(a_rows + kb * a_row + qc, Br),
                    row_pairs_operand(x_pairs, 2 * Dp, qc, db), task);
        }
        store_2x2(acc + kb * Dp + db, Dp);
      }
    finish_task(task);
  }
};

}  // namespace fattn::cpu
#endif
