"""fattn.triton's arguments where the C++ library has a rule: what it refuses Triton refuses
in the same words (a caller's out or gradients overlapping what the call reads, a KV
cache appended to through itself, a scale that is not finite), and what it takes Triton
computes the same (offsets as strided views, a window longer than any sequence, a mask
broadcast along the keys). Each case would otherwise be a silent wrong answer or a read
out of bounds: the kernels step through offsets one int32 at a time, the band is int32,
and writing an output the kernels read races them."""
import os

import pytest
import torch

if not torch.cuda.is_available():  # conftest.py sets it first; this is for a lone run
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

import fattn.triton  # noqa: E402
from conftest import int32  # noqa: E402
from test_triton import DEVICE, TILES  # noqa: E402

ArgumentError = fattn.triton.ArgumentError


def randn(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE)


def dense(seed=0, b=1, h=2, sq=20, sk=33, d=16):
    return randn(b, h, sq, d, seed=seed), randn(b, h, sk, d, seed=seed + 1), \
        randn(b, h, sk, d, seed=seed + 2)


# --- what the kernels would have computed wrongly: now the C++ library's answer -----------

def test_strided_offsets_read_as_their_values():
    total_q, total_k = 19, 40
    q, k, v = randn(total_q, 2, 16, seed=1), randn(total_k, 2, 16, seed=2), \
        randn(total_k, 2, 16, seed=3)
    cu_q, cu_k = int32([0, 7, 19]).to(DEVICE), int32([0, 25, 40]).to(DEVICE)
    # the same values every other int32 of a longer tensor
    spread_q = int32([0, 99, 7, 99, 19]).to(DEVICE)[::2]
    spread_k = int32([0, 99, 25, 99, 40]).to(DEVICE)[::2]
    assert spread_q.stride(0) == 2 and torch.equal(spread_q, cu_q)
    want = fattn.triton.attention_varlen(q, k, v, cu_q, cu_k, causal=True, **TILES)
    got = fattn.triton.attention_varlen(q, k, v, spread_q, spread_k, causal=True, **TILES)
    assert torch.equal(got, want)


def test_strided_seqused_k_reads_as_its_values():
    k_cache, v_cache = randn(6, 2, 16, 16, seed=4), randn(6, 2, 16, 16, seed=5)
    table = int32([[3, 0, 5], [1, 4, 2]]).to(DEVICE)
    q = randn(3, 2, 16, seed=6)
    cu_q = int32([0, 1, 3]).to(DEVICE)
    used = int32([37, 20]).to(DEVICE)
    spread = int32([37, -1, 20, -1]).to(DEVICE)[::2]
    want = fattn.triton.attention_varlen_kvcache(q, k_cache, v_cache, cu_q, None, used, table,
                                                 causal=True, **TILES)
    got = fattn.triton.attention_varlen_kvcache(q, k_cache, v_cache, cu_q, None, spread, table,
                                                causal=True, **TILES)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_pages_with_seqused_k_read_no_key_offsets():
    """As the CPU's: cu_seqlens_k beside seqused_k and a block table is neither read nor
    checked (the kernels read the lengths from seqused_k, the rows from the pages)."""
    k_cache, v_cache = randn(6, 2, 16, 16, seed=21), randn(6, 2, 16, 16, seed=22)
    table = int32([[3, 0, 5], [1, 4, 2]]).to(DEVICE)
    q = randn(3, 2, 16, seed=23)
    cu_q, used = int32([0, 1, 3]).to(DEVICE), int32([37, 20]).to(DEVICE)
    want = fattn.triton.attention_varlen_kvcache(q, k_cache, v_cache, cu_q, None, used, table,
                                                 **TILES)
    got = fattn.triton.attention_varlen_kvcache(q, k_cache, v_cache, cu_q,
                                                int32([0, 999, -5]).to(DEVICE), used, table,
                                                **TILES)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_window_longer_than_any_sequence_hides_nothing(side):
    # align = Sk − Sq: align − left wraps in int32 where align < −1, align + right where > 0
    q, k, v = dense(seed=7, sq=33, sk=20) if side == "left" else dense(seed=7, sq=20, sk=33)
    huge = 2 ** 31 - 1
    window = (huge, -1) if side == "left" else (-1, huge)
    want = fattn.triton.attention(q, k, v, causal=False, **TILES)
    got = fattn.triton.attention(q, k, v, window_size=window, **TILES)
    assert torch.allclose(got, want, atol=1e-6, rtol=0)


def test_a_mask_broadcast_along_the_keys():
    q, k, v = dense(seed=8)
    column = torch.zeros(1, 1, q.size(2), 1, device=DEVICE)
    column[..., 3, 0] = float("-inf")  # row 3 sees no key
    full = column.expand(1, 1, q.size(2), k.size(2)).contiguous()
    want, want_lse = fattn.triton.attention(q, k, v, attn_mask=full, return_lse=True, **TILES)
    got, lse = fattn.triton.attention(q, k, v, attn_mask=column, return_lse=True, **TILES)
    assert torch.equal(got, want) and torch.equal(lse, want_lse)
    assert torch.equal(got[:, :, 3], torch.zeros_like(got[:, :, 3]))


# --- what the C++ library refuses, refused in its words ------------------------------------

def test_out_must_not_overlap_an_input():
    q, k, v = dense(seed=9, sq=33)
    with pytest.raises(ArgumentError, match=r"out must not overlap k \(the kernels read inputs "
                                            r"while writing outputs\)"):
        fattn.triton.attention(q, k, v, out=k, **TILES)
    with pytest.raises(ArgumentError, match="out must not overlap q"):
        fattn.triton.attention(q, k, v, out=q, **TILES)


def test_out_is_checked_as_a_destination():
    q, k, v = dense(seed=10)
    with pytest.raises(ArgumentError, match=r"out must have shape \(1, 2, 20, 16\), got"):
        fattn.triton.attention(q, k, v, out=torch.empty(1, 2, 19, 16, device=DEVICE), **TILES)
    with pytest.raises(ArgumentError, match="out must have dtype torch.float32, got "
                                            "torch.float16"):
        fattn.triton.attention(q, k, v, out=torch.empty_like(q, dtype=torch.float16), **TILES)
    shared = torch.empty(1, 2, 1, 16, device=DEVICE).expand(1, 2, 20, 16)
    with pytest.raises(ArgumentError, match=r"out has overlapping elements \(stride\(2\) = 0"):
        fattn.triton.attention(q, k, v, out=shared, **TILES)
    qv, kv, vv = randn(20, 2, 16, seed=11), randn(33, 2, 16, seed=12), randn(33, 2, 16, seed=13)
    cu_q, cu_k = int32([0, 20]).to(DEVICE), int32([0, 33]).to(DEVICE)
    with pytest.raises(ArgumentError, match="out must not overlap v"):
        fattn.triton.attention_varlen(qv, kv, vv, cu_q, cu_k, out=vv[:20], **TILES)


def test_gradients_must_not_overlap_what_the_backward_reads():
    q, k, v = dense(seed=13)
    out, lse = fattn.triton.attention(q, k, v, return_lse=True, **TILES)
    dout = randn(*q.shape, seed=14)
    with pytest.raises(ArgumentError, match="dk must not overlap k"):
        fattn.triton.attention_backward(dout, q, k, v, out, lse, dk=k, **TILES)
    dk = torch.empty_like(k)
    with pytest.raises(ArgumentError, match="dv must not overlap dk"):
        fattn.triton.attention_backward(dout, q, k, v, out, lse, dk=dk, dv=dk, **TILES)
    with pytest.raises(ArgumentError, match="dq must not overlap dout"):
        fattn.triton.attention_backward(dout, q, k, v, out, lse, dq=dout, **TILES)


def test_an_append_through_one_tensor_for_both_caches_is_refused_before_writing():
    cache = randn(2, 32, 2, 16, seed=15)
    q, new = randn(2, 1, 4, 16, seed=16), randn(2, 1, 2, 16, seed=17)
    before = cache.clone()
    with pytest.raises(ArgumentError, match=r"k_cache must not overlap v_cache \(the kernels "
                                            r"read inputs while writing outputs\)"):
        fattn.triton.attention_with_kvcache(q, cache, cache, new, new.clone(),
                                            cache_seqlens=int32([3, 5]).to(DEVICE))
    with pytest.raises(ArgumentError, match="v_cache must not overlap v_new"):
        other = randn(2, 32, 2, 16, seed=18)
        fattn.triton.attention_with_kvcache(q, cache, other, new, other[:, :1],
                                            cache_seqlens=int32([3, 5]).to(DEVICE))
    assert torch.equal(cache, before)


@pytest.mark.parametrize("scale", [float("inf"), float("nan")])
def test_scale_must_be_finite(scale):
    q, k, v = dense(seed=19)
    with pytest.raises(ArgumentError, match=f"scale must be finite, got {scale}"):
        fattn.triton.attention(q, k, v, scale=scale, **TILES)


def test_heads_the_32_bit_offsets_cannot_reach_are_refused():
    """A (B, H, S, D) view whose last head lies 2^31 elements in, without the memory: the
    check runs before any kernel reads it."""
    from fattn.triton import problem
    q, k, v = dense(seed=20, h=3)
    p = problem.Problem(q, k, v, torch.empty_like(q), torch.empty(1, 3, 20, device=DEVICE),
                        batch=1, q_len=20, kv_len=33, scale=0.25)
    far = torch.empty(0, device="meta").as_strided((1, 3, 33, 16), (0, 2 ** 30, 16, 1))
    with pytest.raises(ArgumentError, match=r"attention_backward: k's heads lie 1073741824 "
                                            r"elements apart: the Triton kernels address its 3 "
                                            r"heads in 32 bits .* \(3 - 1\) × 1073741824 = "
                                            r"2147483648"):
        problem.check_head_offsets("attention_backward", p, [], [("k", far)])
    problem.check_head_offsets("attention", p, [("q", q)], [("k", k), ("dk", None)])  # within
