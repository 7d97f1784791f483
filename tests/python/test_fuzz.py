"""Random problems against the float64 definition (test_variants.plain).

Each case draws its entry point (flash_attention, where Impl::automatic picks the fused
or the decode kernel; flash_attn_with_kvcache, paged or not, split or not, with an append
or not), dtype (float32, bfloat16, float16), shape (batch, GQA ratio, odd lengths, Sq ≠ Sk
both ways, head dims 16-256, odd multiples of 8 among them), layout ((B, H, S, D),
(B, S, H, D) views, strided views), causal alignment, window, softcap, ALiBi and sinks,
and the CPU kernels' instruction set (the library's choice, or AVX2 where the CPU has it:
on an AVX-512 machine the AVX2 kernels are tested too).
FATTN_TEST_SEED (read as the C++ suites read it: decimal, 0x hexadecimal, 0 octal)
changes every draw; a failure names its case.

The bound is the C++ suites' for every element (tests/util/tensor16.hpp, checks.hpp): the
output's rounding to its dtype (half an ulp of the exact value), P's rounding to bfloat16
where a kernel rounds it (2^-8 times the definition's output for |v|), and float32's own
1e-5 relative to max(1, max|ref|); the logsumexp within 1e-5 relative. Gradients (dq, dk,
dv and the sinks'): two ulps of the dtype at the largest gradient (the backward reads the
forward's rounded output) plus float32's 2e-5 relative to max(1, max|ref|), as
tests/test_16bit.cpp and tests/test_backward.cpp.
"""
import math
import os
import random

import pytest
import torch

import fattn
from test_16bit import laid_out
from test_variants import plain

CASES = 48
MANTISSA_BITS = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}
REL_TOL = 1e-5  # float32's own error, as the C++ suites (tests/util/checks.hpp)
HEAD_DIMS = [16, 24, 32, 40, 48, 64, 72, 80, 96, 128, 136, 160, 192, 256]


def seed_offset() -> int:
    text = os.environ.get("FATTN_TEST_SEED")
    try:
        return int(text, 0) if text else 0
    except ValueError:
        return 0


def draw(index):
    """The options of case `index`: a dict the case builds its tensors from."""
    r = random.Random(1_000_003 * (index + 1) ^ seed_offset())
    c = dict(entry=r.choice(["flash", "flash", "kvcache", "backward"]),
             dtype=r.choice([torch.float32, torch.bfloat16, torch.float16]),
             b=r.choice([1, 2]), hkv=r.choice([1, 2, 3]), group=r.choice([1, 2, 4, 5, 8]),
             d=r.choice(HEAD_DIMS), causal=r.random() < 0.5, seed=r.randrange(1 << 30))
    c["sq"] = r.choice([1, 2, 3, 5, 12, 16] if c["entry"] == "kvcache" else [1, 2, 3, 4, 7, 16, 33, 65, 130])
    c["sk"] = r.choice([1, 5, 31, 64, 97, 257, 600])
    c["layout"] = r.choice(["bhsd", "bshd", "strided"])
    c["window"] = (r.choice([-1, 0, 3, 40]), r.choice([-1, 0, 2, 50])) if r.random() < 0.3 else (-1, -1)
    c["softcap"] = r.choice([5.0, 30.0]) if r.random() < 0.2 else 0.0
    c["alibi"] = r.random() < 0.2
    c["sinks"] = r.random() < 0.2
    c["paged"] = r.random() < 0.5
    c["append"] = r.choice([0, 0, 1, 3])
    c["splits"] = r.choice([0, 0, 1, 3])
    c["isa"] = r.choice(["auto", "auto", "avx2"])  # drawn last: the draws above stay as they were
    return c


def case_id(index):
    c = draw(index)
    return (f"{index}-{c['entry']}-{str(c['dtype'])[6:]}-b{c['b']}h{c['hkv'] * c['group']}x{c['hkv']}"
            f"-s{c['sq']}x{c['sk']}-d{c['d']}-{c['isa']}")


def assert_within_bound(got, ref, ref_abs_v, dtype, what):
    """Element by element: half an ulp of dtype at |ref|, P's rounding for bfloat16, and
    float32's own error."""
    got, ref = got.double(), ref.double()
    bound = 2.0 ** -(MANTISSA_BITS[dtype] + 1) * ref.abs() + REL_TOL * max(1.0, ref.abs().max().item())
    if dtype == torch.bfloat16:
        bound = bound + 2.0 ** -8 * ref_abs_v
    excess = (got - ref).abs() - bound
    worst = excess.argmax() if excess.numel() else None
    assert excess.numel() == 0 or excess.max().item() <= 0, (
        f"{what}: |got - ref| exceeds the bound by {excess.max().item():.3g} at flat index "
        f"{worst.item()} (got {got.flatten()[worst].item()}, ref {ref.flatten()[worst].item()})")


def assert_lse_near(lse, ref_lse, what):
    lse, ref_lse = lse.double(), ref_lse.double()
    hidden = ref_lse == float("-inf")
    assert torch.equal(lse == float("-inf"), hidden), f"{what}: rows with no key differ"
    err = (lse - ref_lse).abs()[~hidden]
    if err.numel():
        assert (err <= REL_TOL * ref_lse[~hidden].abs().clamp(min=1.0)).all(), f"{what}: lse"


def options(c, hq, g):
    o = dict(window=c["window"], softcap=c["softcap"])
    o["slopes"] = torch.rand(hq, generator=g) * 0.5 if c["alibi"] else None
    o["sinks"] = torch.randn(hq, generator=g) * 2 if c["sinks"] else None
    return o


def run_flash(c):
    g = torch.Generator().manual_seed(c["seed"])
    hq, dtype = c["hkv"] * c["group"], c["dtype"]
    logits = 4.0 if c["softcap"] else 1.0  # softcap: scores well past the cap
    q = laid_out(g, (c["b"], hq, c["sq"], c["d"]), c["layout"], dtype, logits)
    k = laid_out(g, (c["b"], c["hkv"], c["sk"], c["d"]), c["layout"], dtype, logits)
    v = laid_out(g, (c["b"], c["hkv"], c["sk"], c["d"]), c["layout"], dtype)
    o = options(c, hq, g)
    out, lse = fattn.flash_attention(q, k, v, layout="bhsd", causal=c["causal"], return_lse=True,
                                     window_size=o["window"], softcap=o["softcap"],
                                     alibi_slopes=o["slopes"], sinks=o["sinks"])
    causal = "bottom_right" if c["causal"] else None
    ref, ref_lse = plain(q, k, v, causal=causal, **o)
    ref_abs, _ = plain(q, k, v.abs(), causal=causal, **o)
    assert_within_bound(out, ref, ref_abs, dtype, "out")
    assert_lse_near(lse, ref_lse, "lse")


GRAD_TOL = 2e-5  # float32's own error in a gradient, as tests/test_backward.cpp


def assert_grad_near(got, ref, dtype, what, moved=0.0):
    """Within two ulps of dtype at the largest gradient, float32's own error, and `moved`
    (per element: what the rounded output moves it by)."""
    got, ref = got.double(), ref.double()
    largest = max(1.0, ref.abs().max().item()) if ref.numel() else 1.0
    bound = 2 * 2.0 ** -MANTISSA_BITS[dtype] * ref.abs().max().item() + GRAD_TOL * largest + moved
    excess = (got - ref).abs() - bound
    assert excess.numel() == 0 or excess.max().item() <= 0, (
        f"{what}: the error exceeds its bound by {excess.max().item():.3g}")


def run_backward(c):
    g = torch.Generator().manual_seed(c["seed"])
    hq, dtype = c["hkv"] * c["group"], c["dtype"]
    logits = 4.0 if c["softcap"] else 1.0
    q = laid_out(g, (c["b"], hq, c["sq"], c["d"]), c["layout"], dtype, logits)
    k = laid_out(g, (c["b"], c["hkv"], c["sk"], c["d"]), c["layout"], dtype, logits)
    v = laid_out(g, (c["b"], c["hkv"], c["sk"], c["d"]), c["layout"], dtype)
    dout = torch.randn(q.shape, generator=g).to(dtype)
    o = options(c, hq, g)
    causal = "bottom_right" if c["causal"] else None

    def grads(q, k, v, sinks, fn):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        sink = None if sinks is None else sinks.detach().clone().requires_grad_()
        fn(*leaves, sink).backward(dout.to(leaves[0].dtype))
        return [t.grad for t in leaves] + ([] if sink is None else [sink.grad])

    ours = grads(q, k, v, o["sinks"], lambda q, k, v, s: fattn.flash_attention(
        q, k, v, layout="bhsd", causal=c["causal"], window_size=o["window"],
        softcap=o["softcap"], alibi_slopes=o["slopes"], sinks=s))
    exact = grads(q.double(), k.double(), v.double(), o["sinks"], lambda q, k, v, s: plain(
        q, k, v, causal=causal, window=o["window"], softcap=o["softcap"], slopes=o["slopes"],
        sinks=s)[0])
    # The backward reads the forward's out rounded to dtype: each Δ_i = dout_i·out_i moves
    # by up to half an ulp of Σ_d |dout||out|, and dS_ij = P_ij (dP_ij − Δ_i) with it, so
    # dq_i by scale·δΔ_i·Σ_j P_ij |k_j|, dk_j by scale·Σ_i P_ij δΔ_i |q_i| (the softcap's
    # derivative is at most 1), dsinks_h by Σ_i p_sink,i δΔ_i.
    out, lse, p = plain(q, k, v, causal=causal, **o, return_p=True)
    delta = (dout.double().abs() * out.abs()).sum(-1, keepdim=True) * 2.0 ** -(MANTISSA_BITS[dtype] + 1)
    scale = 1 / math.sqrt(c["d"])
    k_all = k.double().abs().repeat_interleave(c["group"], dim=1)
    moved_dq = scale * delta * (p @ k_all)
    moved_dk = scale * (p.transpose(-1, -2) @ (delta * q.double().abs()))
    moved_dk = moved_dk.view(c["b"], c["hkv"], c["group"], c["sk"], c["d"]).sum(2)
    for name, got, ref, moved in zip(["dq", "dk", "dv"], ours, exact, [moved_dq, moved_dk, 0.0]):
        assert_grad_near(got, ref, dtype, name, moved)
    if o["sinks"] is not None:
        p_sink = torch.exp(o["sinks"].double().view(1, -1, 1, 1) - lse.unsqueeze(-1))
        assert_grad_near(ours[3], exact[3], torch.float32, "dsinks", (p_sink * delta).sum((0, 2, 3)))


def paged(k_cache, v_cache, block):
    """(B, S, H, D) caches as pages of `block` keys, and their shuffled block table."""
    b, s = k_cache.shape[:2]
    blocks = s // block
    table = torch.randperm(b * blocks).to(torch.int32).view(b, blocks)
    pages_k = torch.empty((b * blocks, block) + k_cache.shape[2:], dtype=k_cache.dtype)
    pages_v = torch.empty_like(pages_k)
    for n in range(b):
        for i in range(blocks):
            pages_k[table[n, i]] = k_cache[n, i * block:(i + 1) * block]
            pages_v[table[n, i]] = v_cache[n, i * block:(i + 1) * block]
    return pages_k, pages_v, table


def run_kvcache(c):
    g = torch.Generator().manual_seed(c["seed"])
    hq, dtype, b, d = c["hkv"] * c["group"], c["dtype"], c["b"], c["d"]
    block = 16 * (1 + c["seed"] % 4)
    cap = (c["sk"] + c["append"] + block) // block * block
    lens = [int(x) for x in torch.randint(0, c["sk"] + 1, (b,), generator=g)]
    lens[0] = c["sk"]
    logits = 4.0 if c["softcap"] else 1.0
    q = laid_out(g, (b, hq, c["sq"], d), "bhsd", dtype, logits).transpose(1, 2)
    k_cache = laid_out(g, (b, c["hkv"], cap, d), "bhsd", dtype, logits).transpose(1, 2).contiguous()
    v_cache = laid_out(g, (b, c["hkv"], cap, d), "bhsd", dtype).transpose(1, 2).contiguous()
    k_new = v_new = None
    if c["append"]:
        k_new = laid_out(g, (b, c["hkv"], c["append"], d), "bhsd", dtype, logits).transpose(1, 2)
        v_new = laid_out(g, (b, c["hkv"], c["append"], d), "bhsd", dtype).transpose(1, 2)
    o = options(c, hq, g)
    kw = dict(cache_seqlens=torch.tensor(lens, dtype=torch.int32), causal=c["causal"],
              window_size=o["window"], softcap=o["softcap"], alibi_slopes=o["slopes"],
              sinks=o["sinks"], num_splits=c["splits"], return_softmax_lse=True)
    # the cache after the append, for the definition
    k_all, v_all = k_cache.clone(), v_cache.clone()
    for n, length in enumerate(lens):
        if k_new is not None:
            k_all[n, length:length + c["append"]] = k_new[n]
            v_all[n, length:length + c["append"]] = v_new[n]
    with torch.no_grad():
        if c["paged"]:
            pages_k, pages_v, table = paged(k_cache, v_cache, block)
            out, lse = fattn.flash_attn_with_kvcache(q, pages_k, pages_v, k_new, v_new, block_table=table, **kw)
        else:
            out, lse = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, **kw)
            assert torch.equal(k_cache, k_all) and torch.equal(v_cache, v_all), "the append"
    causal = "bottom_right" if c["causal"] else None
    for n, length in enumerate(lens):
        keys = length + c["append"]
        kn, vn = k_all[n:n + 1, :keys].transpose(1, 2), v_all[n:n + 1, :keys].transpose(1, 2)
        qn = q[n:n + 1].transpose(1, 2)
        ref, ref_lse = plain(qn, kn, vn, causal=causal, **o)
        ref_abs, _ = plain(qn, kn, vn.abs(), causal=causal, **o)
        assert_within_bound(out[n:n + 1].transpose(1, 2), ref, ref_abs, dtype, f"out of sequence {n}")
        assert_lse_near(lse[n:n + 1], ref_lse, f"lse of sequence {n}")


@pytest.mark.parametrize("index", range(CASES), ids=case_id)
def test_random_problem(index):
    c = draw(index)
    isa = c["isa"] if fattn._C.cpu_supports(c["isa"]) else "auto"
    before = fattn._C.set_cpu_isa(isa)
    try:
        {"flash": run_flash, "kvcache": run_kvcache, "backward": run_backward}[c["entry"]](c)
    finally:
        fattn._C.set_cpu_isa(before)
