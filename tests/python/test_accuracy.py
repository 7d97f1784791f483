"""fattn against torch on the CPU: max_err < 1e-3 against torch SDPA; a float64 reference grid."""
import itertools

import pytest
import torch
import torch.nn.functional as F

import fattn
from conftest import assert_close_to_reference, assert_lse_close, cpu_isa, qkv, randn, reference


# --- the accuracy bound: max_err < 1e-3 against F.scaled_dot_product_attention -----------
@pytest.mark.parametrize("b,h,s,d", [(1, 2, 64, 32), (2, 4, 128, 64),  # small
                                     (2, 8, 512, 64), (2, 8, 1024, 64), (2, 4, 256, 128)])  # medium
def test_attention_forward_within_1e3_of_sdpa(b, h, s, d):
    q, k, v = qkv(b, h, h, s, s, d, seed=s + d)
    out = fattn.attention_forward(q, k, v)
    expected = F.scaled_dot_product_attention(q, k, v)
    assert out.shape == (b, h, s, d) and out.dtype == torch.float32 and out.is_contiguous()
    max_err = (out - expected).abs().max().item()
    assert max_err < 1e-3
    # and much tighter against float64
    assert_close_to_reference(out, reference(q, k, v)[0])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,h,s,d", [(2, 4, 128, 64), (2, 8, 512, 64)])
def test_sdpa_within_1e3_of_torch(b, h, s, d, causal):
    q, k, v = qkv(b, h, h, s, s, d, seed=7)
    out = fattn.scaled_dot_product_attention(q, k, v, is_causal=causal)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert (out - expected).abs().max().item() < 1e-3
    ref = reference(q, k, v, "top_left" if causal else None)[0]
    assert_close_to_reference(out, ref)
    # fattn is at least about as accurate as torch's own float32 kernel
    err_fattn = (out.double() - ref).abs().max().item()
    err_torch = (expected.double() - ref).abs().max().item()
    assert err_fattn <= 4 * err_torch + 1e-7


# --- the grid, as in the C++ suite: odd lengths, Sq != Sk, both causal alignments, GQA,
# non-contiguous views, head dims 16..256; output and logsumexp against float64 ------------
LENGTHS = [(1, 1), (7, 7), (63, 63), (65, 65), (113, 113), (1, 65), (7, 113), (113, 7),
           (63, 65), (65, 63)]


@pytest.mark.parametrize("sq,sk", LENGTHS)
@pytest.mark.parametrize("causal", [None, "top_left", "bottom_right"])
def test_grid_lengths_and_causal(sq, sk, causal):
    q, k, v = qkv(2, 4, 2, sq, sk, 64, seed=sq * 1000 + sk)
    out, lse = torch.ops.fattn.attention(q, k, v, causal is not None, causal == "bottom_right")
    ref, ref_lse = reference(q, k, v, causal)
    assert_close_to_reference(out, ref)
    assert_lse_close(lse, ref_lse)


@pytest.mark.parametrize("d", [16, 32, 64, 80, 96, 128, 160, 256])
@pytest.mark.parametrize("layout", ["bhsd", "bshd", "strided"])
def test_grid_head_dims_and_layouts(d, layout):
    q, k, v = qkv(1, 3, 3, 65, 113, d, seed=d, layout=layout)
    if layout != "bhsd":
        assert not q.is_contiguous()
    out, lse = torch.ops.fattn.attention(q, k, v, True, True)
    ref, ref_lse = reference(q, k, v, "bottom_right")
    assert_close_to_reference(out, ref)
    assert_lse_close(lse, ref_lse)


def test_head_dim_not_innermost():
    # D is the outermost dimension in memory: any strides are read as they are
    q = randn(64, 2, 3, 37, seed=1).permute(1, 2, 3, 0)
    k = randn(64, 2, 3, 41, seed=2).permute(1, 2, 3, 0)
    v = randn(64, 2, 3, 41, seed=3).permute(1, 2, 3, 0)
    out, lse = torch.ops.fattn.attention(q, k, v)
    ref, ref_lse = reference(q, k, v)
    assert_close_to_reference(out, ref)
    assert_lse_close(lse, ref_lse)


def test_broadcast_views():
    # stride-0 views (expand) are read without materialising them
    k = randn(1, 1, 50, 32, seed=1).expand(2, 4, 50, 32)
    v = randn(1, 1, 50, 32, seed=2).expand(2, 4, 50, 32)
    q = randn(2, 4, 9, 32, seed=3)
    out = fattn.scaled_dot_product_attention(q, k, v)
    assert_close_to_reference(out, reference(q, k, v)[0])


@pytest.mark.parametrize("hq,hkv", [(4, 2), (8, 1), (6, 3)])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_enable_gqa(hq, hkv, causal):
    q, k, v = qkv(2, hq, hkv, 63, 65, 64, seed=hq + hkv)
    out = fattn.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    assert (out - expected).abs().max().item() < 1e-4
    assert_close_to_reference(out, reference(q, k, v, "top_left" if causal else None)[0])


@pytest.mark.parametrize("impl", ["auto", "fused", "naive", "reference"])
@pytest.mark.parametrize("causal", [None, "top_left", "bottom_right"])
def test_impls(impl, causal):
    q, k, v = qkv(2, 4, 2, 65, 113, 64, seed=3, layout="bshd")
    out, lse = torch.ops.fattn.attention(q, k, v, causal is not None, causal == "bottom_right",
                                         None, impl)
    ref, ref_lse = reference(q, k, v, causal)
    assert_close_to_reference(out, ref, tol=1.2e-7 if impl == "reference" else 1e-5)  # float32 rounding
    assert_lse_close(lse, ref_lse)


@pytest.mark.parametrize("scale", [0.5, 1.0, 0.01, -0.3])
def test_scale(scale):
    q, k, v = qkv(1, 2, 2, 33, 47, 64, seed=5)
    out = fattn.scaled_dot_product_attention(q, k, v, scale=scale)
    assert (out - F.scaled_dot_product_attention(q, k, v, scale=scale)).abs().max() < 1e-4
    assert_close_to_reference(out, reference(q, k, v, scale=scale)[0])


# --- the API's shapes and layouts ----------------------------------------------------------
def test_sdpa_3d_and_other_ranks():
    q, k, v = randn(4, 33, 64, seed=1), randn(4, 40, 64, seed=2), randn(4, 40, 64, seed=3)
    out = fattn.scaled_dot_product_attention(q, k, v, is_causal=True)  # (H, S, D)
    assert out.shape == (4, 33, 64)
    assert (out - F.scaled_dot_product_attention(q, k, v, is_causal=True)).abs().max() < 1e-5
    q2, k2, v2 = q[0], k[0], v[0]  # (S, D)
    out2 = fattn.scaled_dot_product_attention(q2, k2, v2)
    assert (out2 - F.scaled_dot_product_attention(q2, k2, v2)).abs().max() < 1e-5
    q5, k5, v5 = (t.reshape(2, 2, 1, *t.shape[1:]).expand(2, 2, 3, *t.shape[1:]).contiguous()
                  for t in (q, k, v))  # (B1, B2, H, S, D)
    out5 = fattn.scaled_dot_product_attention(q5, k5, v5)
    assert out5.shape == q5.shape
    assert (out5 - F.scaled_dot_product_attention(q5, k5, v5)).abs().max() < 1e-5


def test_sdpa_3d_gqa():
    q, k, v = randn(8, 20, 32, seed=1), randn(2, 30, 32, seed=2), randn(2, 30, 32, seed=3)
    out = fattn.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert (out - expected).abs().max() < 1e-5


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_bshd(causal):
    b, sq, sk, hq, hkv, d = 2, 70, 100, 4, 2, 64
    q, k, v = randn(b, sq, hq, d, seed=1), randn(b, sk, hkv, d, seed=2), randn(b, sk, hkv, d, seed=3)
    out, lse = fattn.flash_attention(q, k, v, causal=causal, return_lse=True)
    assert out.shape == (b, sq, hq, d) and out.is_contiguous()  # BSHD in, BSHD out
    assert lse.shape == (b, hq, sq)
    ref, ref_lse = reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                             "bottom_right" if causal else None)
    assert_close_to_reference(out.transpose(1, 2), ref)
    assert_lse_close(lse, ref_lse)
    # layout="bhsd" gives the same numbers
    out2 = fattn.flash_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                 causal=causal, layout="bhsd")
    assert torch.equal(out2, out.transpose(1, 2))


def test_flash_attention_more_queries_than_keys():
    # bottom-right with Sq > Sk: the first Sq - Sk queries see no key -> 0, lse -inf
    q, k, v = randn(1, 10, 2, 32, seed=1), randn(1, 4, 2, 32, seed=2), randn(1, 4, 2, 32, seed=3)
    out, lse = fattn.flash_attention(q, k, v, causal=True, return_lse=True)
    assert torch.all(out[:, :6] == 0)
    assert torch.all(torch.isneginf(lse[:, :, :6])) and torch.isfinite(lse[:, :, 6:]).all()
    ref, _ = reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), "bottom_right")
    assert_close_to_reference(out.transpose(1, 2), ref)


def test_softmax_scale():
    q, k, v = randn(1, 30, 2, 64, seed=1), randn(1, 30, 2, 64, seed=2), randn(1, 30, 2, 64, seed=3)
    out = fattn.flash_attention(q, k, v, softmax_scale=0.05)
    ref, _ = reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=0.05)
    assert_close_to_reference(out.transpose(1, 2), ref)


def test_output_layout_follows_query():
    q, k, v = qkv(2, 4, 4, 16, 16, 32, layout="bhsd")
    out, lse = torch.ops.fattn.attention(q, k, v)
    assert out.is_contiguous() and lse.is_contiguous() and lse.shape == (2, 4, 16)
    q, k, v = qkv(2, 4, 4, 16, 16, 32, layout="bshd")
    out, _ = torch.ops.fattn.attention(q, k, v)
    assert out.transpose(1, 2).is_contiguous()  # (B, S, H, D) memory


def test_empty_problems():
    q, k, v = randn(2, 3, 0, 32), randn(2, 3, 5, 32), randn(2, 3, 5, 32)
    out = fattn.scaled_dot_product_attention(q, k, v)
    assert out.shape == (2, 3, 0, 32)
    q = randn(2, 3, 4, 32)
    out, lse = torch.ops.fattn.attention(q, randn(2, 3, 0, 32), randn(2, 3, 0, 32))
    assert torch.all(out == 0) and torch.all(torch.isneginf(lse))


def test_inference_mode_and_no_grad_inputs_that_require_grad():
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 2, 8, 8, 32))
    with torch.inference_mode():
        out = fattn.scaled_dot_product_attention(q, k, v)
    assert_close_to_reference(out, reference(q.detach(), k.detach(), v.detach())[0])


def test_threads_agree():
    q, k, v = qkv(2, 4, 4, 200, 200, 64, seed=9)
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.ops.fattn.attention(q, k, v, True)[0]
        torch.set_num_threads(2)
        two = torch.ops.fattn.attention(q, k, v, True)[0]
    finally:
        torch.set_num_threads(n)
    assert torch.equal(one, two)  # each row is computed by one thread: bitwise equal


def test_extra_bytes():
    q, k, v = qkv(2, 4, 4, 256, 256, 64)
    naive = fattn.extra_bytes(q, k, v, impl="naive")
    fused = fattn.extra_bytes(q, k, v, impl="fused")
    assert naive >= 2 * 4 * 256 * 256 * 4  # the Sq x Sk score buffer
    assert 0 < fused < naive
    assert fattn.extra_bytes(q, k, v, impl="reference") >= 0


def test_flops():
    assert fattn.flops(2, 8, 128, 128, 64) == 4 * 2 * 8 * 128 * 128 * 64
    assert fattn.flops(1, 1, 4, 4, 16, "top_left") == 4 * 16 * (1 + 2 + 3 + 4)
    assert fattn.flops(1, 1, 2, 4, 16, "bottom_right") == 4 * 16 * (3 + 4)


def test_many_shapes_quickly():
    # a sweep of small random-ish shapes through the public API
    for i, (sq, sk, d, causal) in enumerate(itertools.product([3, 17], [5, 31], [16, 48],
                                                              [False, True])):
        q, k, v = qkv(1, 2, 1, sq, sk, d, seed=i)
        out = fattn.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        ref = reference(q, k, v, "top_left" if causal else None)[0]
        assert_close_to_reference(out, ref)


def test_release_cached_memory_then_run_again():
    q, k, v = qkv(1, 2, 2, 300, 300, 64, seed=21)
    first = torch.ops.fattn.attention(q, k, v, False, False, None, "naive")[0]
    fattn.release_cached_memory()
    again = torch.ops.fattn.attention(q, k, v, False, False, None, "naive")[0]
    assert torch.equal(first, again)


# --- large logits: float32 error against float64, beside torch's own float32 error --------
# q, k ~ 4·N(0, 1), scale 0.3: |scores| reach 50-250, where one rounding of a score moves
# its probability by ~1e-5, so the output's error is that of the scores' sums over the head
# dim. The rule: fattn's RMS error at most 1.5× torch SDPA's on the same inputs, on the
# kernels Impl::automatic picks, with the AVX-512 and with the AVX2 kernels (cpu_isa: an
# AVX-512 machine runs both). torch's error is lower at Sq ≤ 3 (its matrix-vector products)
# than at Sq ≥ 16 (its GEMM), 2× at D = 96-128. At least 512 query rows: the RMS of a few
# rows is decided by those whose top two keys nearly tie, and over 64 rows the ratio of
# two equally accurate kernels reached 1.7 on some seeds.
# dev-zen5, these cases: each score in one FMA chain (chains of 128 dims added in turn),
# in the fused kernel and the decode kernel's transposed key tile (then AVX2 at every row
# count, AVX-512 from 5 rows per kv head): 1.15-2.77 with AVX2 at Sq ≤ 3 (9 of 14 over
# 1.5), 1.92-2.48 with AVX-512 at GQA 4-16:1; the AVX-512 decode kernel's direct scores
# (≤ 4 rows: 16 lane partials and a tree) 0.59-0.97. Chains of 16 dims summed pairwise
# (cpu/common/blocks.hpp, sum_chains), every kernel and ISA: 0.36-1.02; over 10 seeds (AVX2,
# D = 16-256, Sq ≤ 3) medians 0.61-1.13, at most 1.34.
LARGE_LOGIT_CASES = ([(sq, d, 1) for sq in (1, 2, 3, 16, 64) for d in (16, 96, 256)]
                     + [(1, 48, 1), (3, 128, 1), (1, 128, 8), (2, 96, 4), (3, 64, 16)])


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("sq, d, group", LARGE_LOGIT_CASES)
def test_large_logits_error_within_torchs(sq, d, group, isa):
    g = torch.Generator().manual_seed(100 + sq + d + group)
    heads, scale = max(64, -(-512 // (sq * group)) * group), 0.3
    q = 4 * torch.randn(1, heads, sq, d, generator=g)
    k = 4 * torch.randn(1, heads // group, 512, d, generator=g)
    v = torch.randn(1, heads // group, 512, d, generator=g)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=scale,
                                         enable_gqa=True)
    with cpu_isa(isa):
        ours = fattn.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
    torchs = F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)

    def rms(x):
        return ((x.double() - ref) ** 2).mean().sqrt().item()

    # Floor: torch's error is never below ~1e-7 on such inputs (the output's own rounding).
    assert rms(ours) <= 1.5 * rms(torchs) + 1e-8, (rms(ours), rms(torchs))
