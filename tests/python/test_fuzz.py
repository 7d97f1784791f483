"""Random problems against the float64 definition (test_variants.plain).

Each case draws its entry point (flash_attention, where Impl::automatic picks the fused
or the decode kernel; flash_attn_with_kvcache, paged or not, split or not, with an append
or not), dtype (float32, bfloat16, float16), shape (batch, GQA ratio, odd lengths, Sq ≠ Sk
both ways, head dims 16-256, odd multiples of 8 among them), layout ((B, H, S, D),
(B, S, H, D) views, strided views), causal alignment, window, softcap, ALiBi and sinks.
FATTN_TEST_SEED (read as the C++ suites read it: decimal, 0x hexadecimal, 0 octal)
changes every draw; a failure names its case.

The bound is the C++ suites' for every element (tests/util/tensor16.hpp, checks.hpp): the
output's rounding to its dtype (half an ulp of the exact value), P's rounding to bfloat16
where a kernel rounds it (2^-8 times the definition's output for |v|), and float32's own
1e-5 relative to max(1, max|ref|); the logsumexp within 1e-5 relative.
"""
import os
import random

import pytest
import torch

import fattn
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
    c = dict(entry=r.choice(["flash", "flash", "kvcache"]),
             dtype=r.choice([torch.float32, torch.bfloat16, torch.float16]),
             b=r.choice([1, 2]), hkv=r.choice([1, 2, 3]), group=r.choice([1, 2, 4, 5, 8]),
             d=r.choice(HEAD_DIMS), causal=r.random() < 0.5, seed=r.randrange(1 << 30))
    c["sq"] = r.choice([1, 2, 3, 4, 7, 16, 33, 65, 130] if c["entry"] == "flash" else [1, 2, 3, 5, 12, 16])
    c["sk"] = r.choice([1, 5, 31, 64, 97, 257, 600])
    c["layout"] = r.choice(["bhsd", "bshd", "strided"])
    c["window"] = (r.choice([-1, 0, 3, 40]), r.choice([-1, 0, 2, 50])) if r.random() < 0.3 else (-1, -1)
    c["softcap"] = r.choice([5.0, 30.0]) if r.random() < 0.2 else 0.0
    c["alibi"] = r.random() < 0.2
    c["sinks"] = r.random() < 0.2
    c["paged"] = r.random() < 0.5
    c["append"] = r.choice([0, 0, 1, 3])
    c["splits"] = r.choice([0, 0, 1, 3])
    return c


def case_id(index):
    c = draw(index)
    return (f"{index}-{c['entry']}-{str(c['dtype'])[6:]}-b{c['b']}h{c['hkv'] * c['group']}x{c['hkv']}"
            f"-s{c['sq']}x{c['sk']}-d{c['d']}")


def tensor(g, shape, layout, dtype, scale=1.0):
    """(B, H, S, D) logically, laid out as `layout` in memory."""
    b, h, s, d = shape
    if layout == "bhsd":
        return (scale * torch.randn(b, h, s, d, generator=g)).to(dtype)
    if layout == "bshd":
        return (scale * torch.randn(b, s, h, d, generator=g)).to(dtype).transpose(1, 2)
    wide = (scale * torch.randn(b, h + 1, s + 3, 2 * d + 1, generator=g)).to(dtype)
    return wide[:, 1:, 2:-1, 1::2]


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
    q = tensor(g, (c["b"], hq, c["sq"], c["d"]), c["layout"], dtype, logits)
    k = tensor(g, (c["b"], c["hkv"], c["sk"], c["d"]), c["layout"], dtype, logits)
    v = tensor(g, (c["b"], c["hkv"], c["sk"], c["d"]), c["layout"], dtype)
    o = options(c, hq, g)
    out, lse = fattn.flash_attention(q, k, v, layout="bhsd", causal=c["causal"], return_lse=True,
                                     window_size=o["window"], softcap=o["softcap"],
                                     alibi_slopes=o["slopes"], sinks=o["sinks"])
    causal = "bottom_right" if c["causal"] else None
    ref, ref_lse = plain(q, k, v, causal=causal, **o)
    ref_abs, _ = plain(q, k, v.abs(), causal=causal, **o)
    assert_within_bound(out, ref, ref_abs, dtype, "out")
    assert_lse_near(lse, ref_lse, "lse")


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
    q = tensor(g, (b, hq, c["sq"], d), "bhsd", dtype, logits).transpose(1, 2)
    k_cache = tensor(g, (b, c["hkv"], cap, d), "bhsd", dtype, logits).transpose(1, 2).contiguous()
    v_cache = tensor(g, (b, c["hkv"], cap, d), "bhsd", dtype).transpose(1, 2).contiguous()
    k_new = v_new = None
    if c["append"]:
        k_new = tensor(g, (b, c["hkv"], c["append"], d), "bhsd", dtype, logits).transpose(1, 2)
        v_new = tensor(g, (b, c["hkv"], c["append"], d), "bhsd", dtype).transpose(1, 2)
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
    (run_flash if c["entry"] == "flash" else run_kvcache)(c)
