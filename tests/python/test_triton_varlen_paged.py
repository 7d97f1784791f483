"""fattn.triton.attention_varlen_kvcache (the GPU's varlen over a paged KV cache, what
torch.ops.fattn.attention_varlen_kvcache runs on CUDA): the keys on shuffled pages, with
cu_seqlens_k or seqused_k, and packed rows with seqused_k, against the float64 definition
of the same sequences packed; bad tables and lengths raise. On CUDA tensors with a GPU, under
Triton's interpreter on CPU tensors otherwise (see test_triton.py)."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")

import fattn.triton  # noqa: E402
from fattn.triton import reference  # noqa: E402
from conftest import int32  # noqa: E402
from test_triton import DEVICE, assert_matches  # noqa: E402
from test_triton_cache import HQ, HKV, D, TILES_16, on_device, randn, variants  # noqa: E402

CASES = [  # (q lengths, k lengths, variant, page)
    ([5, 0, 17, 3], [9, 4, 40, 0], "causal", 16),
    ([1, 33, 2], [40, 33, 1], "everything", 32),
    ([20, 7], [7, 20], "window_both", 16),
    ([1, 1, 4], [70, 3, 18], "sinks_alibi_heads", 48),
]


def on_pages(k, lengths, page, seed):
    """Rows of packed k on shuffled pages (num_blocks, Hkv, page, D), NaN where no key is,
    and the table (B, max_blocks) int32, -1 past each sequence's pages."""
    blocks = [(n + page - 1) // page for n in lengths]
    order = torch.randperm(sum(blocks) + 2, generator=torch.Generator().manual_seed(seed))
    cache = torch.full((sum(blocks) + 2, k.size(1), page, k.size(2)), float("nan"))
    table = torch.full((len(lengths), max(blocks) + 1), -1, dtype=torch.int32)
    start, used = 0, 0
    for b, n in enumerate(lengths):
        for j in range(blocks[b]):
            table[b, j] = order[used]
            rows = k[start + j * page:start + min((j + 1) * page, n)]
            cache[order[used], :, :rows.size(0)] = rows.transpose(0, 1)
            used += 1
        start += n
    return cache, table


@pytest.mark.parametrize("keys", ["pages", "pages_seqused", "rows_seqused"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[2]}-page{c[3]}")
def test_paged_varlen_against_definition(case, keys):
    lq, lk, name, page = case
    cu_q = int32([0] + torch.tensor(lq).cumsum(0).tolist())
    cu_k = int32([0] + torch.tensor(lk).cumsum(0).tolist())
    q, k, v = randn(sum(lq), HQ, D, seed=1), randn(sum(lk), HKV, D, seed=2), randn(sum(lk), HKV, D, seed=3)
    kw = variants(name, len(lq))
    ref, ref_lse = reference.attention_varlen(q, k, v, cu_q, cu_k, **kw)
    used = int32(lk)
    window = kw.pop("window_size", (-1, -1))
    args = dict(causal=kw.pop("causal", False), window_left=window[0], window_right=window[1],
                **TILES_16, **on_device(kw))
    if keys == "rows_seqused":  # 2 NaN rows after each sequence's keys
        wide_k = torch.cat([torch.cat([k[cu_k[b]:cu_k[b + 1]], torch.full((2, HKV, D), float("nan"))])
                            for b in range(len(lk))])
        wide_v = torch.cat([torch.cat([v[cu_k[b]:cu_k[b + 1]], torch.full((2, HKV, D), float("nan"))])
                            for b in range(len(lk))])
        cu_wide = int32([0] + (torch.tensor(lk) + 2).cumsum(0).tolist())
        out, lse = fattn.triton.attention_varlen_kvcache(
            q.to(DEVICE), wide_k.to(DEVICE), wide_v.to(DEVICE), cu_q.to(DEVICE),
            cu_wide.to(DEVICE), used.to(DEVICE), **args)
    else:
        kc, table = on_pages(k, lk, page, seed=page)
        vc, _ = on_pages(v, lk, page, seed=page)
        seqused = keys == "pages_seqused"
        out, lse = fattn.triton.attention_varlen_kvcache(
            q.to(DEVICE), kc.to(DEVICE), vc.to(DEVICE), cu_q.to(DEVICE),
            None if seqused else cu_k.to(DEVICE), used.to(DEVICE) if seqused else None,
            table.to(DEVICE), **args)
    assert_matches(out, lse, ref, ref_lse)


@pytest.mark.skipif(DEVICE != "cpu", reason="the host-side verdict (CUDA asserts on the device)")
def test_paged_varlen_errors():
    q = torch.randn(6, HQ, D)
    kc = torch.randn(4, HKV, 16, D)
    cu_q, cu_k = int32([0, 2, 6]), int32([0, 20, 30])
    table = int32([[0, 1], [2, 3]])
    call = fattn.triton.attention_varlen_kvcache
    with pytest.raises(fattn.triton.ArgumentError,
                       match=r"block_table\[1\]\[0\] = 9 is outside \[0, 4\)"):
        call(q, kc, kc, cu_q, cu_k, None, int32([[0, 1], [9, 3]]))
    with pytest.raises(fattn.triton.ArgumentError,
                       match=r"seqused_k\[0\] must be in \[0, 32\] \(block_table.size\(1\) × "
                             r"block_size, the keys a sequence's pages hold\), got 33"):
        call(q, kc, kc, cu_q, None, int32([33, 1]), table)
    with pytest.raises(fattn.triton.ArgumentError, match="multiple of 16"):
        call(q, kc[:, :, :8], kc[:, :, :8], cu_q, int32([0, 5, 10]), None, table)
    with pytest.raises(fattn.triton.ArgumentError, match="needs cu_seqlens_k or seqused_k"):
        call(q, kc, kc, cu_q, None, None, table)
    rows = torch.randn(30, HKV, D)
    with pytest.raises(fattn.triton.ArgumentError,
                       match=r"seqused_k\[1\] must be in \[0, 10\] \(its rows in cu_seqlens_k\), got 11"):
        call(q, rows, rows, cu_q, cu_k, int32([20, 11]))
