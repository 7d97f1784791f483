"""What runs fattn's operators on CUDA tensors (fattn/cuda_dispatch.py): the dispatch table,
and the operators' CUDA kernels — the glue between torch.ops.fattn and the Triton kernels.

Without a GPU the glue runs on CPU tensors: a fixture registers the CUDA kernels for the
CPU dispatch key for the duration of a test (torch restores the C++ CPU kernels after), so
fattn's public functions and a transformers model run through exactly the code CUDA
tensors run, the Triton kernels under the interpreter. With a GPU the same tests run on
CUDA tensors as they are."""
import os
import warnings

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")

import fattn  # noqa: E402
from fattn import cuda_dispatch, dispatch  # noqa: E402
from fattn.triton import reference  # noqa: E402
from test_triton import TOL, assert_matches  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"


@pytest.fixture
def gpu_path():
    """The CUDA kernels of torch.ops.fattn, on this test's device."""
    if ON_GPU:
        yield
        return
    lib = torch.library.Library("fattn", "IMPL")
    with warnings.catch_warnings():  # "Overriding a previously registered kernel": meant
        warnings.simplefilter("ignore", UserWarning)
        lib.impl("attention", lambda *args: cuda_dispatch.attention(*args), "CPU")
        lib.impl("attention_kvcache", cuda_dispatch.attention_kvcache, "CPU")
        lib.impl("attention_varlen", cuda_dispatch.attention_varlen, "CPU")
        lib.impl("attention_backward", cuda_dispatch.attention_backward, "CPU")
        lib.impl("attention_varlen_backward", cuda_dispatch.attention_varlen_backward, "CPU")
        lib.impl("attention_varlen_kvcache", cuda_dispatch.attention_varlen_kvcache, "CPU")
    try:
        yield
    finally:
        lib._destroy()


@pytest.fixture(autouse=True)
def fresh_plans():
    """Plans are cached per call; a test that changes what the engines answer plans anew."""
    cuda_dispatch.forget_plans()
    yield
    cuda_dispatch.forget_plans()


@pytest.fixture
def no_machine_code(monkeypatch):
    """Nothing verified, nothing compiled: the table's order alone decides."""
    monkeypatch.setattr(dispatch, "current_machine_code", lambda kernel, arch: None)


def simulate_cpp_build(monkeypatch, built: bool):
    """A build with the CUDA backend (every C++ candidate takes the call: the C++ rules are
    the C++ library's, tested there) or without it."""
    monkeypatch.setattr(dispatch.engines, "cpp_refusal",
                        lambda kernel, call: "" if built else dispatch.engines.NO_CUDA_BACKEND)


def test_the_table(no_machine_code):
    assert cuda_dispatch.plan("attention").engine == "triton"
    assert cuda_dispatch.plan("attention_kvcache", "auto", True).kernel in ("decode",
                                                                           "triton_kvcache")
    assert cuda_dispatch.plan("attention", "triton", True).kernel == "triton_forward"
    assert cuda_dispatch.plan("attention_varlen").kernel == "triton_varlen"
    with pytest.raises(NotImplementedError, match="runs the forward without attn_mask only"):
        cuda_dispatch.plan("attention", "fused", attn_mask=True)
    with pytest.raises(NotImplementedError, match="no KV cache or packed sequences"):
        cuda_dispatch.plan("attention_varlen", "reference")
    with pytest.raises(NotImplementedError, match="is not a CUDA implementation"):
        cuda_dispatch.plan("attention", "tiled")
    with pytest.raises(ValueError, match="entry must be one of"):
        cuda_dispatch.plan("attention_paged")
    if not cuda_dispatch.cpp_available():
        with pytest.raises(NotImplementedError, match="has no CUDA backend"):
            cuda_dispatch.plan("attention", "fused")


@pytest.mark.parametrize("built", [True, False], ids=["cpp_cuda_built", "triton_only"])
def test_the_table_on_hopper(built, monkeypatch, no_machine_code):
    """plan(capability=(9, 0)): where no kernel is verified, the table's first candidate that
    takes the call: the forward at D = 128 in 16 bits, plain or with a window, softcap,
    ALiBi or sinks, on the C++ TMA kernel where the backend is built; an attn_mask, D = 64,
    float32 and other GPUs on Triton."""
    simulate_cpp_build(monkeypatch, built)
    hopper = dict(capability=(9, 0), head_dim=128, dtype=torch.bfloat16)
    tma = "fused_tma" if built else "triton_forward"
    assert cuda_dispatch.plan("attention", **hopper).kernel == tma
    assert cuda_dispatch.plan("attention", **dict(hopper, dtype=torch.float16)).kernel == tma
    for other in (dict(head_dim=64), dict(dtype=torch.float32), dict(capability=(8, 0)),
                  dict(capability=(10, 0)), dict(capability=None)):
        assert cuda_dispatch.plan("attention", **dict(hopper, **other)).engine == "triton", other
    # the variants' instantiation no GPU ever ran: Triton, which a GPU has run, until verified
    assert cuda_dispatch.plan("attention", variants=True, **hopper).kernel == "triton_forward"
    assert cuda_dispatch.plan("attention", softcap=True, alibi=True,
                              **hopper).kernel == "triton_forward"
    assert cuda_dispatch.plan("attention", attn_mask=True, **hopper).kernel == "triton_forward"
    assert cuda_dispatch.plan("attention", variants=True, attn_mask=True,
                              **hopper).kernel == "triton_forward"
    assert cuda_dispatch.plan("attention", "triton", **hopper).kernel == "triton_forward"
    chosen = cuda_dispatch.plan("attention", **hopper)
    assert not chosen.verified and chosen.evidence is None
    assert "no GPU run verified it" in chosen.why and "H200 2026-11-28" in chosen.why
    cuda_dispatch.forget_plans()
    verify(monkeypatch, "fused_tma_variants")
    assert cuda_dispatch.plan("attention", softcap=True, alibi=True, **hopper).kernel == (
        "fused_tma_variants" if built else "triton_forward")


def verify(monkeypatch, *kernels):
    """These kernels verified on every architecture (their machine code "sha256:x")."""
    monkeypatch.setattr(dispatch, "current_machine_code", lambda kernel, arch: "sha256:x")
    monkeypatch.setattr(dispatch.records, "all_records", lambda: [
        dispatch.records.Record(k, f"sm_{major}{minor}", "sha256:x", "a test", "evidence")
        for k in kernels for major, minor in ((8, 0), (9, 0), (12, 0))])


@pytest.mark.parametrize("built", [True, False], ids=["cpp_cuda_built", "triton_only"])
def test_the_kvcache_table(built, monkeypatch, no_machine_code):
    """A 16-bit KV-cache call runs the C++ decode kernel where the backend takes it and a GPU
    run verified it (any capability); unverified, the Triton kernel, which a GPU has run
    (no GPU has run the decode kernel); float32 and impl="triton" run Triton."""
    simulate_cpp_build(monkeypatch, built)
    assert cuda_dispatch.plan("attention_kvcache", head_dim=128, dtype=torch.bfloat16,
                              capability=(9, 0)).kernel == "triton_kvcache"
    cuda_dispatch.forget_plans()
    verify(monkeypatch, "decode")
    decode = "decode" if built else "triton_kvcache"
    for capability in ((8, 0), (9, 0), (12, 0)):
        for dtype in (torch.float16, torch.bfloat16):
            chosen = cuda_dispatch.plan("attention_kvcache", "auto", True, head_dim=128,
                                        dtype=dtype, capability=capability)
            assert chosen.kernel == decode, (capability, dtype)
    assert cuda_dispatch.plan("attention_kvcache", head_dim=128,
                              dtype=torch.float32).kernel == "triton_kvcache"
    assert cuda_dispatch.plan("attention_kvcache", "triton", True, head_dim=128,
                              dtype=torch.bfloat16).kernel == "triton_kvcache"


@pytest.mark.parametrize("built", [True, False], ids=["cpp_cuda_built", "triton_only"])
def test_the_backward_table(built, monkeypatch, no_machine_code):
    """A 16-bit backward on compute capability 9.0 runs the C++ Hopper backward where it takes
    the call and a GPU run verified it; unverified, the Triton backward, which a GPU has run
    (no GPU has run the Hopper backward); an attn_mask, float32, other GPUs and
    impl="triton" run Triton."""
    simulate_cpp_build(monkeypatch, built)
    hopper = dict(capability=(9, 0), head_dim=128, dtype=torch.bfloat16)
    chosen = cuda_dispatch.plan("attention_backward", **hopper)
    assert (chosen.kernel, chosen.verified) == ("triton_backward", False)
    cuda_dispatch.forget_plans()
    verify(monkeypatch, "backward_tma")
    cpp = "backward_tma" if built else "triton_backward"
    for d in (16, 64, 80, 96, 128):
        for dtype in (torch.float16, torch.bfloat16):
            call = dict(hopper, head_dim=d, dtype=dtype)
            assert cuda_dispatch.plan("attention_backward", **call).kernel == cpp, call
    for other in (dict(dtype=torch.float32), dict(capability=(8, 0)), dict(capability=(10, 0)),
                  dict(capability=None)):
        assert cuda_dispatch.plan("attention_backward",
                                  **dict(hopper, **other)).kernel == "triton_backward"
    assert cuda_dispatch.plan("attention_backward", attn_mask=True,
                              **hopper).kernel == "triton_backward"
    assert cuda_dispatch.plan("attention_backward", "triton",
                              **hopper).kernel == "triton_backward"
    assert cuda_dispatch.plan("attention_varlen_backward", **hopper).kernel == "triton_backward"


def test_the_kernels_registered_for_cuda():
    """attention_kvcache's CUDA kernel is the C++ operator's in a build with the CUDA
    backend, Python's (the Triton kernels) otherwise; triton_attention_kvcache is always
    Python's."""
    from fattn import _C
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    assert has("fattn::triton_attention_kvcache", "CUDA")
    assert has("fattn::attention_kvcache", "CUDA")
    assert bool(_C.with_cuda) == bool(cuda_dispatch.decode_head_dims())


def test_kvcache_on_cuda_without_triton_where_the_cpp_decode_kernel_runs(monkeypatch):
    """flash_attn_with_kvcache takes CUDA tensors where triton is installed, or where the
    extension has the C++ decode kernel (its 16-bit KV caches need no triton)."""
    import importlib
    from fattn import kvcache
    monkeypatch.setattr(cuda_dispatch, "triton_available", lambda: False)
    try:
        for dims, takes_cuda in (((64, 128, 256), True), ((), False)):
            monkeypatch.setattr(cuda_dispatch, "decode_head_dims", lambda dims=dims: dims)
            assert ("cuda" in importlib.reload(kvcache)._DEVICE_TYPES) == takes_cuda, dims
    finally:
        monkeypatch.undo()
        importlib.reload(kvcache)
    assert "cuda" in kvcache._DEVICE_TYPES  # triton is installed here


def test_without_triton_only_the_cpp_kernels_have_calls(monkeypatch, no_machine_code):
    monkeypatch.setattr(dispatch.engines, "triton_refusal",
                        lambda call: "triton is not installed (pip install triton)")
    simulate_cpp_build(monkeypatch, False)
    with pytest.raises(NotImplementedError, match="triton is not installed"):
        cuda_dispatch.plan("attention", "auto", variants=True)
    with pytest.raises(NotImplementedError, match="triton_forward: triton is not installed"):
        cuda_dispatch.plan("attention", "auto", attn_mask=True)
    with pytest.raises(NotImplementedError, match="no GPU kernel takes this kvcache call"):
        cuda_dispatch.plan("attention_kvcache", "auto", True)
    cuda_dispatch.forget_plans()
    simulate_cpp_build(monkeypatch, True)
    assert cuda_dispatch.plan("attention").kernel == "fused_mma"
    assert cuda_dispatch.plan("attention_kvcache", dtype=torch.bfloat16).kernel == "decode"


def inputs(*shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).to(DEVICE)


def test_sdpa_with_a_mask_and_its_output_layout(gpu_path):
    q = inputs(2, 37, 4, 32, seed=1).transpose(1, 2)  # (B, H, S, D) views of BSHD memory
    k = inputs(2, 45, 2, 32, seed=2).transpose(1, 2)
    v = inputs(2, 45, 2, 32, seed=3).transpose(1, 2)
    mask = torch.rand(2, 1, 37, 45, generator=torch.Generator().manual_seed(4)) > 0.4
    out = fattn.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(DEVICE),
                                             enable_gqa=True)
    ref, _ = reference.attention(q.cpu(), k.cpu(), v.cpu(), attn_mask=mask)
    assert out.stride() == q.stride()  # the operator's layout rule: BSHD in, BSHD out
    assert (out.cpu().double() - ref).abs().max().item() < 2e-5


def test_flash_attention_variants(gpu_path):
    q, k, v = (inputs(1, 29, h, 64, seed=s) for s, h in ((1, 4), (2, 1), (3, 1)))
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(5))
    out, lse = fattn.flash_attention(q, k, v, causal=True, window_size=(8, 0), softcap=4.0,
                                     sinks=sinks.to(DEVICE), return_lse=True)
    ref, ref_lse = reference.attention(q.cpu().transpose(1, 2), k.cpu().transpose(1, 2),
                                       v.cpu().transpose(1, 2), causal="bottom_right",
                                       window_size=(8, 0), softcap=4.0, sinks=sinks)
    assert_matches(out.transpose(1, 2), lse, ref, ref_lse)


def in_dtype(q, k, v, causal, window_size, softcap, alibi_slopes, sinks):
    """torch's own attention in q's dtype (products and softmax as torch's eager math path
    rounds them), the variants as the definition: the error the accuracy rule compares to."""
    hq, sq, sk, d = q.size(1), q.size(2), k.size(2), q.size(3)
    k = k.repeat_interleave(hq // k.size(1), dim=1)
    v = v.repeat_interleave(hq // v.size(1), dim=1)
    s = torch.matmul(q, k.transpose(-2, -1)) * (d ** -0.5)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq, device=q.device).view(-1, 1)
    j = torch.arange(sk, device=q.device).view(1, -1)
    if alibi_slopes is not None:
        s = s - (alibi_slopes.view(1, hq, 1, 1) * (i + sk - sq - j).abs()).to(s.dtype)
    align = sk - sq
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        visible &= j <= i + align
    if window_size[0] >= 0:
        visible &= j >= i + align - window_size[0]
    if window_size[1] >= 0:
        visible &= j <= i + align + window_size[1]
    s = s.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        sink = sinks.view(1, hq, 1, 1).expand(*s.shape[:3], 1).to(s.dtype)
        p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
    else:
        p = torch.softmax(s, dim=-1)
    return torch.matmul(p.nan_to_num(0.0), v)


HOPPER_VARIANTS = {  # name: (causal, window_size, softcap, alibi, sinks)
    "window_causal": (True, (33, 0), 0.0, False, False),
    "window_both": (False, (20, 7), 0.0, False, False),
    "softcap": (False, (-1, -1), 5.0, False, False),
    "alibi_causal": (True, (-1, -1), 0.0, True, False),
    "sinks": (False, (-1, -1), 0.0, False, True),
    "all": (True, (40, 0), 30.0, True, True),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("name", list(HOPPER_VARIANTS))
def test_16bit_head_dim_128_forward_with_variants(gpu_path, dtype, name):
    """A 16-bit D = 128 forward with each variant: on an H100/H200 built with the C++ backend
    it runs the TMA kernel's variant instantiation (the plan says so), elsewhere Triton;
    within twice torch's own error in the dtype, against float64."""
    causal, window, softcap, alibi, sinks = HOPPER_VARIANTS[name]
    sq, sk = (300, 517) if ON_GPU else (67, 131)
    q = inputs(1, sq, 4, 128, seed=11, dtype=dtype)
    k, v = inputs(1, sk, 2, 128, seed=12, dtype=dtype), inputs(1, sk, 2, 128, seed=13, dtype=dtype)
    slopes = torch.exp2(-8.0 * torch.arange(1, 5) / 4).to(DEVICE) if alibi else None
    sink = torch.randn(4, generator=torch.Generator().manual_seed(14)).to(DEVICE) if sinks \
        else None
    if ON_GPU:
        chosen = cuda_dispatch.plan("attention", variants=True, head_dim=128, dtype=dtype,
                                    capability=torch.cuda.get_device_capability())
        print(f"{name}: {chosen.kernel} ({chosen.why})")
    out = fattn.flash_attention(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                alibi_slopes=slopes, sinks=sink)
    bhsd = [t.transpose(1, 2) for t in (q, k, v)]
    ref, _ = reference.attention(*[t.cpu() for t in bhsd], causal="bottom_right" if causal
                                 else None, window_size=window, softcap=softcap,
                                 alibi_slopes=None if slopes is None else slopes.cpu(),
                                 sinks=None if sink is None else sink.cpu())
    torch_out = in_dtype(*bhsd, causal, window, softcap, slopes, sink)
    err = (out.transpose(1, 2).cpu().double() - ref).abs().max().item()
    torch_err = (torch_out.cpu().double() - ref).abs().max().item()
    assert err <= 2 * torch_err, (err, torch_err)


def test_flash_attn_with_kvcache_paged_append(gpu_path):
    pages, page = 6, 16
    k_cache, v_cache = inputs(pages, page, 2, 32, seed=1), inputs(pages, page, 2, 32, seed=2)
    table = torch.tensor([[4, 1], [0, 5]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([5, 20], dtype=torch.int32, device=DEVICE)
    q, k_new, v_new = inputs(2, 1, 8, 32, seed=3), inputs(2, 1, 2, 32, seed=4), \
        inputs(2, 1, 2, 32, seed=5)
    with torch.no_grad():
        out, lse = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new,
                                                 cache_seqlens=lens, block_table=table,
                                                 causal=True, return_softmax_lse=True)
    assert out.shape == (2, 1, 8, 32)
    ref, ref_lse = reference.attention_with_kvcache(q.cpu(), k_cache.cpu(), v_cache.cpu(),
                                                    [6, 21], table.cpu(), causal=True)
    assert_matches(out, lse, ref, ref_lse)
    assert torch.equal(k_cache[4, 5].cpu(), k_new[0, 0].cpu())  # appended in place
    assert torch.equal(v_cache[5, 4].cpu(), v_new[1, 0].cpu())


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16],
                         ids=["float32_triton", "bfloat16_cpp_decode"])
def test_decode_step_in_a_cuda_graph_replayed_with_new_lengths(dtype):
    """A paged decode step with an append, captured once and replayed after the lengths
    and the new token change in place: what serving engines do every step. It captures
    only if nothing in the call synchronises with the host. float32 runs the Triton
    kernels, bfloat16 the C++ decode kernel (in a build with the CUDA backend)."""
    pages, page = 8, 16
    k_cache, v_cache = (inputs(pages, page, 2, 32, seed=s, dtype=dtype) for s in (1, 2))
    table = torch.tensor([[4, 1, 6], [0, 5, 2]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([5, 20], dtype=torch.int32, device=DEVICE)
    q, k_new, v_new = inputs(2, 1, 8, 32, seed=3, dtype=dtype), \
        inputs(2, 1, 2, 32, seed=4, dtype=dtype), inputs(2, 1, 2, 32, seed=5, dtype=dtype)
    tol = TOL if dtype == torch.float32 else 2e-2

    def step():
        return fattn.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new,
                                             cache_seqlens=lens, block_table=table, causal=True,
                                             return_softmax_lse=True)
    with torch.no_grad():
        step()  # compiles outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, lse = step()
        for lens_now, seed in (([9, 30], 6), ([31, 2], 7)):
            lens.copy_(torch.tensor(lens_now, dtype=torch.int32))
            q.copy_(inputs(2, 1, 8, 32, seed=seed, dtype=dtype))
            k_new.copy_(inputs(2, 1, 2, 32, seed=seed + 1, dtype=dtype))
            graph.replay()
            torch.cuda.synchronize()
            ref, ref_lse = reference.attention_with_kvcache(
                q.cpu().float(), k_cache.cpu().float(), v_cache.cpu().float(),
                [n + 1 for n in lens_now], table.cpu(), causal=True)
            assert_matches(out.float(), lse, ref, ref_lse, tol=tol)


@pytest.mark.skipif(not ON_GPU, reason="the C++ decode kernel runs on a GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d,hq,hkv,page,window", [(128, 32, 8, None, (-1, -1)),
                                                   (64, 8, 1, 16, (-1, -1)),
                                                   (96, 6, 2, 256, (40, 0)),
                                                   (256, 4, 4, 32, (-1, -1))])
def test_flash_attn_with_kvcache_on_the_cpp_decode_kernel(dtype, d, hq, hkv, page, window):
    """16-bit KV-cache calls through the operator's C++ CUDA kernel (the decode kernel where
    the build has it), appending one token, against the float64 definition."""
    g = torch.Generator().manual_seed(d + hq)
    lengths, capacity = [300, 0, 767], 768
    if page is None:
        k_cache, v_cache = (inputs(3, capacity, hkv, d, seed=s, dtype=dtype) for s in (1, 2))
        table = None
    else:
        pages = 3 * capacity // page
        k_cache, v_cache = (inputs(pages, page, hkv, d, seed=s, dtype=dtype) for s in (1, 2))
        table = torch.randperm(pages, generator=g).to(torch.int32).view(3, -1).to(DEVICE)
    q = inputs(3, 1, hq, d, seed=3, dtype=dtype)
    k_new, v_new = (inputs(3, 1, hkv, d, seed=s, dtype=dtype) for s in (4, 5))
    lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    with torch.no_grad():
        out, lse = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                                 cache_seqlens=lens, block_table=table,
                                                 causal=True, window_size=window,
                                                 return_softmax_lse=True)
    torch.cuda.synchronize()
    ref, ref_lse = reference.attention_with_kvcache(
        q.cpu().float(), k_cache.cpu().float(), v_cache.cpu().float(),
        [n + 1 for n in lengths], None if table is None else table.cpu(), causal=True,
        window_size=window)
    assert_matches(out.float(), lse, ref, ref_lse, tol=2e-2)


def test_flash_attn_varlen_func(gpu_path):
    lengths = [3, 0, 11]
    cu = torch.tensor([0, 3, 3, 14], dtype=torch.int32, device=DEVICE)
    q, k, v = inputs(14, 4, 32, seed=1), inputs(14, 2, 32, seed=2), inputs(14, 2, 32, seed=3)
    with torch.no_grad():
        out, lse, _ = fattn.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths),
                                                   causal=True, return_attn_probs=True)
    ref, ref_lse = reference.attention_varlen(q.cpu(), k.cpu(), v.cpu(), cu.cpu(), cu.cpu(),
                                              causal=True)
    assert_matches(out, lse, ref, ref_lse)


def test_flash_attn_varlen_func_over_pages(gpu_path):
    """flash_attn_varlen_func with block_table and seqused_k on the operator's CUDA kernel
    (the Triton forward): the keys on shuffled pages of 16."""
    lengths = [3, 0, 21]
    cu = torch.tensor([0, 3, 3, 24], dtype=torch.int32)
    q, k, v = inputs(24, 4, 32, seed=1), inputs(24, 2, 32, seed=2), inputs(24, 2, 32, seed=3)
    pages = [(0, 0, 3), (2, 3, 19), (2, 19, 24)]  # (sequence, first key, end) a page
    order = [3, 1, 4]
    kc = torch.full((5, 16, 2, 32), float("nan"), device=DEVICE)
    vc = kc.clone()
    table = torch.full((3, 2), -1, dtype=torch.int32)
    seen = {0: 0, 2: 0}
    for (b, first, end), page in zip(pages, order):
        kc[page, :end - first] = k[first:end]
        vc[page, :end - first] = v[first:end]
        table[b, seen[b]] = page
        seen[b] += 1
    used = torch.tensor(lengths, dtype=torch.int32)
    with torch.no_grad():
        out = fattn.flash_attn_varlen_func(q, kc, vc, cu.to(DEVICE), None, 21, 21, causal=True,
                                           block_table=table.to(DEVICE),
                                           seqused_k=used.to(DEVICE))
    ref, ref_lse = reference.attention_varlen(q.cpu(), k.cpu(), v.cpu(), cu, cu, causal=True)
    assert (out.cpu().double() - ref).abs().max().item() <= TOL * max(1.0, ref.abs().max().item())


def test_sdpa_dropout_through_autograd(gpu_path):
    """dropout_p on the operator's CUDA kernels (the Triton forward and backward; the C++
    kernels take no dropout): the stream drawn from the device's generator, the mask
    fattn.dropout_mask gives, gradients through autograd."""
    q = inputs(1, 4, 23, 32, seed=1).requires_grad_()
    k = inputs(1, 2, 31, 32, seed=2).requires_grad_()
    v = inputs(1, 2, 31, 32, seed=3).requires_grad_()
    dout = inputs(1, 4, 23, 32, seed=5)
    p = 0.3
    torch.manual_seed(8)
    _, seed, offset = fattn.functional.dropout_stream("test", p, q.device)
    torch.manual_seed(8)
    out = fattn.scaled_dot_product_attention(q, k, v, dropout_p=p, enable_gqa=True)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    keep = fattn.dropout_mask(1, 4, 23, 31, p, int(seed), offset).double()
    leaves = [t.detach().cpu().double().requires_grad_() for t in (q, k, v)]
    kk, vv = (t.repeat_interleave(2, 1) for t in leaves[1:])
    probs = torch.softmax(leaves[0] @ kk.transpose(-1, -2) / 32 ** 0.5, -1)
    ref = (probs * keep / (1 - p)) @ vv
    ref_grads = torch.autograd.grad(ref, leaves, dout.cpu().double())
    assert (out.detach().cpu().double() - ref).abs().max().item() <= 5e-5 * max(1.0, ref.abs().max().item())
    for got, want in zip(grads, ref_grads):
        assert (got.cpu().double() - want).abs().max().item() <= 5e-5 * max(1.0, want.abs().max().item())


def test_sdpa_gradients_through_autograd(gpu_path):
    """torch.autograd through the operator's CUDA kernels: the Triton backward."""
    q = inputs(1, 4, 23, 32, seed=1).requires_grad_()
    k = inputs(1, 2, 31, 32, seed=2).requires_grad_()
    v = inputs(1, 2, 31, 32, seed=3).requires_grad_()
    mask = (torch.rand(1, 1, 23, 31, generator=torch.Generator().manual_seed(4)) > 0.3)
    out = fattn.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(DEVICE), enable_gqa=True)
    dout = inputs(1, 4, 23, 32, seed=5)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    leaves = [t.detach().cpu().double().requires_grad_() for t in (q, k, v)]
    ref, _ = reference.attention(*leaves, attn_mask=mask)
    ref_grads = torch.autograd.grad(ref, leaves, dout.cpu().double())
    for got, want in zip(grads, ref_grads):
        assert (got.cpu().double() - want).abs().max().item() <= 5e-5 * max(1.0, want.abs().max().item())


HOPPER = ON_GPU and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.skipif(not HOPPER, reason="the Hopper backward runs on compute capability 9.0")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("d,hq,hkv,causal,window,softcap", [
    (64, 4, 4, False, (-1, -1), 0.0), (128, 4, 4, False, (-1, -1), 0.0),
    (128, 8, 2, True, (-1, -1), 0.0), (96, 4, 2, False, (-1, -1), 0.0),
    (128, 4, 4, False, (64, 0), 0.0), (64, 4, 1, True, (-1, -1), 0.0),
    (128, 4, 2, True, (-1, -1), 2.0)],
    ids=["d64", "d128", "d128_gqa_causal", "d96_gqa", "d128_window", "d64_mqa_causal",
         "d128_softcap"])
def test_hopper_backward_gradients(dtype, d, hq, hkv, causal, window, softcap, monkeypatch):
    """autograd through fattn.flash_attention on the C++ Hopper backward at the shape and
    tiles training uses (S = 1024 > one tile of either kernel): each gradient's error
    against float64 within 2x torch SDPA's own in the same dtype, and the same bits twice.
    The dispatch runs it as a verified kernel would (it is the one under test here)."""
    verify(monkeypatch, "backward_tma")
    assert cuda_dispatch.plan("attention_backward", head_dim=d, dtype=dtype,
                              capability=(9, 0)).kernel == "backward_tma"
    gen = torch.Generator(device="cuda").manual_seed(d * 100 + hq)
    b, s = 2, 1024
    q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=gen)
                     for h in (hq, hkv, hkv, hq))

    def grads(fn, *t):
        leaves = [x.detach().requires_grad_() for x in t]
        out = fn(*leaves)
        return torch.autograd.grad(out, leaves, dout.to(out.dtype))

    def ours(q, k, v):
        return fattn.flash_attention(q, k, v, causal=causal, window_size=window, softcap=softcap)

    def definition(q, k, v):  # (B, S, H, D) in, out
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        kt, vt = (x.repeat_interleave(hq // hkv, dim=1) for x in (kt, vt))
        scores = qt @ kt.transpose(-1, -2) / d ** 0.5
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        i = torch.arange(s, device="cuda")[:, None]
        j = torch.arange(s, device="cuda")[None, :]
        hidden = torch.zeros(s, s, dtype=torch.bool, device="cuda")
        if causal:
            hidden |= j > i
        if window[0] >= 0:
            hidden |= j < i - window[0]
        if window[1] >= 0:
            hidden |= j > i + window[1]
        scores = scores.masked_fill(hidden, float("-inf"))
        return (scores.softmax(-1) @ vt).transpose(1, 2)

    want = grads(definition, *(x.double() for x in (q, k, v)))
    got = grads(ours, q, k, v)
    again = grads(ours, q, k, v)
    torch_own = grads(definition, q, k, v)  # torch's own error in this dtype
    for name, g, w, t, a in zip(("dq", "dk", "dv"), got, want, torch_own, again):
        err = (g.double() - w).abs().max().item()
        bound = 2 * (t.double() - w).abs().max().item()
        assert err <= bound, f"{name}: {err:.3g} against float64, torch's own {bound / 2:.3g}"
        assert torch.equal(g, a), f"{name}: two runs differ"
    # the gradient of a sum: autograd hands over an expanded dout (every stride 0)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    summed = torch.autograd.grad(ours(*leaves).sum(), leaves)
    ones = torch.ones_like(dout)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    explicit = torch.autograd.grad(ours(*leaves), leaves, ones)
    for g, e in zip(summed, explicit):
        assert torch.equal(g, e)


def test_varlen_gradients_through_autograd(gpu_path):
    cu = torch.tensor([0, 6, 6, 19], dtype=torch.int32, device=DEVICE)
    q, k, v = (inputs(19, h, 32, seed=s).requires_grad_() for s, h in ((1, 4), (2, 2), (3, 2)))
    out = fattn.flash_attn_varlen_func(q, k, v, cu, cu, 13, 13, causal=True)
    dout = inputs(19, 4, 32, seed=4)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    leaves = [t.detach().cpu().double().requires_grad_() for t in (q, k, v)]
    ref, _ = reference.attention_varlen(*leaves, cu.cpu(), cu.cpu(), causal=True)
    ref_grads = torch.autograd.grad(ref, leaves, dout.cpu().double())
    for got, want in zip(grads, ref_grads):
        assert (got.cpu().double() - want).abs().max().item() <= 5e-5 * max(1.0, want.abs().max().item())


# --- a transformers model through the GPU path --------------------------------------------
transformers = pytest.importorskip("transformers")
import fattn.transformers  # noqa: E402
from test_transformers import batch, tiny  # noqa: E402

NAME = fattn.transformers.register()


@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2", "gpt_oss"])
def test_transformers_logits_on_a_left_padded_batch(gpu_path, kind):
    ids, mask = batch(padded=True)
    with torch.no_grad():
        ours = tiny(kind, NAME).to(DEVICE)(input_ids=ids.to(DEVICE),
                                           attention_mask=mask.to(DEVICE)).logits.cpu()
        ref = tiny(kind, "eager")(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()
    err = (ours[keep] - ref[keep]).abs().max().item()
    assert err <= 1e-4 * max(1.0, ref[keep].abs().max().item()), err


@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2"])
def test_transformers_greedy_generate(gpu_path, kind):
    ids, mask = batch(padded=True)
    kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        ours = tiny(kind, NAME).to(DEVICE).generate(ids.to(DEVICE),
                                                    attention_mask=mask.to(DEVICE), **kw)
        ref = tiny(kind, "eager").generate(ids, attention_mask=mask, **kw)
    assert torch.equal(ours.cpu(), ref)


@pytest.mark.parametrize("kind", ["llama", "gpt_oss"])
def test_transformers_training_gradients(gpu_path, kind):
    """A training step's parameter gradients (gpt-oss: the sinks' too) against eager's."""
    ids, mask = batch(padded=False)
    grads = []
    for attn, device in ((NAME, DEVICE), ("eager", "cpu")):
        model = tiny(kind, attn).to(device).train()
        model(input_ids=ids.to(device), attention_mask=mask.to(device),
              labels=ids.to(device)).loss.backward()
        grads.append({n: p.grad.cpu() for n, p in model.named_parameters() if p.grad is not None})
    ours, ref = grads
    assert ours.keys() == ref.keys()
    for n in ref:
        bound = 1e-4 * max(1e-3, ref[n].abs().max().item())
        assert (ours[n] - ref[n]).abs().max().item() <= bound, n


# --- torch.library.opcheck of the operators' CUDA kernels --------------------------------
def opcheck_cases():
    g = torch.Generator().manual_seed(9)

    def t(*shape, grad=False):
        return torch.randn(*shape, generator=g).to(DEVICE).requires_grad_(grad)

    mask = (torch.rand(1, 1, 19, 27, generator=g) > 0.3).to(DEVICE)
    bshd = [t(1, 19, 4, 32, grad=True).transpose(1, 2)] + \
        [t(1, 27, 2, 32, grad=True).transpose(1, 2) for _ in range(2)]
    cu = torch.tensor([0, 5, 19], dtype=torch.int32, device=DEVICE)
    cache = [t(2, 2, 40, 32) for _ in range(2)]
    lens = torch.tensor([7, 30], dtype=torch.int32, device=DEVICE)
    return {
        "attention_mask_bshd": (torch.ops.fattn.attention.default, tuple(bshd),
                                dict(is_causal=False, attn_mask=mask, softcap=3.0)),
        "attention_window_sinks": (torch.ops.fattn.attention.default,
                                   (t(1, 4, 19, 32, grad=True), t(1, 1, 27, 32, grad=True),
                                    t(1, 1, 27, 32, grad=True)),
                                   dict(is_causal=True, causal_bottom_right=True,
                                        window_left=5, window_right=0,
                                        sinks=t(4, grad=True))),
        "attention_varlen": (torch.ops.fattn.attention_varlen.default,
                             (t(19, 4, 32, grad=True), t(19, 2, 32, grad=True),
                              t(19, 2, 32, grad=True), cu, cu), dict(causal=True)),
        "attention_kvcache": (torch.ops.fattn.attention_kvcache.default,
                              (t(2, 4, 1, 32), *cache, t(2, 2, 1, 32), t(2, 2, 1, 32), lens),
                              dict(causal=True)),
    }


@pytest.mark.parametrize("name", list(opcheck_cases()))
def test_opcheck_of_the_cuda_kernels(gpu_path, name):
    """Schema (the KV cache's in-place append), fake kernel against the real one (shapes,
    strides, dtypes), autograd registration."""
    op, args, kwargs = opcheck_cases()[name]
    tests = ("test_schema", "test_faketensor", "test_autograd_registration")
    torch.library.opcheck(op, args, kwargs, test_utils=tests)


# One bad input, one exception type on both devices: the C++ operators' CPU kernels and the
# CUDA path (here on CPU tensors through gpu_path) raise a RuntimeError (as torch and
# FlashAttention do) whose message names the argument. (name, call's keyword changes, the
# argument the message must name)
BAD_KVCACHE_INPUTS = [
    ("block_table out of range", dict(table_entry=99), "block_table"),
    ("window below -1", dict(window_size=(-2, 0)), "window"),
    ("page size not a multiple of 16", dict(page=8), "16"),
    ("lengths past the cache", dict(seqlen=60), "cache_seqlens"),
]


def bad_kvcache_call(table_entry=None, window_size=(-1, -1), page=16, seqlen=5):
    g = torch.Generator().manual_seed(5)
    pages, per_seq = 64 // page, 64 // page // 2
    k_cache, v_cache = (torch.randn(pages, page, 2, 32, generator=g).to(DEVICE) for _ in range(2))
    table = torch.arange(pages, dtype=torch.int32).view(2, per_seq).to(DEVICE)
    if table_entry is not None:
        table[0, 0] = table_entry
    q = torch.randn(2, 1, 4, 32, generator=g).to(DEVICE)
    k_new, v_new = (torch.randn(2, 1, 2, 32, generator=g).to(DEVICE) for _ in range(2))
    lens = torch.full((2,), seqlen, dtype=torch.int32, device=DEVICE)
    before = k_cache.clone()
    with torch.no_grad():
        try:
            fattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens,
                                          block_table=table, window_size=window_size)
        except Exception:
            assert torch.equal(k_cache, before), "a rejected call wrote the cache"
            raise


PATHS = ["cpu_kernels", "cuda_path"]


def take_path(path, request):
    """The operators' CPU kernels, or their CUDA kernels (gpu_path) on this test's device."""
    if path == "cuda_path":
        request.getfixturevalue("gpu_path")
    elif ON_GPU:
        pytest.skip("the CPU kernels run CPU tensors")


@pytest.mark.parametrize("case", BAD_KVCACHE_INPUTS, ids=lambda c: c[0].replace(" ", "_"))
@pytest.mark.parametrize("path", PATHS)
def test_bad_kvcache_input_same_error_on_both_paths(case, path, request, monkeypatch):
    take_path(path, request)
    # The host's verdict on CUDA too (a device-side assert would end the CUDA context; the
    # device-side checks are test_triton_cache.py's).
    from fattn.triton import api
    monkeypatch.setattr(api, "DEVICE_SIDE_CHECKS", ())
    _, changes, names = case
    with pytest.raises(RuntimeError, match=names) as e:
        bad_kvcache_call(**changes)
    assert str(e.value).startswith("fattn"), e.value


# FlashAttention's rotary_cos/sin, cache_batch_idx and cache_leftpad against a float64
# definition, through the CPU kernels and the CUDA path: (rotary: None or interleaved,
# causal, window, batch_idx, leftpad, S_cache). S_cache 64 with no left padding runs as one
# call (each cache row a page), the others sequence by sequence.
KVCACHE_INDEXED = [
    (True, True, (-1, -1), True, False, 64),
    (False, False, (-1, -1), True, True, 64),
    (None, True, (7, 0), False, True, 50),
    (True, False, (10, 3), True, False, 50),
]


def rotated64(x, cos, sin, at, interleaved):
    """float64 rotary: x (B, S, H, D), positions at (B, S)."""
    half = cos.size(1)
    c, s = cos.double()[at].unsqueeze(2), sin.double()[at].unsqueeze(2)
    x = x.double().clone()
    if interleaved:
        x1, x2 = x[..., 0:2 * half:2].clone(), x[..., 1:2 * half:2].clone()
        x[..., 0:2 * half:2], x[..., 1:2 * half:2] = x1 * c - x2 * s, x1 * s + x2 * c
    else:
        x1, x2 = x[..., :half].clone(), x[..., half:2 * half].clone()
        x[..., :half], x[..., half:2 * half] = x1 * c - x2 * s, x1 * s + x2 * c
    return x


@pytest.mark.parametrize("case", KVCACHE_INDEXED, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("path", PATHS)
def test_kvcache_rotary_batch_idx_leftpad_against_float64(case, path, request):
    take_path(path, request)
    interleaved, causal, window, with_idx, with_pad, s_cache = case
    b, sq, new, hq, hkv, d, half = 2, 3, 2, 4, 2, 32, 8
    g = torch.Generator().manual_seed(sum(map(hash, map(str, case))) % 1000)
    k_cache, v_cache = (torch.randn(5, s_cache, hkv, d, generator=g) for _ in range(2))
    q = torch.randn(b, sq, hq, d, generator=g)
    k, v = (torch.randn(b, new, hkv, d, generator=g) for _ in range(2))
    lens = torch.tensor([9, s_cache - new - 1], dtype=torch.int32)
    rows = torch.tensor([3, 1] if with_idx else [0, 1], dtype=torch.int32)
    pads = torch.tensor([4, 0] if with_pad else [0, 0], dtype=torch.int32)
    angle = torch.rand(s_cache + sq, half, generator=g) * 6.3
    cos, sin = angle.cos(), angle.sin()
    rot = {} if interleaved is None else dict(rotary_cos=cos.to(DEVICE), rotary_sin=sin.to(DEVICE),
                                              rotary_interleaved=interleaved)
    # the definition, float64
    ref_cache_k, ref_cache_v = k_cache.double().clone(), v_cache.double().clone()
    at_k = lens.long().view(-1, 1) + torch.arange(new)
    consecutive = causal or window != (-1, -1)
    at_q = lens.long().view(-1, 1) + (torch.arange(sq) if consecutive else torch.zeros(sq).long())
    k64 = k.double() if interleaved is None else rotated64(k, cos, sin, at_k, interleaved)
    q64 = q.double() if interleaved is None else rotated64(q, cos, sin, at_q, interleaved)
    outs = []
    for s in range(b):
        row, pad, n = int(rows[s]), int(pads[s]), int(lens[s])
        ref_cache_k[row, n:n + new], ref_cache_v[row, n:n + new] = k64[s], v.double()[s]
        keys = ref_cache_k[row, pad:n + new].transpose(0, 1)[None]
        values = ref_cache_v[row, pad:n + new].transpose(0, 1)[None]
        out, _ = reference.attention(q64[s].transpose(0, 1)[None], keys, values,
                                     causal="bottom_right" if causal else None,
                                     window_size=window)
        outs.append(out[0].transpose(0, 1))
    want = torch.stack(outs)
    k_cache, v_cache = k_cache.to(DEVICE), v_cache.to(DEVICE)
    with torch.no_grad():
        got = fattn.flash_attn_with_kvcache(
            q.to(DEVICE), k_cache, v_cache, k.to(DEVICE), v.to(DEVICE),
            cache_seqlens=lens.to(DEVICE), causal=causal, window_size=window,
            cache_batch_idx=rows.to(DEVICE) if with_idx else None,
            cache_leftpad=pads.to(DEVICE) if with_pad else None, **rot)
    assert (got.cpu().double() - want).abs().max().item() < 1e-5
    assert (k_cache.cpu().double() - ref_cache_k).abs().max().item() < 1e-6
    assert torch.equal(v_cache.cpu().double(), ref_cache_v)
