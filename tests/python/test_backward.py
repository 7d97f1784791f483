"""Gradients through fattn on the CPU: gradcheck in float64 (the C++ float64 reference
path), float32 gradients of the fused and naive backward against float64 and against
torch's SDPA, opcheck, torch.compile, determinism, and a small training run whose loss
curve must match torch's."""
import math

import pytest
import torch
import torch.nn.functional as F

import fattn
from conftest import hidden_pairs, qkv, randn

sdpa = fattn.scaled_dot_product_attention
op = torch.ops.fattn.attention


def reference_grads(q, k, v, dout, causal=None, scale=None, dlse=None):
    """Gradients of (out, lse) = attention(q, k, v) in float64 by torch's autograd on the
    plain formula (GQA by repeating kv heads; rows without keys give 0)."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    hq, hkv = q.size(1), k.size(1)
    kk = k.repeat_interleave(hq // hkv, dim=1)
    vv = v.repeat_interleave(hq // hkv, dim=1)
    sq, sk = q.size(2), k.size(2)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    s = torch.matmul(q, kk.transpose(-2, -1)) * scale
    if causal is not None:
        s = s.masked_fill(hidden_pairs(sq, sk, causal), float("-inf"))
    seen = torch.isfinite(s).any(-1, keepdim=True)
    s = torch.where(seen, s, torch.zeros_like(s))  # no NaN from a row without keys
    p = torch.softmax(s, dim=-1) * seen
    loss = (torch.matmul(p, vv) * dout.double()).sum()
    if dlse is not None:
        lse = torch.logsumexp(s, dim=-1)
        loss = loss + (torch.where(seen.squeeze(-1), lse, torch.zeros_like(lse)) *
                       dlse.double()).sum()
    return torch.autograd.grad(loss, (q, k, v))


def assert_grads_close(got, ref, tol, what=""):
    for name, g, r in zip(("dq", "dk", "dv"), got, ref):
        assert g.shape == r.shape, (name, g.shape, r.shape)
        bound = tol * max(1.0, r.abs().max().item())
        err = (g.double() - r).abs().max().item()
        assert err <= bound, f"{what} {name}: max error {err:.3g} > {bound:.3g}"


# --- gradcheck in float64: the float64 reference path of the operator --------------------
@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_sdpa(causal):
    q, k, v = (t.double().requires_grad_() for t in qkv(1, 2, 2, 6, 6, 16, seed=3))
    assert torch.autograd.gradcheck(lambda a, b, c: sdpa(a, b, c, is_causal=causal), (q, k, v))


def test_gradcheck_flash_gqa_bottom_right_with_lse():
    # GQA 4:2, Sq > Sk with a bottom-right mask (rows without keys), a custom scale, and
    # the gradient flowing through the logsumexp too.
    q = randn(1, 7, 4, 16, seed=4, dtype=torch.float64).requires_grad_()
    k = randn(1, 5, 2, 16, seed=5, dtype=torch.float64).requires_grad_()
    v = randn(1, 5, 2, 16, seed=6, dtype=torch.float64).requires_grad_()

    def f(a, b, c):
        out, lse = fattn.flash_attention(a, b, c, causal=True, softmax_scale=0.3,
                                         return_lse=True)
        return out, torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    assert torch.autograd.gradcheck(f, (q, k, v))


# --- float32 kernels against float64 and torch ---------------------------------------------
GRID = [
    # (B, Hq, Hkv, Sq, Sk, D, causal, layout)
    (2, 2, 2, 1, 1, 64, None, "bhsd"),
    (1, 3, 3, 7, 7, 64, "top_left", "bhsd"),
    (1, 2, 2, 63, 63, 32, None, "bshd"),
    (2, 2, 2, 65, 65, 64, "top_left", "strided"),
    (1, 2, 2, 113, 200, 80, None, "bhsd"),
    (1, 2, 2, 200, 113, 64, "top_left", "bhsd"),
    (1, 2, 2, 150, 90, 64, "bottom_right", "bshd"),
    (1, 8, 2, 100, 100, 64, "top_left", "bhsd"),
    (1, 8, 1, 70, 130, 128, None, "strided"),
    (1, 2, 2, 97, 97, 16, None, "bhsd"),
    (1, 2, 2, 97, 97, 256, "top_left", "bhsd"),
    (1, 1, 1, 1023, 1023, 64, "top_left", "bhsd"),
]


@pytest.mark.parametrize("case", GRID, ids=lambda c: "B{}_H{}x{}_Sq{}_Sk{}_D{}_{}_{}".format(*c))
@pytest.mark.parametrize("impl", ["fused", "naive"])
def test_gradients_against_float64_and_torch(case, impl):
    b, hq, hkv, sq, sk, d, causal, layout = case
    q, k, v = qkv(b, hq, hkv, sq, sk, d, seed=sq + sk + d, layout=layout)
    dout = randn(b, hq, sq, d, seed=7)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, _ = op(q, k, v, causal is not None, causal == "bottom_right", None, impl)
    got = torch.autograd.grad(out, (q, k, v), dout)
    ref = reference_grads(q, k, v, dout, causal)
    # the C++ suite's bound, relaxed for the few-thousand-term sums of float32 products
    assert_grads_close(got, ref, 5e-5, impl)
    if causal != "bottom_right":  # torch's is_causal is top-left
        t_in = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        t_out = F.scaled_dot_product_attention(*t_in, is_causal=causal is not None,
                                               enable_gqa=hq != hkv)
        expected = torch.autograd.grad(t_out, t_in, dout)
        for g, e in zip(got, expected):
            assert (g - e).abs().max().item() < 1e-3  # the accuracy bound of the forward tests


def test_lse_gradient_and_output_unused():
    q, k, v = (t.requires_grad_() for t in qkv(1, 4, 2, 50, 80, 32, seed=11))
    dlse = randn(1, 4, 50, seed=12)
    out, lse = op(q, k, v, True, True)
    got = torch.autograd.grad((lse * dlse).sum(), (q, k, v))  # out unused: no grad_out
    ref = reference_grads(q, k, v, torch.zeros(out.shape), "bottom_right", dlse=dlse)
    assert_grads_close(got, ref, 5e-5)


def test_sdpa_rank3_and_flash_bshd_grads():
    q3, k3, v3 = (randn(4, 33, 32, seed=s).requires_grad_() for s in (1, 2, 3))
    sdpa(q3, k3, v3, is_causal=True).pow(2).sum().backward()
    ref = reference_grads(q3[None], k3[None], v3[None], 2 * sdpa(q3, k3, v3, is_causal=True)
                          .detach()[None], "top_left")
    assert_grads_close((q3.grad[None], k3.grad[None], v3.grad[None]), ref, 5e-5)
    q, k, v = (randn(2, 40, 4, 64, seed=s).requires_grad_() for s in (4, 5, 6))
    fattn.flash_attention(q, k, v, causal=True).sum().backward()
    ref = reference_grads(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                          torch.ones(2, 4, 40, 64), "bottom_right")
    assert_grads_close((q.grad.transpose(1, 2), k.grad.transpose(1, 2), v.grad.transpose(1, 2)),
                       ref, 5e-5)


def test_backward_is_deterministic_and_thread_count_stable_per_count():
    q, k, v = (t.requires_grad_() for t in qkv(1, 4, 1, 300, 300, 64, seed=13))
    dout = randn(1, 4, 300, 64, seed=14)
    runs = [torch.autograd.grad(op(q, k, v, True)[0], (q, k, v), dout) for _ in range(3)]
    for again in runs[1:]:
        for a, b in zip(runs[0], again):
            assert torch.equal(a, b)


def test_gradients_layout_follows_inputs():
    q, k, v = (t.requires_grad_() for t in qkv(1, 4, 4, 20, 20, 32, layout="bshd"))
    dq, dk, dv = torch.autograd.grad(op(q, k, v)[0].sum(), (q, k, v))
    assert dq.stride() == q.detach().stride() and dk.stride() == k.detach().stride()


def test_backward_extra_bytes():
    q, k, v = qkv(2, 4, 4, 1024, 1024, 64)
    fused = fattn.backward_extra_bytes(q, k, v, impl="fused")
    naive = fattn.backward_extra_bytes(q, k, v, impl="naive")
    assert naive >= 2 * 2 * 4 * 1024 * 1024 * 4 > fused  # P and dS vs O(S)


# --- torch.library checks, compile ---------------------------------------------------------
def test_opcheck_with_autograd():
    q, k, v = (t.requires_grad_() for t in qkv(1, 4, 2, 17, 23, 32, seed=15))
    torch.library.opcheck(op, (q, k, v, True, True, None, "auto"))
    out, lse = op(q.detach(), k.detach(), v.detach())
    torch.library.opcheck(torch.ops.fattn.attention_backward,
                          (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse,
                           torch.randn_like(lse), False, False, None, "auto"))


def test_compile_forward_and_backward():
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 2, 33, 33, 32, seed=16))

    def loss(a, b, c):
        return sdpa(a, b, c, is_causal=True).square().sum()
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    expected = torch.autograd.grad(loss(q, k, v), (q, k, v))
    for g, e in zip(got, expected):
        assert torch.equal(g, e)


# --- training ------------------------------------------------------------------------------
class TwoLayerAttention(torch.nn.Module):
    """Two pre-norm causal self-attention blocks (GQA 4:2) and a linear head."""

    def __init__(self, attention, dim=64, heads=4, kv_heads=2):
        super().__init__()
        self.attention, self.heads, self.kv_heads = attention, heads, kv_heads
        self.head_dim = dim // heads
        qkv_dim = dim + 2 * kv_heads * self.head_dim
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(dim) for _ in range(2))
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(dim, qkv_dim) for _ in range(2))
        self.proj = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(2))
        self.head = torch.nn.Linear(dim, 1)

    def forward(self, x):
        b, s, dim = x.shape
        for norm, qkv_proj, proj in zip(self.norms, self.qkv, self.proj):
            q, k, v = qkv_proj(norm(x)).split(
                [dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1)
            q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
            k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
            v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
            a = self.attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + proj(a.transpose(1, 2).reshape(b, s, dim))
        return self.head(x).squeeze(-1)


def test_training_matches_torch_sdpa():
    def train(attention):
        torch.manual_seed(0)
        model = TwoLayerAttention(attention)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        x, y = randn(4, 48, 64, seed=20), randn(4, 48, seed=21)
        losses = []
        for _ in range(8):
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses
    ours, theirs = train(sdpa), train(F.scaled_dot_product_attention)
    assert ours[-1] < ours[0]  # it learns
    for a, b in zip(ours, theirs):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), (ours, theirs)
