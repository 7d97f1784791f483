"""Every error path: a clear message naming the argument, never a silent fallback."""
import pytest
import torch

import fattn
from conftest import qkv, randn, run_python

sdpa = fattn.scaled_dot_product_attention
op = torch.ops.fattn.attention


def t(*shape, **kw):
    return randn(*shape, **kw)


# --- unsupported by fattn (valid for torch): NotImplementedError -------------------------
def test_attn_mask_with_grad():
    q, k, v = qkv(1, 2, 2, 8, 8, 32)
    mask = torch.zeros(8, 8, requires_grad=True)
    with pytest.raises(NotImplementedError, match="attn_mask requires grad"):
        sdpa(q, k, v, attn_mask=mask)


def test_dropout_outside_its_range():
    q, k, v = qkv(1, 2, 2, 8, 8, 32)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\), got 1.0"):
        sdpa(q, k, v, dropout_p=1.0)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\), got -0.5"):
        fattn.flash_attention(q, k, v, dropout_p=-0.5)


def test_double_backward():
    q, k, v = (x.requires_grad_() for x in qkv(1, 2, 2, 8, 8, 32))
    dq, = torch.autograd.grad(sdpa(q, k, v).sum(), q, create_graph=True)
    with pytest.raises(NotImplementedError, match="attention_backward is not differentiable"):
        dq.sum().backward()


def test_backward_argument_errors():
    q, k, v = qkv(1, 2, 2, 8, 8, 32)
    out, lse = op(q, k, v)
    backward = torch.ops.fattn.attention_backward
    with pytest.raises(RuntimeError, match=r"fattn: dout.size\(2\) \(as q\) must equal "
                                           r"q.size\(2\) = 8, got 7"):
        backward(out[:, :, :7], q, k, v, out, lse)
    with pytest.raises(RuntimeError, match=r"fattn: dlse.size\(2\) \(as lse\) must equal"):
        backward(out, q, k, v, out, lse, lse[:, :, :3])
    with pytest.raises(RuntimeError, match="fattn: lse must have dtype float32, got float64"):
        backward(out, q, k, v, out, lse.double())
    with pytest.raises(RuntimeError, match="impl must be one of"):
        backward(out, q, k, v, out, lse, impl="fast")


def test_dtype_not_a_float_type():
    q, k, v = (x.int() for x in qkv(1, 2, 2, 8, 8, 32))
    with pytest.raises(NotImplementedError, match=r"query.dtype is torch.int32.*takes float32, "
                                                  r"bfloat16, float16, float64"):
        sdpa(q, k, v)


def test_unsupported_dtype_reaches_the_library_check():
    # the operator passes views on; the C++ library names what the CPU kernels take
    q, k, v = qkv(1, 2, 2, 8, 8, 32)
    with pytest.raises(RuntimeError, match=r"fattn: q.dtype must be float32, bfloat16 or "
                                           r"float16 .*got Int"):
        op(q.int(), k.int(), v.int())
    with pytest.raises(RuntimeError, match="impl naive takes float32; float64 runs only the "
                                           "reference"):
        op(q.double(), k.double(), v.double(), impl="naive")


def test_value_head_dim_differs():
    with pytest.raises(NotImplementedError, match=r"value's head dim \(48\) must equal query's"):
        sdpa(t(1, 2, 8, 32), t(1, 2, 8, 32), t(1, 2, 8, 48))


@pytest.mark.parametrize("d", [8, 15, 257, 512])
def test_head_dim_out_of_range(d):
    q, k, v = qkv(1, 2, 2, 8, 8, d)
    with pytest.raises(RuntimeError, match=rf"head dim\) must be in \[16, 256\], got {d}"):
        sdpa(q, k, v)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_without_cuda_kernels():
    q, k, v = (x.cuda() for x in qkv(1, 2, 2, 8, 8, 32))
    if fattn._C.with_cuda:
        pytest.skip("built with the CUDA backend")
    with pytest.raises(NotImplementedError, match="no CUDA kernels"):
        sdpa(q, k, v)


# --- invalid calls: ValueError / TypeError -----------------------------------------------
def test_not_a_tensor():
    q, k, v = qkv(1, 2, 2, 8, 8, 32)
    with pytest.raises(TypeError, match="value must be a torch.Tensor, got list"):
        sdpa(q, k, [1.0])


def test_mismatched_devices():
    q, k, v = qkv(1, 2, 2, 8, 8, 32)
    with pytest.raises(ValueError, match="key is on meta but query is on cpu"):
        sdpa(q, k.to("meta"), v)
    with pytest.raises(RuntimeError, match="fattn: k is on meta but q is on cpu"):
        op(q, k.to("meta"), v)  # the operator (dispatched to its fake kernel) says so too


def test_mismatched_dtypes():
    q, k, v = qkv(1, 2, 2, 8, 8, 32)
    with pytest.raises(ValueError, match="value.dtype is torch.float64 but query.dtype is "
                                         "torch.float32"):
        sdpa(q, k, v.double())
    with pytest.raises(RuntimeError, match="fattn: v.dtype is Double but q.dtype is Float"):
        op(q, k, v.double())


def test_wrong_ranks():
    with pytest.raises(ValueError, match="query must have at least 2 dimensions"):
        sdpa(t(8), t(8), t(8))
    with pytest.raises(ValueError, match="query has 4 dimensions but key has 3"):
        sdpa(t(1, 2, 8, 32), t(2, 8, 32), t(2, 8, 32))
    with pytest.raises(ValueError, match=r"q must have 4 dimensions \(B, S, H, D\)"):
        fattn.flash_attention(t(2, 8, 32), t(2, 8, 32), t(2, 8, 32))
    with pytest.raises(ValueError, match=r"K must be \[B, H, S, D\]"):
        fattn.attention_forward(t(1, 2, 8, 32), t(2, 8, 32), t(1, 2, 8, 32))
    with pytest.raises(RuntimeError, match=r"fattn: q must have 4 dimensions \(batch, heads, "
                                           r"seq, head_dim\), got 3"):
        op(t(2, 8, 32), t(1, 2, 8, 32), t(1, 2, 8, 32))


def test_mismatched_head_dims():
    with pytest.raises(ValueError, match="key's head dim must equal query's"):
        sdpa(t(1, 2, 8, 32), t(1, 2, 8, 64), t(1, 2, 8, 32))
    with pytest.raises(RuntimeError, match=r"fattn: k.size\(3\) \(head dim\) must equal "
                                           r"q.size\(3\) = 32, got 64"):
        op(t(1, 2, 8, 32), t(1, 2, 8, 64), t(1, 2, 8, 64))


def test_mismatched_batch():
    with pytest.raises(ValueError, match="batch dimensions must match"):
        sdpa(t(2, 2, 8, 32), t(3, 2, 8, 32), t(3, 2, 8, 32))
    with pytest.raises(RuntimeError, match=r"fattn: k.size\(0\) \(batch\) must equal q.size\(0\) "
                                           r"= 2, got 3"):
        op(t(2, 2, 8, 32), t(3, 2, 8, 32), t(3, 2, 8, 32))


def test_key_value_mismatch():
    with pytest.raises(ValueError, match="key and value must agree"):
        sdpa(t(1, 2, 8, 32), t(1, 2, 8, 32), t(1, 2, 9, 32))
    with pytest.raises(RuntimeError, match=r"fattn: v.size\(2\) \(kv sequence\) must equal "
                                           r"k.size\(2\) = 8, got 9"):
        op(t(1, 2, 8, 32), t(1, 2, 8, 32), t(1, 2, 9, 32))


def test_gqa_heads():
    q, k, v = t(1, 4, 8, 32), t(1, 2, 8, 32), t(1, 2, 8, 32)
    with pytest.raises(ValueError, match="query has 4 heads but key/value have 2.*enable_gqa=True"):
        sdpa(q, k, v)
    with pytest.raises(ValueError, match="query's 4 heads must be a multiple of key/value's 3"):
        sdpa(q, t(1, 3, 8, 32), t(1, 3, 8, 32), enable_gqa=True)
    with pytest.raises(RuntimeError, match=r"fattn: q.size\(1\) \(query heads\) must be a "
                                           r"multiple of k.size\(1\) \(kv heads\) = 3, got 4"):
        op(q, t(1, 3, 8, 32), t(1, 3, 8, 32))
    with pytest.raises(ValueError, match="must be a multiple"):
        fattn.flash_attention(t(1, 8, 4, 32), t(1, 8, 3, 32), t(1, 8, 3, 32))


def test_flash_attention_arguments():
    q, k, v = t(1, 8, 2, 32), t(1, 8, 2, 32), t(1, 8, 2, 32)
    with pytest.raises(ValueError, match="layout must be 'bshd'.*or 'bhsd'.*got 'sbhd'"):
        fattn.flash_attention(q, k, v, layout="sbhd")
    with pytest.raises(TypeError):  # options are keyword-only (flash_attn_func: dropout_p)
        fattn.flash_attention(q, k, v, 0.0)


def test_attention_forward_shapes():
    with pytest.raises(ValueError, match=r"Q, K and V must have one shape"):
        fattn.attention_forward(t(1, 2, 8, 32), t(1, 2, 9, 32), t(1, 2, 9, 32))


def test_operator_arguments():
    q, k, v = qkv(1, 2, 2, 8, 8, 32)
    with pytest.raises(RuntimeError, match="fattn: impl must be one of auto, reference, naive, "
                                           "fused, decode; got 'fast'"):
        op(q, k, v, False, False, None, "fast")
    with pytest.raises(RuntimeError, match="causal_bottom_right=True needs is_causal=True"):
        op(q, k, v, False, True)
    with pytest.raises(RuntimeError, match="fattn: scale must be finite, got inf"):
        op(q, k, v, False, False, float("inf"))
    with pytest.raises(RuntimeError, match="fattn: scale must be finite"):
        sdpa(q, k, v, scale=float("nan"))


def test_fake_kernel_checks_like_the_real_one():
    # meta tensors run the fake kernel (what torch.compile traces with)
    q, k, v = (x.to("meta") for x in qkv(1, 4, 2, 8, 8, 32))
    out, lse = op(q, k, v)
    assert out.shape == (1, 4, 8, 32) and lse.shape == (1, 4, 8) and lse.dtype == torch.float32
    with pytest.raises(RuntimeError, match=r"fattn: q.size\(1\) \(query heads\) must be a "
                                           "multiple"):
        op(q, k[:, :1].expand(1, 3, 8, 32), v[:, :1].expand(1, 3, 8, 32))
    with pytest.raises(RuntimeError, match="fattn: q, k and v must have one head dim"):
        op(q, k[..., :16], v)
    with pytest.raises(RuntimeError, match="causal_bottom_right=True needs is_causal=True"):
        op(q, k, v, False, True)


def test_messages_are_torch_errors_not_crashes():
    # a bad call leaves the operator usable
    q, k, v = qkv(1, 2, 2, 8, 8, 32)
    with pytest.raises(RuntimeError):
        op(q, k[..., :16], v)
    out, _ = op(q, k, v)
    assert torch.isfinite(out).all()


def test_cpu_isa_cap_from_the_environment():
    # FATTN_CPU_ISA=portable runs every CPU kernel on the portable unit, wherever this runs;
    # asking for a wider one is then an error that names the ISA.
    out = run_python(r"""
        import pytest, torch, fattn
        assert fattn.best_cpu_isa() == "portable", fattn.best_cpu_isa()
        assert not fattn._C.cpu_supports("avx2")
        with pytest.raises(RuntimeError, match="isa avx2 is not supported by this CPU "
                           r"\(best: portable; FATTN_CPU_ISA=portable caps it\)"):
            fattn._C.set_cpu_isa("avx2")
        q = torch.randn(1, 2, 9, 32)
        out = fattn.scaled_dot_product_attention(q, q, q)
        ref = torch.nn.functional.scaled_dot_product_attention(q, q, q)
        print((out - ref).abs().max().item())
        """, env={"FATTN_CPU_ISA": "portable"})
    assert float(out) < 1e-5


def test_cpu_isa_cap_unknown_name():
    out = run_python("""
        import pytest, torch, fattn
        with pytest.raises(RuntimeError) as e:
            fattn.best_cpu_isa()
        print(e.value)
        """, env={"FATTN_CPU_ISA": "avx1024"})
    assert "FATTN_CPU_ISA must be one of amx, avx512, avx2, portable" in out and "'avx1024'" in out


BF16_PATH_ERRORS = r"""
    import torch, fattn
    try:
        chosen = fattn.bf16_products()
    except RuntimeError as e:
        print("error|" + str(e).splitlines()[0])
        raise SystemExit(0)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 70, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double())
    out = fattn.scaled_dot_product_attention(q, k, v)
    eager = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    print(*chosen, sep="|")
    print((out.double() - ref).abs().max().item(), (eager.double() - ref).abs().max().item())
    """


@pytest.mark.parametrize("products", ["fma", "bf16_dot"])
def test_bf16_products_forced_from_the_environment(products):
    """FATTN_CPU_BF16 forces the bfloat16 path of the process (each within the 16-bit rule:
    2x torch's bfloat16 error plus an ulp); bf16_dot where this CPU has no AVX512-BF16 is
    an error naming it."""
    if not fattn._C.cpu_supports("avx512"):
        pytest.skip("the choice is between avx512 paths")
    out = run_python(BF16_PATH_ERRORS, env={"FATTN_CPU_BF16": products})
    if out.startswith("error|"):
        assert products == "bf16_dot" and "has no AVX512-BF16" in out, out
        return
    chosen, rest = out.strip().splitlines()[-2:]
    assert chosen == f"{products}|FATTN_CPU_BF16={products}"
    err, err_torch = map(float, rest.split())
    assert err <= 2 * err_torch + 2 ** -8, (err, err_torch)


def test_bf16_products_chosen_by_rate():
    out = run_python(BF16_PATH_ERRORS)
    chosen, rest = out.strip().splitlines()[-2:]
    products, reason = chosen.split("|")
    assert products in ("bf16_dot", "fma")
    assert reason.startswith("timed on one core: vdpbf16ps") or \
        reason.endswith("bfloat16 widened to float32 FMAs"), reason
    err, err_torch = map(float, rest.split())
    assert err <= 2 * err_torch + 2 ** -8, (err, err_torch)
