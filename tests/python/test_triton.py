"""fattn.triton.attention (the GPU forward) against its float64 definition
(fattn/triton/reference.py, cross-checked here against fattn's C++ float64 reference).

On a machine with a GPU the tensors are CUDA tensors; without one the same tests run the
kernel under Triton's interpreter on CPU tensors (TRITON_INTERPRET=1, set by conftest.py
before triton is imported; triton 3.6's interpreter needs numpy < 2.4). Small shapes and
16 × 16 tiles, so that every case crosses tile edges: the interpreter runs numpy per tile.
"""
import math
import os

import pytest
import torch

if not torch.cuda.is_available():  # conftest.py sets it first; this is for a lone run
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")

import fattn  # noqa: E402
import fattn.triton  # noqa: E402
from fattn.triton import reference  # noqa: E402
from test_16bit import inputs, ulp_floor  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TILES = dict(block_m=16, block_n=16)
# float32 against float64: |err| <= 2e-5 · max(1, max|ref|) for outputs (products of
# float32 roundings over D <= 256 terms and a softmax; fattn's C++ bound is 1e-5 at
# IEEE products; 3xTF32 on a GPU adds about 1e-6), 2e-5 · max(1, |lse|) for logsumexps
TOL = 2e-5


def to_device(*ts):
    return [None if t is None else t.to(DEVICE) for t in ts]


def assert_matches(out, lse, ref, ref_lse, tol=TOL):
    out, lse = out.cpu(), lse.cpu()
    assert not out.isnan().any(), "NaN in the output"
    err = (out.double() - ref).abs().max().item() if ref.numel() else 0.0
    assert err <= tol * max(1.0, ref.abs().max().item() if ref.numel() else 0.0), err
    finite = ref_lse.isfinite()
    assert torch.equal(lse.isfinite(), finite), "rows with logsumexp -inf differ"
    if finite.any():
        lse_err = (lse.double()[finite] - ref_lse[finite]).abs()
        assert bool((lse_err <= tol * ref_lse[finite].abs().clamp(min=1.0)).all()), \
            lse_err.max().item()


def run(q, k, v, causal=None, **kw):
    q, k, v = to_device(q, k, v)
    kw = {name: (t.to(DEVICE) if torch.is_tensor(t) else t) for name, t in kw.items()}
    return fattn.triton.attention(q, k, v, causal=causal is not None,
                                  causal_bottom_right=causal == "bottom_right",
                                  return_lse=True, **TILES, **kw)


# --- every head dim, odd lengths, Sq != Sk, both causal alignments, GQA, layouts --------
GRID = [  # (b, hq, hkv, sq, sk, d, causal, layout)
    (1, 2, 2, 37, 53, 16, None, "bhsd"),
    (2, 4, 2, 70, 45, 32, "top_left", "bshd"),
    (1, 4, 1, 45, 70, 48, "bottom_right", "strided"),
    (1, 2, 2, 33, 33, 64, "top_left", "bhsd"),
    (1, 3, 3, 20, 51, 80, None, "bshd"),
    (1, 4, 2, 17, 40, 96, "bottom_right", "bhsd"),
    (1, 2, 1, 1, 90, 128, None, "bshd"),
    (1, 2, 2, 19, 35, 160, "top_left", "strided"),
    (1, 2, 2, 21, 18, 192, "bottom_right", "bhsd"),
    (1, 2, 2, 20, 33, 256, "bottom_right", "bshd"),
    (1, 2, 2, 40, 8, 64, "bottom_right", "bhsd"),   # Sq > Sk: the first rows see no key
]


@pytest.mark.parametrize("case", GRID, ids=lambda c: "-".join(map(str, c)))
def test_float32_grid(case):
    b, hq, hkv, sq, sk, d, causal, layout = case
    q, k, v = inputs(torch.float32, b, hq, hkv, sq, sk, d, seed=sq * 7 + d, layout=layout)
    out, lse = run(q, k, v, causal)
    assert out.shape == (b, hq, sq, d) and lse.shape == (b, hq, sq)
    ref, ref_lse = reference.attention(q, k, v, causal=causal)
    assert_matches(out, lse, ref, ref_lse)


def test_reference_is_fattns_definition():
    """The Python float64 definition and the C++ one (torch.ops.fattn on float64) agree,
    variants included: the kernel's tests measure against the project's one definition."""
    q, k, v = inputs(torch.float64, 2, 4, 2, 23, 31, 32, seed=5)
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(2, 1, 23, 31, generator=g) > 0.3
    sinks = torch.randn(4, generator=g, dtype=torch.float64)
    slopes = torch.rand(4, generator=g, dtype=torch.float64)
    ref, ref_lse = reference.attention(q, k, v, attn_mask=mask, causal="bottom_right",
                                       window_size=(9, 2), softcap=2.5, sinks=sinks,
                                       alibi_slopes=slopes)
    out, lse = torch.ops.fattn.attention(q, k, v, True, True, None, "auto", mask, 9, 2, 2.5,
                                         slopes, sinks)
    assert (out - ref).abs().max().item() < 1e-12
    finite = ref_lse.isfinite()
    assert torch.equal(lse.isfinite(), finite)
    assert (lse[finite] - ref_lse[finite]).abs().max().item() < 1e-12


# --- the variants, alone and together --------------------------------------------------
B, HQ, HKV, SQ, SK, D = 2, 4, 2, 37, 53, 48


def masks():
    g = torch.Generator().manual_seed(11)
    boolean = torch.rand(B, 1, SQ, SK, generator=g) > 0.3
    additive = torch.randn(1, HQ, 1, SK, generator=g)
    additive[..., :20] = float("-inf")             # whole tiles hidden, then mixed
    padding = torch.ones(B, 1, 1, SK, dtype=torch.bool)
    padding[0, ..., 30:] = False                    # right padding: trailing tiles skipped
    padding[1, ..., :40] = False                    # left padding
    empty_rows = torch.rand(SQ, SK, generator=g) > 0.5
    empty_rows[3:9] = False                         # rows that see no key: 0 and -inf
    return {"bool_b1qk": boolean, "additive_1h1k": additive, "padding_b11k": padding,
            "bool_2d_empty_rows": empty_rows}


VARIANTS = {
    "window_both": dict(window_size=(5, 3)),
    "window_left_causal": dict(window_size=(7, -1), causal="top_left"),
    "window_right_only": dict(window_size=(-1, 0)),
    "window_causal_bottom_right": dict(window_size=(4, 0), causal="bottom_right"),
    "softcap": dict(softcap=2.0),
    "sinks": dict(sinks="sinks"),
    "alibi_heads": dict(alibi_slopes="slopes_h"),
    "alibi_batch_heads": dict(alibi_slopes="slopes_bh"),
    "mask_bool": dict(attn_mask="bool_b1qk"),
    "mask_additive": dict(attn_mask="additive_1h1k"),
    "mask_padding_causal": dict(attn_mask="padding_b11k", causal="top_left"),
    "mask_empty_rows": dict(attn_mask="bool_2d_empty_rows"),
    "mask_empty_rows_sinks": dict(attn_mask="bool_2d_empty_rows", sinks="sinks"),
    "everything": dict(attn_mask="bool_b1qk", sinks="sinks", softcap=3.0, window_size=(10, 2),
                       alibi_slopes="slopes_bh", causal="bottom_right"),
}


def variant_args(spec, dtype=torch.float32):
    g = torch.Generator().manual_seed(3)
    named = dict(masks(), sinks=torch.randn(HQ, generator=g),
                 slopes_h=torch.rand(HQ, generator=g), slopes_bh=torch.rand(B, HQ, generator=g))
    kw = {name: named[value] if isinstance(value, str) and value in named else value
          for name, value in spec.items()}
    if "attn_mask" in kw and kw["attn_mask"].dtype != torch.bool:
        kw["attn_mask"] = kw["attn_mask"].to(dtype)
    return kw


@pytest.mark.parametrize("name", list(VARIANTS))
def test_float32_variants(name):
    kw = variant_args(VARIANTS[name])
    causal = kw.pop("causal", None)
    q, k, v = inputs(torch.float32, B, HQ, HKV, SQ, SK, D, seed=len(name), layout="bshd")
    out, lse = run(q, k, v, causal, **kw)
    ref, ref_lse = reference.attention(q, k, v, causal=causal, **kw)
    assert_matches(out, lse, ref, ref_lse)


def test_mask_cover_skips_hidden_tiles_and_reads_no_unchanged_ones():
    """The cover is per tile: the kernel reads the mask only in tiles the cover calls
    mixed. The cover is computed on the first call (and cached); NaN then written into the
    mask behind its version counter (through .data), in a hidden and an unchanged tile:
    a kernel that read either would return NaN."""
    from fattn.triton import problem
    q, k, v = inputs(torch.float32, 1, 2, 2, 32, 64, 32, seed=2)
    mask = torch.zeros(1, 1, 32, 64, device=DEVICE)
    mask[..., 32:48] = float("-inf")                  # key tile 2: hidden for every row
    mask[..., 20, 50] = float("-inf")                 # one mixed tile
    cover = problem.mask_cover(mask.expand(1, 2, 32, 64), 16, 16)
    assert cover[0, 0].tolist() == [[1, 1, 0, 1], [1, 1, 0, 2]]
    ref, ref_lse = reference.attention(q, k, v, attn_mask=mask.cpu())
    out, lse = run(q, k, v, attn_mask=mask)
    assert_matches(out, lse, ref, ref_lse)
    mask.data[..., 0:16, 0:16] = float("nan")         # unchanged tile (0, 0)
    mask.data[..., 0:16, 32:48] = float("nan")        # hidden tile (0, 2)
    out, lse = run(q, k, v, attn_mask=mask)
    assert_matches(out, lse, ref, ref_lse)


def test_mask_cover_is_cached_per_tensor_and_version():
    from fattn.triton import problem
    mask = torch.rand(1, 1, 20, 40) > 0.5
    view = mask.expand(2, 3, 20, 40)
    first = problem.mask_cover(view, 16, 16)
    assert problem.mask_cover(view, 16, 16) is first
    mask[..., :16] = False  # in place: the version changes, the cover is recomputed
    again = problem.mask_cover(view, 16, 16)
    assert again is not first and not bool(again[0, 0, :, 0].any())


def test_poisoned_output_is_fully_written():
    q, k, v = inputs(torch.float32, 1, 2, 2, 33, 47, 40, seed=9)
    out = torch.full((1, 2, 33, 40), float("nan"), device=DEVICE)
    q, k, v = to_device(q, k, v)
    fattn.triton.attention(q, k, v, causal=True, out=out, **TILES)
    ref, _ = reference.attention(q.cpu(), k.cpu(), v.cpu(), causal="top_left")
    assert not out.isnan().any()
    assert (out.cpu().double() - ref).abs().max().item() <= TOL


def test_default_tiles_match():
    """The tile sizes a call gets by default (not the tests' 16 × 16)."""
    q, k, v = inputs(torch.float32, 1, 4, 2, 70, 130, 64, seed=4)
    out, lse = fattn.triton.attention(*to_device(q, k, v), causal=True, return_lse=True)
    ref, ref_lse = reference.attention(q, k, v, causal="top_left")
    assert_matches(out, lse, ref, ref_lse)


# --- accuracy: large logits, 16-bit within the project's rule ---------------------------
def torch_eager(q, k, v, dtype, causal=None, attn_mask=None, window_size=(-1, -1), softcap=0.0,
                sinks=None, alibi_slopes=None):
    """torch's own computation of the definition in `dtype` (the eager attention of
    transformers: scores and P·V in dtype, softmax in float32), for the 16-bit rule."""
    q, k, v = (t.to(dtype) for t in (q, k, v))
    hq, sq, sk = q.size(1), q.size(2), k.size(2)
    k = k.repeat_interleave(hq // k.size(1), 1)
    v = v.repeat_interleave(hq // v.size(1), 1)
    s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    bias = torch.zeros(sq, sk, dtype=torch.float32)
    if alibi_slopes is not None:
        distance = (torch.arange(sq).view(-1, 1) + sk - sq - torch.arange(sk).view(1, -1)).abs()
        bias = bias - alibi_slopes.expand(q.size(0), hq).reshape(-1, hq, 1, 1) * distance
    if attn_mask is not None:
        bias = bias.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool \
            else bias + attn_mask.float()
    bias = bias.masked_fill(~reference.visible_pairs(sq, sk, causal, window_size),
                            float("-inf"))
    s = s.float() + bias
    if sinks is not None:
        s = torch.cat([s, sinks.view(1, hq, 1, 1).expand(s.size(0), hq, sq, 1)], -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    if sinks is not None:
        p = p[..., :-1]
    return torch.matmul(p.to(dtype), v)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", ["plain_causal", "window_both", "softcap", "everything",
                                  "mask_additive"])
def test_16bit_within_rule(dtype, name):
    spec = {"causal": "bottom_right"} if name == "plain_causal" else VARIANTS[name]
    kw = variant_args(spec, dtype)
    causal = kw.pop("causal", None)
    q, k, v = inputs(dtype, B, HQ, HKV, SQ, SK, D, seed=17)
    out, _ = run(q, k, v, causal, **kw)
    ref, _ = reference.attention(q, k, v, causal=causal, **kw)
    torchs = torch_eager(q, k, v, dtype, causal, **kw)
    err = (out.cpu().double() - ref).abs().max().item()
    err_torch = (torchs.double() - ref).abs().max().item()
    bound = 2 * err_torch + ulp_floor(ref, dtype)
    assert out.dtype == dtype and err <= bound, (err, err_torch, bound)


@pytest.mark.parametrize("d", [64, 256])
def test_large_logits_float32(d):
    """q, k ~ 4·N(0, 1), scale 0.3 (scores in the tens): the RMS error against float64
    within 1.5x torch's own float32 error on the same inputs, plus the C++ suite's 1e-7."""
    q, k, v = inputs(torch.float32, 1, 4, 2, 29, 77, d, seed=d, scale=4.0)
    out, _ = run(q, k, v, "bottom_right", scale=0.3)
    ref, _ = reference.attention(q, k, v, causal="bottom_right", scale=0.3)
    mask = reference.visible_pairs(29, 77, "bottom_right")
    torchs = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                              scale=0.3, enable_gqa=True)
    rms = (out.cpu().double() - ref).pow(2).mean().sqrt().item()
    rms_torch = (torchs.double() - ref).pow(2).mean().sqrt().item()
    assert rms <= 1.5 * rms_torch + 1e-7, (rms, rms_torch)


# --- bad input: a clear error naming the argument, nothing written ------------------------
@pytest.mark.parametrize("call,match", [
    (lambda q: fattn.triton.attention(q[..., :8], q[..., :8], q[..., :8]), r"q.size\(3\) \(head dim\) must be in \[16, 256\], got 8"),
    (lambda q: fattn.triton.attention(q, q, q, causal_bottom_right=True),
     "causal_bottom_right=True needs causal=True"),
    (lambda q: fattn.triton.attention(q, q[:, :3], q[:, :3]), r"q.size\(1\) \(query heads\) must be a multiple of k.size\(1\) \(kv heads\) = 3"),
    (lambda q: fattn.triton.attention(q, q, q.half()), "v.dtype is torch.float16"),
    (lambda q: fattn.triton.attention(q.double(), q.double(), q.double()),
     "must be float32, float16 or bfloat16"),
    (lambda q: fattn.triton.attention(q, q, q, window_size=(-2, 0)),
     "window_left must be >= -1"),
    (lambda q: fattn.triton.attention(q, q, q, softcap=-1.0), "softcap must be"),
    (lambda q: fattn.triton.attention(q, q, q, sinks=torch.zeros(3)),
     r"sinks must have shape \(query heads,\) = \(4,\)"),
    (lambda q: fattn.triton.attention(q, q, q, alibi_slopes=torch.zeros(4, dtype=torch.float64)),
     "alibi_slopes must be float32"),
    (lambda q: fattn.triton.attention(q, q, q, attn_mask=torch.ones(5, 16, dtype=torch.bool)),
     "attn_mask's query sequence dimension must be 1"),
    (lambda q: fattn.triton.attention(q, q, q, attn_mask=torch.ones(16, 16, dtype=torch.int32)),
     "attn_mask must have dtype bool or q's dtype"),
    (lambda q: fattn.triton.attention(q, q, q.to("meta")), "v is on meta but q is on cpu"),
])
def test_bad_arguments(call, match):
    q = torch.randn(2, 4, 16, 16)
    with pytest.raises(fattn.triton.ArgumentError, match=match):
        call(q)
