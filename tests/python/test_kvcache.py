"""fattn.flash_attn_with_kvcache and fattn.flash_attn_varlen_func (FlashAttention's layouts
and semantics) against a plain float64 reference: per-sequence cache lengths, paged caches,
the in-place append, errors that leave the cache untouched, varlen gradients, opcheck and
torch.compile."""
import math

import pytest
import torch

import fattn
from conftest import assert_close_to_reference, assert_lse_close, int32, randn, reference

kv_op = torch.ops.fattn.attention_kvcache
varlen_op = torch.ops.fattn.attention_varlen


# --- the float64 references ------------------------------------------------------------------
def gather_keys(cache, b, length, block_table=None):
    """The first `length` positions of sequence b's cache: (length, Hkv, D)."""
    if block_table is None:
        return cache[b, :length]
    pages = cache[block_table[b].long()]  # (max_blocks, block_size, Hkv, D)
    return pages.reshape(-1, *cache.shape[2:])[:length]


def kvcache_reference(q, k_cache, v_cache, lengths, block_table=None, causal=False, scale=None):
    """float64 out (B, Sq, Hq, D) and lse (B, Hq, Sq): sequence b attends to the first
    lengths[b] keys of its cache, causal aligned bottom-right to lengths[b]."""
    outs, lses = [], []
    for b, length in enumerate(lengths):
        k = gather_keys(k_cache, b, length, block_table).transpose(0, 1)[None]
        v = gather_keys(v_cache, b, length, block_table).transpose(0, 1)[None]
        out, lse = reference(q[b].transpose(0, 1)[None], k, v,
                             "bottom_right" if causal else None, scale)
        outs.append(out[0].transpose(0, 1))
        lses.append(lse[0])
    return torch.stack(outs), torch.stack(lses)


def attend64(q, k, v, causal, scale=None):
    """Differentiable float64 attention of one sequence, q (Sq, Hq, D), k, v (Sk, Hkv, D):
    out (Sq, Hq, D) and lse (Hq, Sq); rows that see no key give 0 (and lse -inf)."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    s = torch.einsum("qhd,khd->hqk", q, k) * scale
    if causal:
        sq, sk = q.size(0), k.size(0)
        s = s.masked_fill(torch.arange(sk)[None] > torch.arange(sq)[:, None] + sk - sq,
                          float("-inf"))
    seen = torch.isfinite(s).any(-1, keepdim=True)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(torch.where(seen, s, torch.zeros_like(s)), dim=-1) * seen
    return torch.einsum("hqk,khd->qhd", p, v), lse


def varlen_reference(q, k, v, cu_q, cu_k, causal):
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        out, lse = attend64(q[q0:q1], k[k0:k1], v[k0:k1], causal)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses, dim=1)


def make_cache(b, s_cache, hkv, d, seed):
    return randn(b, s_cache, hkv, d, seed=seed), randn(b, s_cache, hkv, d, seed=seed + 1)


def paginate(k_cache, block_size, seed, spare=3):
    """The contiguous cache (B, S, Hkv, D) cut into pages of block_size keys placed at
    shuffled positions among spare random pages: (pages, block_table)."""
    b, s, hkv, d = k_cache.shape
    per_seq = s // block_size
    n = b * per_seq + spare
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    pages = randn(n, block_size, hkv, d, seed=seed + 100)  # unused pages: noise
    table = order[:b * per_seq].view(b, per_seq).to(torch.int32)
    pages[table.long().flatten()] = k_cache.reshape(b * per_seq, block_size, hkv, d)
    return pages, table


# --- against the reference -------------------------------------------------------------------
SQS, GROUPS, DIMS = (1, 3, 16), (1, 4, 8), (64, 128, 80)


@pytest.mark.parametrize("sq_index", range(3), ids=lambda i: f"Sq{SQS[i]}")
@pytest.mark.parametrize("group_index", range(3), ids=lambda i: f"G{GROUPS[i]}")
def test_matches_reference(sq_index, group_index):
    # a Latin square: every head dim meets every Sq and every group size
    sq, group, d = SQS[sq_index], GROUPS[group_index], DIMS[(sq_index + group_index) % 3]
    b, hkv, s_cache = 3, 2, 48
    hq = hkv * group
    q = randn(b, sq, hq, d, seed=sq + group)
    k_cache, v_cache = make_cache(b, s_cache, hkv, d, seed=d)
    lengths = [0, 37, s_cache]  # an empty sequence, a partial one, a full one
    for causal in (False, True):
        out, lse = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=int32(lengths),
                                                 causal=causal, return_softmax_lse=True)
        ref, ref_lse = kvcache_reference(q, k_cache, v_cache, lengths, causal=causal)
        assert out.shape == (b, sq, hq, d) and out.dtype == torch.float32
        assert lse.shape == (b, hq, sq) and lse.dtype == torch.float32
        assert_close_to_reference(out, ref)
        assert_lse_close(lse, ref_lse)
        assert torch.equal(out[0], torch.zeros_like(out[0]))  # no key: 0, lse -inf


def test_no_cache_seqlens_uses_the_whole_cache_and_custom_scale():
    q = randn(2, 2, 4, 64, seed=1)
    k_cache, v_cache = make_cache(2, 40, 4, 64, seed=2)
    out = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, softmax_scale=0.2)
    ref, _ = kvcache_reference(q, k_cache, v_cache, [40, 40], scale=0.2)
    assert_close_to_reference(out, ref)


def test_int_cache_seqlens():
    q = randn(2, 1, 8, 64, seed=3)
    k_cache, v_cache = make_cache(2, 32, 2, 64, seed=4)
    as_int = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=21, causal=True)
    as_tensor = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=int32([21, 21]),
                                              causal=True)
    assert torch.equal(as_int, as_tensor)
    assert_close_to_reference(as_int, kvcache_reference(q, k_cache, v_cache, [21, 21])[0])


@pytest.mark.parametrize("sq", [1, 5])
def test_paged_shuffled_block_table_equals_contiguous(sq):
    b, s_cache, hkv, hq, d, block = 3, 64, 2, 8, 64, 16
    q = randn(b, sq, hq, d, seed=5)
    k_cache, v_cache = make_cache(b, s_cache, hkv, d, seed=6)
    k_pages, table = paginate(k_cache, block, seed=7)
    v_pages, table_v = paginate(v_cache, block, seed=7)
    assert torch.equal(table, table_v)
    lengths = int32([0, 33, 64])
    for causal in (False, True):
        flat, flat_lse = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                                       causal=causal, return_softmax_lse=True)
        paged, paged_lse = fattn.flash_attn_with_kvcache(q, k_pages, v_pages,
                                                         cache_seqlens=lengths, block_table=table,
                                                         causal=causal, return_softmax_lse=True)
        assert torch.equal(paged, flat) and torch.equal(paged_lse, flat_lse)
        ref, _ = kvcache_reference(q, k_pages, v_pages, lengths.tolist(), table, causal)
        assert_close_to_reference(paged, ref)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("s_new", [1, 5])
def test_append_then_attend(paged, s_new):
    b, s_cache, hkv, hq, d = 3, 48, 2, 4, 96
    q = randn(b, s_new, hq, d, seed=8)
    k_new, v_new = randn(b, s_new, hkv, d, seed=9), randn(b, s_new, hkv, d, seed=10)
    k_cache, v_cache = make_cache(b, s_cache, hkv, d, seed=11)
    table = None
    if paged:
        k_cache, table = paginate(k_cache, 16, seed=12)
        v_cache, _ = paginate(v_cache, 16, seed=12)
    before = [int(x) for x in (0, 20, s_cache - s_new)]  # empty, partial, filling it up
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    for bi, n in enumerate(before):  # where the new rows must land
        for t in range(s_new):
            pos = n + t
            page, row = (table[bi, pos // 16].item(), pos % 16) if paged else (bi, pos)
            k_expected[page, row] = k_new[bi, t]
            v_expected[page, row] = v_new[bi, t]
    out, lse = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new,
                                             cache_seqlens=int32(before), block_table=table,
                                             causal=True, return_softmax_lse=True)
    # the new rows written, everything else untouched
    assert torch.equal(k_cache, k_expected) and torch.equal(v_cache, v_expected)
    after = [n + s_new for n in before]
    ref, ref_lse = kvcache_reference(q, k_cache, v_cache, after, table, causal=True)
    assert_close_to_reference(out, ref)
    assert_lse_close(lse, ref_lse)


def test_num_splits():
    q = randn(2, 1, 8, 128, seed=13)
    k_cache, v_cache = make_cache(2, 512, 1, 128, seed=14)
    lengths = int32([500, 77])
    ref, ref_lse = kvcache_reference(q, k_cache, v_cache, lengths.tolist())
    results = {}
    for splits in (0, 1, 4):
        out, lse = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                                 num_splits=splits, return_softmax_lse=True)
        assert_close_to_reference(out, ref)
        assert_lse_close(lse, ref_lse)
        results[splits] = out
    again = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                          num_splits=4)
    assert torch.equal(again, results[4])  # the same splits: the same bits


def test_strided_inputs_are_read_in_place():
    # q and the cache as slices of wider tensors (padded heads and head dim)
    q = randn(2, 3, 5, 70, seed=15)[:, :, 1:, 3:67]
    k_cache = randn(2, 40, 3, 66, seed=16)[:, :, 1:, :64]
    v_cache = randn(2, 40, 3, 66, seed=17)[:, :, 1:, 2:]
    out = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=int32([9, 40]),
                                        causal=True)
    assert_close_to_reference(out, kvcache_reference(q, k_cache, v_cache, [9, 40],
                                                     causal=True)[0])


# --- errors --------------------------------------------------------------------------------------
def _error_setup(paged=True):
    b, s_cache, hkv, d = 2, 32, 2, 16
    q = randn(b, 1, 4, d, seed=20)
    k_new, v_new = randn(b, 2, hkv, d, seed=21), randn(b, 2, hkv, d, seed=22)
    k_cache, v_cache = make_cache(b, s_cache, hkv, d, seed=23)
    table = None
    if paged:
        k_cache, table = paginate(k_cache, 16, seed=24, spare=1)
        v_cache, _ = paginate(v_cache, 16, seed=24, spare=1)
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, k=k_new, v=v_new,
                cache_seqlens=int32([5, 20]), block_table=table)


def _bad_table(kw):
    kw["block_table"] = kw["block_table"].clone()
    kw["block_table"][0, 0] = kw["k_cache"].size(0)


def _shared_slot(kw):
    kw["block_table"] = kw["block_table"].clone()
    kw["block_table"][1, 1] = kw["block_table"][0, 1]
    kw["cache_seqlens"] = int32([16, 16])


ERRORS = {
    # name: (spoil(kwargs), exception, message)
    "append past capacity": (lambda kw: kw.update(cache_seqlens=int32([5, 31])), RuntimeError,
                             r"cache_seqlens\[1\] \+ k_new.size\(2\) = 31 \+ 2 = 33 keys exceed "
                             r"the cache's capacity of 32 keys"),
    "negative length": (lambda kw: kw.update(cache_seqlens=int32([-1, 3])), RuntimeError,
                        r"cache_seqlens\[0\] must be >= 0, got -1"),
    "int64 cache_seqlens": (lambda kw: kw.update(cache_seqlens=torch.tensor([5, 20])), ValueError,
                            r"cache_seqlens.dtype must be torch.int32, got torch.int64"),
    "page out of range": (_bad_table, RuntimeError,
                          r"block_table\[0\]\[0\] = 5 is outside \[0, 5\)"),
    "int64 block_table": (lambda kw: kw.update(block_table=kw["block_table"].long()), ValueError,
                          r"block_table.dtype must be torch.int32, got torch.int64"),
    "two appends to one slot": (_shared_slot, RuntimeError, "both append to slots of page"),
    "append without cache_seqlens": (lambda kw: kw.update(cache_seqlens=None), RuntimeError,
                                     "k_new and v_new need cache_seqlens"),
    "k without v": (lambda kw: kw.update(v=None), RuntimeError,
                    "k_new and v_new must be given together"),
    "k's head dim": (lambda kw: kw.update(k=kw["k"][..., :8]), RuntimeError,
                     r"k_new.size\(3\) \(head dim\) must equal q.size\(3\) = 16, got 8"),
    "block_size": (lambda kw: kw.update(k_cache=kw["k_cache"][:, :8], v_cache=kw["v_cache"][:, :8]),
                   RuntimeError, "must be a multiple of 16"),
    "cache_seqlens on meta": (lambda kw: kw.update(cache_seqlens=kw["cache_seqlens"].to("meta")),
                              ValueError, "cache_seqlens is on meta but q is on cpu"),
    "3-d q": (lambda kw: kw.update(q=kw["q"][0]), ValueError,
              r"q must have 4 dimensions \(B, Sq, Hq, D\)"),
}


@pytest.mark.parametrize("case", ERRORS)
def test_failed_call_names_the_argument_and_leaves_the_cache(case):
    spoil, exception, message = ERRORS[case]
    kw = _error_setup()
    spoil(kw)
    k_before, v_before = kw["k_cache"].clone(), kw["v_cache"].clone()
    with pytest.raises(exception, match=message):
        fattn.flash_attn_with_kvcache(**kw)
    assert torch.equal(kw["k_cache"], k_before) and torch.equal(kw["v_cache"], v_before)


def _angles(positions, half, seed=30):
    return torch.rand(positions, half, generator=torch.Generator().manual_seed(seed)) * 6.3


# FlashAttention's rotary and cache-index arguments, given wrong: (keyword changes, whether
# the cache is paged, exception, message)
INDEX_AND_ROTARY_ERRORS = {
    "rotary_sin_missing": (dict(rotary_cos=_angles(64, 8).cos()), False, TypeError,
                           "rotary_sin must be a tensor"),
    "rotary_dim_not_16": (dict(rotary_cos=_angles(64, 4).cos(), rotary_sin=_angles(64, 4).sin()),
                          False, ValueError, "must be a positive multiple of 16"),
    "rotary_table_short": (dict(rotary_cos=_angles(21, 8).cos(), rotary_sin=_angles(21, 8).sin()),
                           False, ValueError, "have 21 positions, but the new tokens reach "
                                              "position 21"),
    "rotary_without_new_keys": (dict(k=None, v=None, rotary_cos=_angles(64, 8).cos(),
                                     rotary_sin=_angles(64, 8).sin()), False, ValueError,
                                "k and v must be given"),
    "batch_idx_out_of_range": (dict(cache_batch_idx=int32([0, 2])), False, ValueError,
                               r"cache_batch_idx must hold 2 rows of k_cache \(each in \[0, 2\)\)"),
    "batch_idx_int64": (dict(cache_batch_idx=torch.tensor([0, 1])), False, ValueError,
                        "cache_batch_idx.dtype must be torch.int32"),
    "leftpad_past_the_keys": (dict(cache_leftpad=int32([0, 21])), False, ValueError,
                              r"cache_leftpad must hold 2 first keys, each in \[0, "
                              r"cache_seqlens\[b\]\]"),
    "batch_idx_paged": (dict(cache_batch_idx=int32([0, 1])), True, NotImplementedError,
                        "not a paged one"),
}


@pytest.mark.parametrize("case", INDEX_AND_ROTARY_ERRORS)
def test_kvcache_index_and_rotary_errors_leave_the_cache(case):
    changes, paged, exception, message = INDEX_AND_ROTARY_ERRORS[case]
    kw = dict(_error_setup(paged=paged), **changes)
    k_before, v_before = kw["k_cache"].clone(), kw["v_cache"].clone()
    with pytest.raises(exception, match=message):
        fattn.flash_attn_with_kvcache(**kw)
    assert torch.equal(kw["k_cache"], k_before) and torch.equal(kw["v_cache"], v_before)


def test_kvcache_dtypes_and_grad():
    kw = _error_setup(paged=False)
    cast = dict(kw, **{n: kw[n].double() for n in ("q", "k_cache", "v_cache", "k", "v")})
    with pytest.raises(NotImplementedError, match=r"q.dtype is torch.float64.*takes float32, "
                                                  r"bfloat16, float16"):
        fattn.flash_attn_with_kvcache(**cast)
    with pytest.raises(ValueError, match="k_cache.dtype is torch.float64 but q.dtype"):
        fattn.flash_attn_with_kvcache(**dict(kw, k_cache=kw["k_cache"].double()))
    with pytest.raises(TypeError, match="cache_seqlens must be an int or an int32 tensor"):
        fattn.flash_attn_with_kvcache(**dict(kw, cache_seqlens=[5, 20]))
    q = kw["q"].clone().requires_grad_()
    with pytest.raises(NotImplementedError, match="q require grad, but flash_attn_with_kvcache "
                                                  "has no backward"):
        fattn.flash_attn_with_kvcache(**dict(kw, q=q))
    with torch.no_grad():
        fattn.flash_attn_with_kvcache(**dict(kw, q=q))  # inference: fine
    # the operator itself refuses to be differentiated
    out, _ = kv_op(q.transpose(1, 2), kw["k_cache"].transpose(1, 2), kw["v_cache"].transpose(1, 2),
                   cache_seqlens=int32([5, 20]))
    with pytest.raises(RuntimeError, match="not implemented"):
        out.sum().backward()


def test_operator_errors():
    kw = _error_setup(paged=False)
    q, kc, vc = (kw[n].transpose(1, 2) for n in ("q", "k_cache", "v_cache"))
    with pytest.raises(RuntimeError, match="fattn: cache_seqlens must be an int32 tensor, got "
                                           "Long"):
        kv_op(q, kc, vc, cache_seqlens=torch.tensor([1, 2]))
    with pytest.raises(RuntimeError, match="attention_kvcache runs impl auto, decode or reference"):
        kv_op(q, kc, vc, impl="fused")
    with pytest.raises(RuntimeError, match="kv_splits must be >= 0"):
        kv_op(q, kc, vc, kv_splits=-1)


# --- variable-length sequences -------------------------------------------------------------------
def packed(lengths_q, lengths_k, hq, hkv, d, seed, dtype=torch.float32):
    cu_q = int32([0] + torch.tensor(lengths_q).cumsum(0).tolist())
    cu_k = int32([0] + torch.tensor(lengths_k).cumsum(0).tolist())
    q = randn(int(cu_q[-1]), hq, d, seed=seed, dtype=dtype)
    k = randn(int(cu_k[-1]), hkv, d, seed=seed + 1, dtype=dtype)
    v = randn(int(cu_k[-1]), hkv, d, seed=seed + 2, dtype=dtype)
    return q, k, v, cu_q, cu_k


# query and key lengths per sequence: a 0-length sequence, a 1-length one, queries without
# keys, more queries than keys (bottom-right: leading rows see nothing), long ones
LENGTHS_Q = [5, 0, 1, 3, 40, 9]
LENGTHS_K = [7, 4, 1, 0, 40, 3]


@pytest.mark.parametrize("hq,hkv,d", [(4, 4, 64), (8, 2, 80), (4, 1, 128)])
def test_varlen_matches_reference(hq, hkv, d):
    q, k, v, cu_q, cu_k = packed(LENGTHS_Q, LENGTHS_K, hq, hkv, d, seed=d + hq)
    for causal in (False, True):
        out, lse, probs = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(LENGTHS_Q),
                                                       max(LENGTHS_K), causal=causal,
                                                       return_attn_probs=True)
        ref, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, causal)
        assert out.shape == q.shape and lse.shape == (hq, q.size(0)) and probs is None
        assert_close_to_reference(out, ref)
        assert_lse_close(lse, ref_lse)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_varlen_many_ragged_sequences(dtype):
    """41 sequences of random lengths in one call (one ragged problem over all of them):
    empty ones, queries without keys, Sq != Sk, GQA; each against its own float64 reference."""
    g = torch.Generator().manual_seed(41)
    lengths_q = torch.randint(0, 90, (41,), generator=g).tolist()
    lengths_k = [lq if b % 2 else int(torch.randint(0, 120, (1,), generator=g)) for b, lq in
                 enumerate(lengths_q)]
    lengths_q[3], lengths_k[3] = 0, 0
    lengths_q[7], lengths_k[7] = 11, 0
    q, k, v, cu_q, cu_k = packed(lengths_q, lengths_k, 8, 2, 64, seed=41, dtype=dtype)
    for causal in (False, True):
        out, lse, _ = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q),
                                                   max(lengths_k), causal=causal,
                                                   return_attn_probs=True)
        ref, ref_lse = varlen_reference(q.double(), k.double(), v.double(), cu_q, cu_k, causal)
        wide = dtype == torch.float32
        assert_close_to_reference(out, ref, **({} if wide else {"tol": 2e-2}))
        assert_lse_close(lse, ref_lse, **({} if wide else {"tol": 1e-4}))


def test_varlen_float64_runs_the_reference():
    q, k, v, cu_q, cu_k = packed(LENGTHS_Q, LENGTHS_K, 4, 2, 32, seed=35, dtype=torch.float64)
    out, lse, _ = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 40, 40, causal=True,
                                               return_attn_probs=True)
    ref, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, True)
    assert out.dtype == lse.dtype == torch.float64
    assert (out - ref).abs().max().item() < 1e-12
    # rows without keys (a sequence without keys, leading rows under the causal mask)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    finite = torch.isfinite(ref_lse)
    assert (lse[finite] - ref_lse[finite]).abs().max().item() < 1e-12


def test_varlen_strided_and_scale():
    q = randn(30, 6, 40, seed=30)[:, 1:5, 4:36]  # slices: padded heads and head dim
    k = randn(24, 2, 32, seed=31).transpose(0, 1).contiguous().transpose(0, 1)  # heads outer
    v = randn(24, 2, 32, seed=32)
    cu_q, cu_k = int32([0, 10, 30]), int32([0, 20, 24])
    out = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 20, 20, softmax_scale=0.3,
                                       causal=True)
    ref = torch.cat([attend64(q[:10], k[:20], v[:20], True, 0.3)[0],
                     attend64(q[10:], k[20:], v[20:], True, 0.3)[0]])
    assert out.is_contiguous()
    assert_close_to_reference(out, ref)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_gradients_against_float64(causal):
    q, k, v, cu_q, cu_k = packed(LENGTHS_Q, LENGTHS_K, 4, 2, 32, seed=40)
    dout = randn(*q.shape, seed=43)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 40, 40, causal=causal)
    got = torch.autograd.grad(out, (q, k, v), dout)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = torch.autograd.grad(varlen_reference(q64, k64, v64, cu_q, cu_k, causal)[0],
                              (q64, k64, v64), dout.double())
    for name, g, r in zip(("dq", "dk", "dv"), got, ref):
        err = (g.double() - r).abs().max().item()
        assert err <= 5e-5 * max(1.0, r.abs().max().item()), (name, err)
    # keys of the sequence without queries, queries of the one without keys: zero gradients
    assert torch.equal(got[0][cu_q[3]:cu_q[4]], torch.zeros_like(got[0][cu_q[3]:cu_q[4]]))


def test_varlen_gradcheck_float64():
    q, k, v, cu_q, cu_k = packed([3, 0, 4], [5, 2, 4], 2, 1, 16, seed=50, dtype=torch.float64)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(
        lambda a, b, c: fattn.flash_attn_varlen_func(a, b, c, cu_q, cu_k, 4, 5, causal=True),
        (q, k, v))


def test_varlen_lse_carries_no_gradient():
    q, k, v, cu_q, cu_k = packed([4, 6], [4, 6], 2, 2, 32, seed=60)
    q.requires_grad_()
    out, lse, _ = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 6, return_attn_probs=True,
                                               deterministic=True)
    assert out.requires_grad and not lse.requires_grad


def test_varlen_errors():
    q, k, v, cu_q, cu_k = packed([4, 6], [5, 5], 2, 2, 32, seed=70)
    f = fattn.flash_attn_varlen_func
    with pytest.raises(ValueError, match="max_seqlen_q = 5 is less than the longest sequence in "
                                         "cu_seqlens_q, 6"):
        f(q, k, v, cu_q, cu_k, 5, 5)
    with pytest.raises(ValueError, match="max_seqlen_k = 4"):
        f(q, k, v, cu_q, cu_k, 6, 4)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
        f(q, k, v, cu_q, cu_k, 6, 5, dropout_p=1.0)
    with pytest.raises(ValueError, match=r"k must have 4 dimensions \(num_blocks, block_size, "):
        f(q, k, v, cu_q, cu_k, 6, 5, block_table=int32([[0]]))  # packed k with a table
    with pytest.raises(ValueError, match="cu_seqlens_k.dtype must be torch.int32, got torch.int64"):
        f(q, k, v, cu_q, cu_k.long(), 6, 5)
    with pytest.raises(ValueError, match=r"q must have 3 dimensions \(total_q, Hq, D\)"):
        f(q[None], k, v, cu_q, cu_k, 6, 5)
    with pytest.raises(NotImplementedError, match="takes float32, bfloat16, float16, float64"):
        f(q.int(), k.int(), v.int(), cu_q, cu_k, 6, 5)
    with pytest.raises(RuntimeError, match=r"cu_seqlens_q\[2\] \(the last offset\) must equal "
                                           r"q's total rows = 10, got 9"):
        f(q, k, v, int32([0, 4, 9]), cu_k, 6, 5)
    with pytest.raises(RuntimeError, match=r"cu_seqlens_k.size\(0\) must equal "
                                           r"cu_seqlens_q.size\(0\) = 3"):
        f(q, k, v, cu_q, int32([0, 10]), 6, 10)


def test_varlen_without_queries_or_keys():
    q, k, v, cu_q, cu_k = packed([2, 3], [4, 4], 2, 2, 32, seed=80)
    out, lse, _ = fattn.flash_attn_varlen_func(q, k[:0], v[:0], cu_q, int32([0, 0, 0]), 3, 0,
                                               return_attn_probs=True)
    assert torch.equal(out, torch.zeros_like(out)) and bool((lse == float("-inf")).all())
    out = fattn.flash_attn_varlen_func(q[:0], k, v, int32([0, 0, 0]), cu_k, 0, 4)
    assert out.shape == (0, 2, 32)


# --- torch.library.opcheck, torch.compile ---------------------------------------------------------
def test_opcheck_kvcache():
    kw = _error_setup(paged=True)
    q, k_new, v_new = (kw[n].transpose(1, 2) for n in ("q", "k", "v"))
    kc, vc = kw["k_cache"].transpose(1, 2), kw["v_cache"].transpose(1, 2)
    # with an append (the mutation), paged and contiguous, without one
    torch.library.opcheck(kv_op.default, (q, kc, vc, k_new, v_new, kw["cache_seqlens"],
                                          kw["block_table"]), {"causal": True})
    flat = _error_setup(paged=False)
    torch.library.opcheck(kv_op.default, (flat["q"].transpose(1, 2),
                                          flat["k_cache"].transpose(1, 2),
                                          flat["v_cache"].transpose(1, 2), None, None,
                                          flat["cache_seqlens"]), {"kv_splits": 2})


def test_opcheck_varlen():
    q, k, v, cu_q, cu_k = packed([3, 0, 5], [4, 2, 6], 4, 2, 32, seed=90)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    torch.library.opcheck(varlen_op.default, (q, k, v, cu_q, cu_k), {"causal": True})
    out, lse = varlen_op(q.detach(), k.detach(), v.detach(), cu_q, cu_k)
    torch.library.opcheck(torch.ops.fattn.attention_varlen_backward.default,
                          (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse,
                           cu_q, cu_k))


def test_compile_kvcache_with_append_mutates_the_cache():
    def step(q, k_cache, v_cache, k_new, v_new, lengths):
        return fattn.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new,
                                             cache_seqlens=lengths, causal=True,
                                             return_softmax_lse=True)

    kw = _error_setup(paged=False)
    args = (kw["q"], kw["k_cache"], kw["v_cache"], kw["k"], kw["v"], kw["cache_seqlens"])
    eager_cache = (kw["k_cache"].clone(), kw["v_cache"].clone())
    eager = step(kw["q"], *eager_cache, kw["k"], kw["v"], kw["cache_seqlens"])
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)  # inductor
    with torch.no_grad():
        got = compiled(*args)
    assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])
    assert torch.equal(kw["k_cache"], eager_cache[0]) and torch.equal(kw["v_cache"], eager_cache[1])
    # the int form of cache_seqlens traces too (aot_eager: functionalized, run eagerly)
    torch._dynamo.reset()
    q, kc, vc, kn, vn = (kw[n].clone() for n in ("q", "k_cache", "v_cache", "k", "v"))
    g = torch.compile(lambda *a: fattn.flash_attn_with_kvcache(*a, cache_seqlens=7),
                      fullgraph=True, backend="aot_eager")
    g(q, kc, vc, kn, vn)
    assert torch.equal(kc[:, 7:9], kn) and torch.equal(vc[:, 7:9], vn)


def test_compile_varlen_forward_and_backward():
    q, k, v, cu_q, cu_k = packed([3, 5, 1], [4, 6, 2], 4, 2, 32, seed=95)
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def loss(a, b, c):
        return fattn.flash_attn_varlen_func(a, b, c, cu_q, cu_k, 5, 6, causal=True).square().sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    expected = torch.autograd.grad(loss(q, k, v), (q, k, v))
    for g, e in zip(got, expected):
        assert torch.equal(g, e)
