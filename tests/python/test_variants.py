"""The attention variants through PyTorch: attn_mask (torch SDPA's semantics), sliding
window, softcap, ALiBi and sinks (FlashAttention's and gpt-oss's), forward and backward.

Truth is float64 written here plainly (`plain`): the scores matrix with each variant
applied in Options' order, a sink column in the softmax. attn_mask is also checked against
torch's own SDPA with the same mask, with the accuracy rule of the 16-bit tests (error
against float64 at most 2x torch's own in that dtype, plus one ulp of the dtype at the
largest reference value; float32 error within the C++ suite's 1e-5 bound).
"""
import math

import pytest
import torch
import torch.nn.functional as F

import fattn
from conftest import OUT_TOL, qkv
from test_16bit import assert_within_rule, inputs

NEG_INF = float("-inf")


def plain(q, k, v, *, causal=None, window=(-1, -1), softcap=0.0, slopes=None, mask=None,
          sinks=None, scale=None, return_p=False):
    """float64 attention with every variant, (B, H, S, D); returns (out, lse), and with
    return_p the probabilities P (B, Hq, Sq, Sk) too. A row with no visible key and no
    sink gives 0 and lse -inf."""
    q, k, v = q.double(), k.double(), v.double()
    b, hq, sq, d = q.shape
    hkv, sk = k.size(1), k.size(2)
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(d))
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq).view(-1, 1)
    j = torch.arange(sk).view(1, -1)
    offset = 0 if causal == "top_left" else sk - sq
    if slopes is not None:
        slopes = slopes.double().reshape(-1, hq, 1, 1) if slopes.dim() == 2 else \
            slopes.double().view(1, hq, 1, 1)
        s = s - slopes * (i + sk - sq - j).abs()
    if mask is not None:
        s = s.masked_fill(~mask, NEG_INF) if mask.dtype == torch.bool else s + mask.double()
    visible = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        visible &= j <= i + offset
    left, right = window
    if left >= 0:
        visible &= j >= i + offset - left
    if right >= 0:
        visible &= j <= i + offset + right
    s = s.masked_fill(~visible, NEG_INF)
    if sinks is not None:
        s = torch.cat([s, sinks.double().view(1, hq, 1, 1).expand(b, hq, sq, 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1).clamp(min=-1e300).nan_to_num(neginf=0.0))
    p = torch.where(lse.unsqueeze(-1) == NEG_INF, torch.zeros_like(p), p)
    if sinks is not None:
        p = p[..., :-1]
    return (p @ v, lse, p) if return_p else (p @ v, lse)


def padding_mask(b, sq, sk, hidden_keys):
    """(B, 1, 1, Sk) bool: sequence n keeps its first Sk - hidden_keys·(n+1) keys."""
    keep = torch.arange(sk).view(1, 1, 1, -1) < (sk - hidden_keys * (torch.arange(b) + 1)).view(
        -1, 1, 1, 1)
    return keep


def random_mask(shape, seed, dtype=torch.bool):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        m = torch.rand(shape, generator=g) < 0.7
        if shape[-2] > 3:
            m[..., 3, :] = False  # a row hidden whole
        return m
    m = torch.randn(shape, generator=g) * 2
    m[torch.rand(shape, generator=g) < 0.1] = NEG_INF
    return m.to(dtype)


# --- attn_mask against torch's SDPA -------------------------------------------------------
MASKS = [  # (b, hq, hkv, sq, sk, d, mask shape or "padding", mask dtype, layout)
    (2, 4, 2, 70, 230, 64, "padding", torch.bool, "bhsd"),
    (2, 4, 4, 65, 113, 32, (65, 113), torch.bool, "bshd"),
    (1, 4, 2, 100, 260, 64, (1, 4, 100, 260), torch.bool, "strided"),
    (2, 2, 1, 1, 300, 128, (2, 1, 1, 300), torch.bool, "bhsd"),  # decode
    (2, 4, 2, 80, 120, 48, (80, 120), "float", "bhsd"),
    (1, 8, 2, 33, 97, 128, (1, 8, 33, 97), "float", "bshd"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", MASKS, ids=lambda c: f"{c[3]}x{c[4]}_{c[6]}_{c[8]}")
def test_attn_mask_matches_torch(case, dtype):
    b, hq, hkv, sq, sk, d, shape, mdtype, layout = case
    q, k, v = inputs(dtype, b, hq, hkv, sq, sk, d, seed=sq + sk, layout=layout)
    if shape == "padding":
        mask = padding_mask(b, sq, sk, 29)
    else:
        mask = random_mask(shape, seed=sk, dtype=dtype if mdtype == "float" else torch.bool)
    ours = fattn.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    ref, _ = plain(q, k, v, mask=mask)
    # torch's math backend gives NaN on rows its mask hides whole; fattn gives 0 (as ref).
    seen = ref.abs().sum(-1, keepdim=True) > 0
    torchs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torchs = torch.where(seen, torchs.double(), ref)
    if dtype == torch.float32:
        assert (ours.double() - ref).abs().max() <= OUT_TOL * max(1.0, ref.abs().max())
    else:
        assert_within_rule(ours, torchs, ref, dtype, "attn_mask")
    assert (ours.double()[~seen.expand_as(ours)] == 0).all()


def test_all_true_mask_equals_no_mask():
    q, k, v = qkv(2, 4, 4, 77, 150, 64)
    mask = torch.ones(77, 150, dtype=torch.bool)
    assert torch.equal(fattn.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                       fattn.scaled_dot_product_attention(q, k, v))


# --- window, softcap, ALiBi, sinks against the plain float64 definition --------------------
CASES = [  # (b, hq, hkv, sq, sk, d, causal, options)
    (2, 4, 2, 77, 130, 40, None, dict(window=(20, -1))),
    (1, 2, 1, 130, 77, 64, None, dict(window=(-1, 9))),
    (1, 2, 2, 90, 150, 32, "bottom_right", dict(window=(0, -1))),
    (1, 3, 1, 65, 300, 48, "bottom_right", dict(window=(1000, -1))),
    (2, 4, 2, 63, 97, 64, None, dict(softcap=5.0)),
    (1, 2, 1, 100, 100, 256, "bottom_right", dict(softcap=30.0)),
    (2, 4, 2, 70, 200, 32, None, dict(slopes="heads")),
    (2, 4, 1, 200, 70, 16, "bottom_right", dict(slopes="batch")),
    (2, 4, 2, 90, 61, 64, "bottom_right", dict(sinks=True)),
    (2, 4, 2, 100, 180, 64, "bottom_right", dict(window=(50, -1), softcap=20.0, slopes="heads")),
    (1, 4, 2, 120, 300, 64, None, dict(window=(60, 10), softcap=15.0, slopes="batch",
                                       sinks=True)),
]


def case_options(b, hq, options, seed=0):
    g = torch.Generator().manual_seed(seed)
    o = dict(options)
    if o.get("slopes") == "heads":
        o["slopes"] = torch.exp2(-8 * torch.arange(1, hq + 1) / hq)
    elif o.get("slopes") == "batch":
        o["slopes"] = torch.exp2(-8 * torch.arange(1, hq + 1) / hq) * (1 + torch.arange(b)
                                                                       ).view(-1, 1) / 2
    if o.get("sinks"):
        o["sinks"] = torch.randn(hq, generator=g) * 2
    return o


def call_flash(q, k, v, causal, o, **kw):
    return fattn.flash_attention(q, k, v, layout="bhsd", causal=bool(causal),
                                 window_size=o.get("window", (-1, -1)),
                                 softcap=o.get("softcap", 0.0), alibi_slopes=o.get("slopes"),
                                 sinks=o.get("sinks"), **kw)


def case_id(c):
    return f"{c[3]}x{c[4]}_{c[6]}_" + "_".join(sorted(c[7]))


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_variants_match_plain_definition(case):
    b, hq, hkv, sq, sk, d, causal, options = case
    scale = 4.0 if "softcap" in options else 1.0  # softcap: scores well past the cap
    q, k, v = inputs(torch.float32, b, hq, hkv, sq, sk, d, seed=sq, scale=scale)
    o = case_options(b, hq, options)
    out, lse = call_flash(q, k, v, causal, o, return_lse=True)
    ref, ref_lse = plain(q, k, v, causal=causal, **o)
    bound = OUT_TOL * max(1.0, ref.abs().max().item())
    assert (out.double() - ref).abs().max() <= bound
    finite = ref_lse.isfinite()
    assert torch.equal(lse.isfinite(), finite)
    assert (lse.double()[finite] - ref_lse[finite]).abs().max() <= 1e-5 * max(
        1.0, ref_lse[finite].abs().max().item())


@pytest.mark.parametrize("case", CASES[::2], ids=case_id)
def test_variant_gradients_match_plain_definition(case):
    b, hq, hkv, sq, sk, d, causal, options = case
    q, k, v = inputs(torch.float32, b, hq, hkv, sq, sk, d, seed=sq)
    o = case_options(b, hq, options)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    leaves64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    sinks = o.get("sinks")
    if sinks is not None:
        o["sinks"] = sinks.clone().requires_grad_()
        o64 = dict(o, sinks=sinks.double().requires_grad_())
    else:
        o64 = o
    g = torch.randn(b, hq, sq, d, generator=torch.Generator().manual_seed(1))
    (call_flash(*leaves, causal, o) * g).sum().backward()
    (plain(*leaves64, causal=causal, **o64)[0] * g.double()).sum().backward()
    pairs = list(zip(leaves, leaves64))
    if sinks is not None:
        pairs.append((o["sinks"], o64["sinks"]))
    for ours, ref in pairs:
        bound = 2e-5 * max(1.0, ref.grad.abs().max().item())
        assert (ours.grad.double() - ref.grad).abs().max() <= bound


def test_gradcheck_float64_every_variant():
    """The float64 path (the reference) against finite differences, each variant on."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, s, 16, generator=g, dtype=torch.float64, requires_grad=True)
               for s in (9, 11, 11))
    k = k[:, :2].detach().requires_grad_()
    v = v[:, :2].detach().requires_grad_()
    sinks = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    slopes = torch.rand(4, generator=g, dtype=torch.float64)
    mask = torch.randn(9, 11, generator=g, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda q, k, v, s: fattn.flash_attention(
            q, k, v, layout="bhsd", causal=True, window_size=(5, -1), softcap=3.0,
            alibi_slopes=slopes, sinks=s, return_lse=True), (q, k, v, sinks))
    assert torch.autograd.gradcheck(
        lambda q, k, v: fattn.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                            enable_gqa=True), (q, k, v))


def test_bfloat16_variants_within_rule():
    """16-bit inputs with every variant: within the accuracy rule against torch's SDPA
    given the same scores as an additive mask (torch has no window, softcap or sinks)."""
    b, hq, hkv, sq, sk, d = 2, 4, 2, 70, 150, 64
    for dtype in (torch.bfloat16, torch.float16):
        q, k, v = inputs(dtype, b, hq, hkv, sq, sk, d, seed=5)
        o = case_options(b, hq, dict(window=(40, 5), slopes="heads"))
        ours = call_flash(q, k, v, None, o)
        ref, _ = plain(q, k, v, **o)
        # the same bias and band as an additive mask for torch
        i = torch.arange(sq).view(-1, 1)
        j = torch.arange(sk).view(1, -1)
        bias = -o["slopes"].view(1, hq, 1, 1) * (i + sk - sq - j).abs()
        band = (j >= i + sk - sq - 40) & (j <= i + sk - sq + 5)
        torchs = F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias.masked_fill(~band, NEG_INF).to(dtype), enable_gqa=True)
        assert_within_rule(ours, torchs, ref, dtype, f"{dtype} window+alibi")


# --- torch.compile and opcheck with each option --------------------------------------------
def test_opcheck_with_variants():
    q, k, v = qkv(1, 4, 2, 33, 70, 32)
    sinks = torch.randn(4)
    mask = random_mask((1, 1, 33, 70), seed=2)
    for kwargs in (dict(attn_mask=mask), dict(window_left=10, window_right=3),
                   dict(softcap=5.0), dict(alibi_slopes=torch.rand(4)), dict(sinks=sinks)):
        args = (q, k, v, False, False, None, "auto")
        torch.library.opcheck(torch.ops.fattn.attention, args, kwargs)


def test_compile_with_variants():
    q, k, v = qkv(2, 4, 2, 40, 90, 64)
    mask = padding_mask(2, 40, 90, 17)
    sinks = torch.randn(4, requires_grad=True)

    def f(q, k, v, sinks):
        a = fattn.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        b = fattn.flash_attention(q, k, v, layout="bhsd", window_size=(16, 0), softcap=10.0,
                                  sinks=sinks)
        return a + b

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v, sinks), f(q, k, v, sinks), rtol=0, atol=0)


# --- bad input: a clear error naming the argument -----------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    (dict(window_size=(-2, 0)), "window_left must be >= -1 .-1: unbounded., got -2"),
    (dict(window_size=(0, -3)), "window_right must be >= -1"),
    (dict(softcap=-1.0), r"softcap must be finite and > 0 \(0: off\), got -1"),
    (dict(alibi_slopes=torch.ones(3)), r"alibi_slopes.size\(0\) \(query heads\) must equal "
                                       r"q.size\(1\) = 4, got 3"),
    (dict(alibi_slopes=torch.ones(4, dtype=torch.float16)), "alibi_slopes must have dtype "
                                                            "float32, got float16"),
    (dict(sinks=torch.ones(5)), r"sinks.size\(0\) \(query heads\) must equal q.size\(1\) = 4"),
])
def test_bad_variant_arguments(kwargs, message):
    q, k, v = qkv(1, 4, 2, 8, 9, 32)
    with pytest.raises(RuntimeError, match=message):
        fattn.flash_attention(q, k, v, layout="bhsd", **kwargs)


def test_bad_masks():
    q, k, v = qkv(2, 4, 4, 8, 9, 32)
    sdpa = fattn.scaled_dot_product_attention
    with pytest.raises(ValueError, match="does not broadcast to the scores"):
        sdpa(q, k, v, attn_mask=torch.ones(8, 10, dtype=torch.bool))
    with pytest.raises(ValueError, match="does not broadcast"):
        sdpa(q, k, v, attn_mask=torch.ones(3, 8, 9, dtype=torch.bool))
    with pytest.raises(RuntimeError, match="attn_mask must have dtype bool or q's dtype"):
        sdpa(q, k, v, attn_mask=torch.ones(8, 9, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="attn_mask must have dtype bool or q's dtype "
                                           "float32, got float16"):
        sdpa(q, k, v, attn_mask=torch.ones(8, 9, dtype=torch.float16))
    with pytest.raises(ValueError, match="attn_mask and is_causal=True"):
        sdpa(q, k, v, attn_mask=torch.ones(8, 9, dtype=torch.bool), is_causal=True)
    with pytest.raises(TypeError, match="attn_mask must be a torch.Tensor"):
        sdpa(q, k, v, attn_mask=[[True]])


# --- the decode kernel and the KV cache ----------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_with_variants(dtype, paged):
    """flash_attn_with_kvcache with a window, softcap, ALiBi and sinks: each sequence
    against the plain definition on its own keys (the decode kernel, split or not)."""
    b, hq, hkv, sq, d, cap = 2, 8, 2, 3, 64, 512
    lens = [500, 137]
    g = torch.Generator().manual_seed(11)
    q = torch.randn(b, sq, hq, d, generator=g).to(dtype)
    k_cache = torch.randn(b, cap, hkv, d, generator=g).to(dtype)
    v_cache = torch.randn(b, cap, hkv, d, generator=g).to(dtype)
    o = case_options(b, hq, dict(window=(100, -1), softcap=20.0, slopes="heads", sinks=True))
    kw = dict(cache_seqlens=torch.tensor(lens, dtype=torch.int32), causal=True,
              window_size=o["window"], softcap=o["softcap"], alibi_slopes=o["slopes"],
              sinks=o["sinks"])
    if paged:  # pages of 64 keys, the table in reverse order
        blocks = cap // 64
        table = torch.arange(b * blocks, dtype=torch.int32).flip(0).view(b, blocks)
        pages_k = torch.empty(b * blocks, 64, hkv, d, dtype=dtype)
        pages_v = torch.empty_like(pages_k)
        for n in range(b):
            for blk in range(blocks):
                pages_k[table[n, blk]] = k_cache[n, blk * 64:(blk + 1) * 64]
                pages_v[table[n, blk]] = v_cache[n, blk * 64:(blk + 1) * 64]
        out = fattn.flash_attn_with_kvcache(q, pages_k, pages_v, block_table=table, **kw)
    else:
        out = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, **kw)
    for n, length in enumerate(lens):
        ref, _ = plain(q[n:n + 1].transpose(1, 2), k_cache[n:n + 1, :length].transpose(1, 2),
                       v_cache[n:n + 1, :length].transpose(1, 2), causal="bottom_right", **o)
        got = out[n:n + 1].transpose(1, 2).double()
        tol = OUT_TOL if dtype == torch.float32 else 2.0 ** -7
        assert (got - ref).abs().max() <= tol * max(1.0, ref.abs().max().item()), n


@pytest.mark.parametrize("kwargs", [dict(attn_mask=torch.ones(1, 64, dtype=torch.bool)),
                                    dict(window_left=8), dict(softcap=5.0), dict(sinks=None)])
def test_decode_kernel_with_variants(kwargs):
    """impl="decode" (the kernel automatic picks for short queries) with each variant."""
    q, k, v = qkv(1, 8, 2, 1, 64 * 5 + 7, 32)
    kwargs = {key: (torch.randn(8) if key == "sinks" else value) for key, value in kwargs.items()}
    if "attn_mask" in kwargs:
        kwargs["attn_mask"] = torch.rand(1, 1, 1, k.size(2)) < 0.6
    out, lse = torch.ops.fattn.attention(q, k, v, True, True, None, "decode", **kwargs)
    ref, ref_lse = plain(q, k, v, causal="bottom_right",
                         window=(kwargs.get("window_left", -1), -1),
                         softcap=kwargs.get("softcap", 0.0), mask=kwargs.get("attn_mask"),
                         sinks=kwargs.get("sinks"))
    assert (out.double() - ref).abs().max() <= OUT_TOL * max(1.0, ref.abs().max().item())
    assert (lse.double() - ref_lse).abs().max() <= 1e-5 * max(1.0, ref_lse.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_varlen_with_variants(dtype):
    """flash_attn_varlen_func with a window, softcap, (B, Hq) ALiBi slopes and sinks: each
    sequence against the plain definition, forward and gradients (dsinks summed over the
    sequences); a sequence without keys gives 0 and lse = its head's sink."""
    lens_q, lens_k = [5, 40, 3, 0], [70, 33, 0, 9]
    hq, hkv, d = 4, 2, 32
    g = torch.Generator().manual_seed(21)
    q = torch.randn(sum(lens_q), hq, d, generator=g, dtype=dtype, requires_grad=True)
    k = torch.randn(sum(lens_k), hkv, d, generator=g, dtype=dtype, requires_grad=True)
    v = torch.randn(sum(lens_k), hkv, d, generator=g, dtype=dtype, requires_grad=True)
    cu = lambda lens: torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    o = case_options(len(lens_q), hq, dict(window=(20, 2), softcap=5.0, slopes="batch",
                                            sinks=True))
    sinks = o["sinks"].detach().to(dtype).requires_grad_()
    out, lse, _ = fattn.flash_attn_varlen_func(
        q, k, v, cu(lens_q), cu(lens_k), max(lens_q), max(lens_k), causal=True,
        window_size=o["window"], softcap=o["softcap"], alibi_slopes=o["slopes"].to(
            torch.float64 if dtype == torch.float64 else torch.float32),
        sinks=sinks, return_attn_probs=True)
    grad = torch.randn(out.shape, generator=g, dtype=dtype)
    (out * grad).sum().backward()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    s64 = o["sinks"].detach().double().requires_grad_()
    total = 0.0
    qs = ks = 0
    for n, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        if lq:
            sl = o["slopes"][n]
            ref, ref_lse = plain(q64[qs:qs + lq].transpose(0, 1)[None],
                                 k64[ks:ks + lk].transpose(0, 1)[None],
                                 v64[ks:ks + lk].transpose(0, 1)[None], causal="bottom_right",
                                 window=o["window"], softcap=o["softcap"], slopes=sl,
                                 sinks=s64)
            got = out[qs:qs + lq].transpose(0, 1)[None].double()
            assert (got - ref).abs().max() <= 2e-5 * max(1.0, ref.abs().max().item()), n
            assert torch.allclose(lse[:, qs:qs + lq].double(), ref_lse[0], atol=1e-5), n
            total = total + (ref * grad[qs:qs + lq].transpose(0, 1)[None].double()).sum()
        qs, ks = qs + lq, ks + lk
    total.backward()
    for ours, ref in ((q, q64), (k, k64), (v, v64), (sinks, s64)):
        bound = 2e-5 * max(1.0, ref.grad.abs().max().item())
        assert (ours.grad.double() - ref.grad).abs().max() <= bound
