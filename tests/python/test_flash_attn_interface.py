"""FlashAttention 2's function names on fattn (fattn.flash_attn_interface): each the same
call as fattn's own entry point, the packed forms' gradients flowing into the packed
tensor, and S_dmask (return_attn_probs with dropout): its signs exactly the call's dropout
mask, its magnitudes FlashAttention's scaling of the probabilities (exp(s − m), m the
row's largest score from the key's block to the last), its layout FlashAttention's.
scripts/fa-tests.sh runs FlashAttention's own test file against these functions."""
import math

import pytest
import torch

import fattn
from fattn._attn_probs import key_block
from fattn.flash_attn_interface import (flash_attn_func, flash_attn_kvpacked_func,
                                        flash_attn_qkvpacked_func, flash_attn_varlen_func,
                                        flash_attn_varlen_kvpacked_func,
                                        flash_attn_varlen_qkvpacked_func)
from fattn.functional import dropout_stream


def seed_of_call(seed, p):
    """The seed the next call draws after torch.manual_seed(seed) (then reseeded)."""
    torch.manual_seed(seed)
    _, drawn, _ = dropout_stream("test", p, torch.device("cpu"))
    torch.manual_seed(seed)
    return int(drawn)


def scaled_probs(q, k, causal, alibi=None):
    """FlashAttention's S_dmask magnitudes for (B, S, H, D) q, k, in float64, by its own
    definition: exp(s − m), m the row's largest visible score over the key blocks from the
    key's own to the last."""
    q, k = q.double().transpose(1, 2), k.double().transpose(1, 2)
    k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
    sq, sk = q.size(2), k.size(2)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    distance = torch.arange(sq).view(-1, 1) + sk - sq - torch.arange(sk).view(1, -1)
    if alibi is not None:
        s = s - alibi.double().view(*alibi.shape, 1, 1) * distance.abs()
    if causal:
        s = s.masked_fill(distance < 0, float("-inf"))
    width = key_block(q.size(-1))
    m = torch.full_like(s, float("-inf"))
    for j0 in range(0, sk, width):
        m[..., j0:j0 + width] = s[..., j0:].amax(-1, keepdim=True)
    return torch.exp(s - m).nan_to_num(0.0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 97, 130, 6, 2, 64), (1, 200, 75, 4, 4, 128),
                                   (1, 33, 300, 2, 1, 40)])
def test_dense_s_dmask(shape, causal):
    b, sq, sk, hq, hkv, d = shape
    g = torch.Generator().manual_seed(sq + sk)
    q = torch.randn(b, sq, hq, d, generator=g)
    k, v = (torch.randn(b, sk, hkv, d, generator=g) for _ in range(2))
    alibi = torch.rand(b, hq, generator=g) * 0.3
    p = 0.17
    seed = seed_of_call(5, p)
    out, lse, s_dmask = flash_attn_func(q, k, v, p, causal=causal, alibi_slopes=alibi,
                                        return_attn_probs=True)
    rounded = lambda n: -(-n // 128) * 128  # noqa: E731
    assert s_dmask.shape == (b, hq, rounded(sq), rounded(sk)) and s_dmask.dtype == q.dtype
    assert lse.shape == (b, hq, sq)
    inside = s_dmask[:, :, :sq, :sk]
    assert not s_dmask[:, :, sq:].any() and not s_dmask[:, :, :, sk:].any()
    keep = fattn.dropout_mask(b, hq, sq, sk, p, seed)
    want = scaled_probs(q, k, causal, alibi)
    visible = want > 0
    assert torch.equal((inside < 0) & visible, ~keep & visible)
    assert torch.allclose(inside.abs().double(), want, atol=1e-6, rtol=1e-5)
    # the output is the kernel's with that mask: the same call again, same seed, same bits
    torch.manual_seed(5)
    assert torch.equal(flash_attn_func(q, k, v, p, causal=causal, alibi_slopes=alibi), out)


def test_varlen_s_dmask_layout_and_signs():
    g = torch.Generator().manual_seed(8)
    lens_q, lens_k = [5, 0, 77, 130], [9, 4, 60, 130]
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
    hq, hkv, d = 4, 2, 64
    q = torch.randn(sum(lens_q), hq, d, generator=g)
    kv = torch.randn(sum(lens_k), 2, hkv, d, generator=g)
    p = 0.3
    seed = seed_of_call(9, p)
    out, lse, s_dmask = flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 130, 130, p,
                                                        causal=True, return_attn_probs=True)
    assert s_dmask.shape == (4, hq, 256, 256) and lse.shape == (hq, sum(lens_q))
    keep = fattn.dropout_mask(4, hq, 130, 130, p, seed)
    for n, (sq, sk) in enumerate(zip(lens_q, lens_k)):
        qs = q[cu_q[n]:cu_q[n + 1]].unsqueeze(0)
        ks = kv[cu_k[n]:cu_k[n + 1], 0].unsqueeze(0)
        want = scaled_probs(qs, ks, True)[0]
        got = s_dmask[n, :, :sq, :sk]
        visible = want > 0
        assert torch.equal((got < 0) & visible, ~keep[n, :, :sq, :sk] & visible)
        assert torch.allclose(got.abs().double(), want, atol=1e-6, rtol=1e-5)
        assert not s_dmask[n, :, sq:].any() and not s_dmask[n, :, :, sk:].any()
    torch.manual_seed(9)
    k, v = kv.unbind(1)
    assert torch.equal(fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 130, 130, p,
                                                    causal=True), out)


def test_no_s_dmask_without_dropout():
    q = torch.randn(1, 20, 2, 32)
    out, lse, s_dmask = flash_attn_func(q, q, q, return_attn_probs=True)
    assert s_dmask is None and torch.equal(out, flash_attn_func(q, q, q))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_forms_are_the_unpacked_calls(dtype):
    g = torch.Generator().manual_seed(3)
    b, s, h, d = 2, 45, 4, 64
    qkv = torch.randn(b, s, 3, h, d, generator=g).to(dtype).requires_grad_()
    dout = torch.randn(b, s, h, d, generator=g).to(dtype)
    q, k, v = (t.detach().clone().requires_grad_() for t in qkv.unbind(2))
    packed = flash_attn_qkvpacked_func(qkv, causal=True, window_size=(20, 0))
    plain = fattn.flash_attention(q, k, v, causal=True, window_size=(20, 0))
    assert torch.equal(packed, plain)
    (dqkv,) = torch.autograd.grad(packed, qkv, dout)
    grads = torch.autograd.grad(plain, (q, k, v), dout)
    assert torch.equal(dqkv, torch.stack(grads, dim=2))
    kv = qkv.detach()[:, :, 1:]
    assert torch.equal(flash_attn_kvpacked_func(q.detach(), kv, causal=True, softcap=5.0),
                       fattn.flash_attention(q.detach(), k.detach(), v.detach(), causal=True,
                                             softcap=5.0))
    cu = torch.tensor([0, s, 2 * s], dtype=torch.int32)
    flat = qkv.detach().reshape(b * s, 3, h, d)
    assert torch.equal(flash_attn_varlen_qkvpacked_func(flat, cu, s, causal=True,
                                                        window_size=(20, 0)),
                       plain.detach().reshape(b * s, h, d))


def test_packed_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"flash_attn_qkvpacked_func: qkv must be \(B, S, 3, H, D\)"):
        flash_attn_qkvpacked_func(torch.randn(1, 10, 2, 2, 32))
    with pytest.raises(TypeError, match="kv must be a torch.Tensor"):
        flash_attn_kvpacked_func(torch.randn(1, 10, 2, 32), [1, 2])
    with pytest.raises(ValueError, match="flash_attn_func: dropout_p must be in"):
        flash_attn_func(*(torch.randn(1, 10, 2, 32) for _ in range(3)), dropout_p=1.0)


def test_key_blocks_are_flash_attentions():
    """FlashAttention 2.8.3's _get_block_size_n with dropout on sm80 and sm90, which its
    tests undo S_dmask's scaling with."""
    dims = (32, 40, 64, 80, 96, 111, 128, 160, 192, 224, 256)
    assert [key_block(d) for d in dims] == [128, 64, 64, 64, 64, 32, 32, 64, 64, 64, 64]
