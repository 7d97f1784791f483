"""bfloat16 and float16 on the CPU: forward, backward, KV cache, varlen, against float64.

The accuracy rule, for each 16-bit dtype: fattn's max error against a float64 reference
computed from the same 16-bit inputs is at most 2× the error of torch's own SDPA in that
dtype on those inputs, plus a floor of one unit in the last place of the dtype at the
largest reference value (the output is rounded to the dtype, so no implementation gets
below half of that; torch's error can be smaller than ours on a single element only by
rounding luck).
"""
import math

import pytest
import torch
import torch.nn.functional as F

import fattn
from conftest import hidden_pairs

DTYPES = [torch.bfloat16, torch.float16]
# Bits of mantissa after the leading one: an ulp at 1.0 is 2^-bits.
MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10}


def ulp_floor(ref, dtype):
    return ref.abs().max().item() * 2.0 ** -MANTISSA_BITS[dtype]


def laid_out(g, shape, layout, dtype, scale=1.0):
    """A (B, H, S, D) tensor of scale·N(0, 1) drawn from g and rounded to dtype, laid out as
    `layout` in memory: contiguous "bhsd", a (B, S, H, D) view "bshd", or "strided"
    (padded rows and head dim, dims not contiguous)."""
    b, h, s, d = shape
    if layout == "bhsd":
        return (scale * torch.randn(b, h, s, d, generator=g)).to(dtype)
    if layout == "bshd":
        return (scale * torch.randn(b, s, h, d, generator=g)).to(dtype).transpose(1, 2)
    if layout == "strided":
        t = (scale * torch.randn(b, h + 1, s + 3, 2 * d + 1, generator=g)).to(dtype)
        return t[:, 1:, 2:-1, 1::2]
    raise ValueError(layout)


def inputs(dtype, b, hq, hkv, sq, sk, d, seed, layout="bhsd", scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (laid_out(g, (b, hq, sq, d), layout, dtype, scale),
            laid_out(g, (b, hkv, sk, d), layout, dtype, scale),
            laid_out(g, (b, hkv, sk, d), layout, dtype, scale))


def sdpa64(q, k, v, **kw):
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), enable_gqa=True, **kw)


def assert_within_rule(ours, torchs, ref, dtype, what=""):
    assert ours.dtype == dtype
    err = (ours.double() - ref).abs().max().item()
    err_torch = (torchs.double() - ref).abs().max().item()
    bound = 2 * err_torch + ulp_floor(ref, dtype)
    assert err <= bound, f"{what}: fattn {err:.3g}, torch {err_torch:.3g}, bound {bound:.3g}"


GRID = [  # (b, hq, hkv, sq, sk, d, causal, bottom_right, layout)
    (2, 4, 4, 1, 1, 64, False, False, "bhsd"),
    (2, 4, 2, 65, 113, 64, False, False, "bhsd"),
    (1, 4, 2, 113, 65, 64, True, False, "bshd"),
    (1, 4, 2, 65, 113, 64, True, True, "strided"),
    (2, 8, 1, 1, 300, 128, False, False, "bshd"),      # decode, MQA
    (1, 8, 2, 7, 200, 128, True, True, "bhsd"),       # short queries, GQA
    (1, 2, 2, 97, 130, 16, True, False, "bhsd"),
    (1, 2, 1, 63, 65, 80, False, False, "strided"),
    (1, 2, 2, 130, 97, 96, True, True, "bhsd"),
    (1, 2, 2, 33, 47, 160, False, False, "bshd"),
    (1, 2, 1, 50, 70, 256, True, True, "bhsd"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", GRID, ids=lambda c: "-".join(map(str, c)))
def test_forward_within_rule(dtype, case):
    b, hq, hkv, sq, sk, d, causal, bottom_right, layout = case
    q, k, v = inputs(dtype, b, hq, hkv, sq, sk, d, seed=sq * 31 + sk + d, layout=layout)
    out, lse = torch.ops.fattn.attention(q, k, v, causal, bottom_right)
    assert out.dtype == dtype and lse.dtype == torch.float32
    kw = {}
    if causal:
        kw["attn_mask"] = ~hidden_pairs(sq, sk, "bottom_right" if bottom_right else "top_left")
    ref = sdpa64(q, k, v, **kw)
    torchs = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
    visible = ~torch.isnan(ref)  # rows that see no key: torch's math gives NaN there
    ref, torchs = torch.where(visible, ref, 0), torch.where(visible, torchs, 0)
    ours = torch.where(visible, out, 0)
    assert_within_rule(ours, torchs, ref, dtype, f"{dtype} {case}")
    # The logsumexp is float32 from exact inputs: as tight as in float32.
    s = torch.matmul(q.double(), k.double().repeat_interleave(hq // hkv, 1).transpose(-2, -1))
    s = s / math.sqrt(d)
    if causal:
        s = s.masked_fill(~kw["attn_mask"], float("-inf"))
    ref_lse = torch.logsumexp(s, -1)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse.double()[finite] - ref_lse[finite]).abs().max().item() <= 1e-5 * max(
        1.0, ref_lse[finite].abs().max().item())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("impl", ["fused", "naive", "decode", "reference"])
def test_every_impl(dtype, impl):
    q, k, v = inputs(dtype, 1, 4, 2, 9, 77, 64, seed=5)
    out, _ = torch.ops.fattn.attention(q, k, v, True, True, impl=impl)
    mask = ~hidden_pairs(9, 77, "bottom_right")
    ref = sdpa64(q, k, v, attn_mask=mask)
    torchs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert_within_rule(out, torchs, ref, dtype, impl)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sq", [1, 64])
def test_large_logits_within_rule(dtype, sq):
    # q, k ~ 4·N(0, 1), scale 0.3, D = 96: |scores| reach 50-150.
    q, k, v = inputs(dtype, 1, 16, 16, sq, 512, 96, seed=sq, scale=4.0)
    v = (v.float() / 4).to(dtype)
    ours = fattn.scaled_dot_product_attention(q, k, v, scale=0.3)
    torchs = F.scaled_dot_product_attention(q, k, v, scale=0.3)
    assert_within_rule(ours, torchs, sdpa64(q, k, v, scale=0.3), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_backward_within_rule(dtype, causal):
    q, k, v = inputs(dtype, 2, 4, 2, 70, 90, 64, seed=11, layout="bshd")
    dout = torch.randn(2, 4, 70, 64, generator=torch.Generator().manual_seed(3)).to(dtype)

    def grads(fn, tensors):
        tensors = [t.detach().requires_grad_() for t in tensors]
        out = fn(*tensors)
        return torch.autograd.grad(out, tensors, dout.to(out.dtype))

    kw = dict(is_causal=causal, enable_gqa=True)
    ref = grads(lambda *t: F.scaled_dot_product_attention(*t, **kw), [x.double() for x in (q, k, v)])
    ours = grads(lambda *t: fattn.scaled_dot_product_attention(*t, **kw), (q, k, v))
    torchs = grads(lambda *t: F.scaled_dot_product_attention(*t, **kw), (q, k, v))
    for name, r, o, t in zip(("dq", "dk", "dv"), ref, ours, torchs):
        assert_within_rule(o, t, r, dtype, name)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_flash_attention_bshd(dtype):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 50, 4, 64, generator=g).to(dtype)
    k = torch.randn(2, 70, 2, 64, generator=g).to(dtype)
    v = torch.randn(2, 70, 2, 64, generator=g).to(dtype)
    out = fattn.flash_attention(q, k, v, causal=True)
    assert out.shape == q.shape and out.dtype == dtype
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    mask = ~hidden_pairs(50, 70, "bottom_right")
    ref = sdpa64(qt, kt, vt, attn_mask=mask).transpose(1, 2)
    torchs = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask,
                                            enable_gqa=True).transpose(1, 2)
    assert_within_rule(out, torchs, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("hq", [8, 14])  # 4 and 7 rows per kv head: the CPU decode kernel's
def test_kvcache_decode(dtype, paged, hq):  # scores straight from the rows, then a key tile
    g = torch.Generator().manual_seed(4)
    b, hkv, d, cap, page = 2, 2, 128, 256, 64
    seqlens = torch.tensor([100, 190], dtype=torch.int32)
    k_full = torch.randn(b, cap, hkv, d, generator=g).to(dtype)
    v_full = torch.randn(b, cap, hkv, d, generator=g).to(dtype)
    q = torch.randn(b, 1, hq, d, generator=g).to(dtype)
    k_new = torch.randn(b, 1, hkv, d, generator=g).to(dtype)
    v_new = torch.randn(b, 1, hkv, d, generator=g).to(dtype)
    if paged:  # pages in reverse order
        pages = cap // page
        table = torch.arange(b * pages, dtype=torch.int32).flip(0).view(b, pages).contiguous()
        k_cache = torch.empty(b * pages, page, hkv, d, dtype=dtype)
        v_cache = torch.empty_like(k_cache)
        for s in range(b):
            for n in range(pages):
                k_cache[table[s, n]] = k_full[s, n * page:(n + 1) * page]
                v_cache[table[s, n]] = v_full[s, n * page:(n + 1) * page]
        out = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new,
                                            cache_seqlens=seqlens, block_table=table)
    else:
        k_cache, v_cache = k_full.clone(), v_full.clone()
        out = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new,
                                            cache_seqlens=seqlens)
    assert out.dtype == dtype
    for s in range(b):
        n = int(seqlens[s])
        keys = torch.cat([k_full[s, :n], k_new[s]]).transpose(0, 1)[None]
        values = torch.cat([v_full[s, :n], v_new[s]]).transpose(0, 1)[None]
        qs = q[s:s + 1].transpose(1, 2)
        ref = sdpa64(qs, keys, values)
        torchs = F.scaled_dot_product_attention(qs, keys, values, enable_gqa=True)
        assert_within_rule(out[s:s + 1].transpose(1, 2), torchs, ref, dtype, f"sequence {s}")
    if not paged:  # the append wrote the new key, bit for bit
        assert torch.equal(k_cache[0, 100], k_new[0, 0]) and torch.equal(v_cache[1, 190], v_new[1, 0])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_varlen(dtype):
    g = torch.Generator().manual_seed(6)
    lens = [(5, 9), (17, 3), (1, 30)]
    cu_q = torch.tensor([0, 5, 22, 23], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 12, 42], dtype=torch.int32)
    q = torch.randn(23, 4, 64, generator=g).to(dtype)
    k = torch.randn(42, 2, 64, generator=g).to(dtype)
    v = torch.randn(42, 2, 64, generator=g).to(dtype)
    out = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 30, causal=True)
    assert out.dtype == dtype
    for s, (nq, nk) in enumerate(lens):
        qs = q[cu_q[s]:cu_q[s + 1]].transpose(0, 1)[None]
        ks = k[cu_k[s]:cu_k[s + 1]].transpose(0, 1)[None]
        vs = v[cu_k[s]:cu_k[s + 1]].transpose(0, 1)[None]
        mask = ~hidden_pairs(nq, nk, "bottom_right")
        ref = sdpa64(qs, ks, vs, attn_mask=mask)
        visible = ~torch.isnan(ref)
        torchs = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, enable_gqa=True)
        ours = out[cu_q[s]:cu_q[s + 1]].transpose(0, 1)[None]
        assert_within_rule(torch.where(visible, ours, 0), torch.where(visible, torchs, 0),
                           torch.where(visible, ref, 0), dtype, f"sequence {s}")


def test_mixed_dtypes_are_an_error_naming_both():
    q, k, v = inputs(torch.bfloat16, 1, 2, 2, 8, 8, 32, seed=1)
    with pytest.raises(ValueError, match=r"key\.dtype is torch\.float16 but query\.dtype is torch\.bfloat16"):
        fattn.scaled_dot_product_attention(q, k.half(), v)
    with pytest.raises(RuntimeError, match="v.dtype is Half but q.dtype is BFloat16"):
        torch.ops.fattn.attention(q, k, v.half())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck(dtype):
    q, k, v = inputs(dtype, 1, 4, 2, 17, 33, 64, seed=9, layout="bshd")
    torch.library.opcheck(torch.ops.fattn.attention.default, (q, k, v), dict(is_causal=True))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_compile_forward_and_backward(dtype):
    q, k, v = (t.requires_grad_() for t in inputs(dtype, 1, 4, 2, 33, 33, 32, seed=12))

    def f(q, k, v):
        return fattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out = compiled(q, k, v)
    assert out.dtype == dtype
    eager = f(q, k, v)
    assert torch.equal(out, eager)
    g_compiled = torch.autograd.grad(out.float().sum(), (q, k, v))
    g_eager = torch.autograd.grad(eager.float().sum(), (q, k, v))
    for a, e in zip(g_compiled, g_eager):
        assert a.dtype == dtype and torch.equal(a, e)
