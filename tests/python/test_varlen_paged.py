"""fattn.flash_attn_varlen_func over a paged KV cache (block_table, seqused_k) on the CPU:
FlashAttention's own check (padded batches with random padding, keys on shuffled pages,
error at most twice that of torch's own arithmetic in the dtype against float64), the bits
of the packed call on the same numbers, seqused_k over pages and over packed rows, errors
that name the argument, inference only, opcheck and torch.compile."""
import math

import pytest
import torch

import fattn
from conftest import int32

varlen_kvcache_op = torch.ops.fattn.attention_varlen_kvcache


def padding_mask(max_len, batch, generator):
    """(batch, max_len) bool: each row's first L positions, L random in [max_len/3, max_len]
    (FlashAttention's "random" padding)."""
    lengths = torch.randint(max(1, max_len // 3), max_len + 1, (batch,), generator=generator)
    return torch.arange(max_len)[None] < lengths[:, None]


def unpad(x, mask):
    """(B, S, H, D) and (B, S) mask -> packed rows (total, H, D) and (B + 1,) offsets."""
    lengths = mask.sum(1)
    cu = torch.zeros(mask.size(0) + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    return x[mask], cu


def paged_cache(k, v, key_mask, page, generator):
    """The keys of each sequence (its padded rows' first L_b) on shuffled pages of `page`
    keys: (num_blocks, page, Hkv, D) caches with NaN in every slot no key fills, and the
    table (B, max_blocks) int32 (-1 past each sequence's pages)."""
    batch, _, heads, dim = k.shape
    lengths = key_mask.sum(1).tolist()
    blocks_of = [math.ceil(n / page) for n in lengths]
    num_blocks = sum(blocks_of) + 3
    order = torch.randperm(num_blocks, generator=generator).tolist()
    k_cache = torch.full((num_blocks, page, heads, dim), float("nan"), dtype=k.dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    table = torch.full((batch, max(blocks_of) + 1), -1, dtype=torch.int32)
    for b in range(batch):
        for n in range(blocks_of[b]):
            table[b, n] = order.pop()
            rows = slice(n * page, min((n + 1) * page, lengths[b]))
            count = rows.stop - rows.start
            k_cache[table[b, n], :count] = k[b, rows]
            v_cache[table[b, n], :count] = v[b, rows]
    return k_cache, v_cache, table


def attention_ref(q, k, v, q_mask, k_mask, causal, window, upcast=True):
    """Padded (B, S, H, D) attention with padding masks, causal and window aligned
    bottom-right per sequence: float64 arithmetic (upcast), or the inputs' own dtype with
    torch's operation order (the error torch makes in that dtype). Padded query rows 0."""
    dtype = q.dtype
    if upcast:
        q, k, v = q.double(), k.double(), v.double()
    group = q.size(2) // k.size(2)
    k, v = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q / math.sqrt(q.size(-1)), k)
    lq, lk = q_mask.sum(1)[:, None, None, None], k_mask.sum(1)[:, None, None, None]
    i = torch.arange(q.size(1))[None, None, :, None]
    j = torch.arange(k.size(1))[None, None, None, :]
    hidden = ~k_mask[:, None, None, :]
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if right >= 0:
        hidden = hidden | (j > i + lk - lq + right)
    if left >= 0:
        hidden = hidden | (j < i + lk - lq - left)
    s = s.masked_fill(hidden, float("-inf"))
    p = torch.softmax(s, dim=-1)
    p = p.masked_fill(hidden.all(-1, keepdim=True), 0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", p, v)
    return (out * q_mask[:, :, None, None]).to(dtype)


# FlashAttention's test_flash_attn_varlen_causal: its lengths, both orders, local windows,
# page sizes (None: packed keys); D 128 and a head dim that is not a power of two.
LENGTHS = [(1, 239), (3, 799), (127, 512), (127, 513), (113, 203), (128, 217), (113, 211),
           (108, 256), (256, 512)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("page", [None, 16, 256])
@pytest.mark.parametrize("local", [False, True])
@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", LENGTHS)
def test_flash_attention_paged_varlen_causal(seqlen_q, seqlen_k, swap, local, page, dtype):
    if swap:
        seqlen_q, seqlen_k = seqlen_k, seqlen_q
    g = torch.Generator().manual_seed(seqlen_q * 1000 + seqlen_k + 7 * swap + 3 * local)
    batch, heads, kv_heads, d = 3, 6, 2, 128 if (seqlen_q + seqlen_k) % 2 else 80
    window = (-1, -1) if not local else tuple(torch.randint(0, seqlen_k, (2,), generator=g).tolist())
    q = torch.randn(batch, seqlen_q, heads, d, generator=g).to(dtype)
    k = torch.randn(batch, seqlen_k, kv_heads, d, generator=g).to(dtype)
    v = torch.randn(batch, seqlen_k, kv_heads, d, generator=g).to(dtype)
    q_mask, k_mask = padding_mask(seqlen_q, batch, g), padding_mask(seqlen_k, batch, g)
    q_packed, cu_q = unpad(q, q_mask)
    k_packed, cu_k = unpad(k, k_mask)
    v_packed, _ = unpad(v, k_mask)
    if page is None:
        keys = (k_packed, v_packed, None)
    else:
        keys = paged_cache(k, v, k_mask, page, g)
    out_packed = fattn.flash_attn_varlen_func(q_packed, keys[0], keys[1], cu_q, cu_k, seqlen_q,
                                              seqlen_k, causal=True, window_size=window,
                                              block_table=keys[2])
    out = torch.zeros_like(q)
    out[q_mask] = out_packed
    ref = attention_ref(q, k, v, q_mask, k_mask, True, window)
    own = attention_ref(q, k, v, q_mask, k_mask, True, window, upcast=False)
    err = (out.double() - ref.double()).abs().max().item()
    torch_err = (own.double() - ref.double()).abs().max().item()
    assert err <= 2 * torch_err + 1e-5, (err, torch_err)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal,window,softcap,alibi", [
    (False, (-1, -1), 0.0, False), (True, (-1, -1), 0.0, False), (True, (40, 3), 0.0, False),
    (False, (-1, -1), 5.0, True), (True, (-1, -1), 0.0, True)])
@pytest.mark.parametrize("page", [16, 48, 256])
def test_paged_gives_the_packed_calls_bits(page, causal, window, softcap, alibi, dtype):
    """The same keys as packed rows and on pages: the same bits, with the variants, GQA,
    sequences without keys or queries, decode-sized and prefill-sized sequences."""
    g = torch.Generator().manual_seed(page + 10 * causal + int(softcap))
    lengths_q = [1, 0, 37, 5, 130, 1, 64]
    lengths_k = [700, 9, 37, 0, 300, 1, 64]
    hq, hkv, d = 8, 2, 64
    cu_q = int32([0] + torch.tensor(lengths_q).cumsum(0).tolist())
    cu_k = int32([0] + torch.tensor(lengths_k).cumsum(0).tolist())
    q = torch.randn(int(cu_q[-1]), hq, d, generator=g).to(dtype)
    k = torch.randn(int(cu_k[-1]), hkv, d, generator=g).to(dtype)
    v = torch.randn(int(cu_k[-1]), hkv, d, generator=g).to(dtype)
    slopes = torch.rand(hq, generator=g) * 0.3 if alibi else None
    kw = dict(causal=causal, window_size=window, softcap=softcap, alibi_slopes=slopes,
              return_attn_probs=True)
    out, lse, _ = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 130, 700, **kw)
    padded_k = torch.zeros(len(lengths_k), max(lengths_k), hkv, d, dtype=dtype)
    padded_v = torch.zeros_like(padded_k)
    mask = torch.arange(max(lengths_k))[None] < torch.tensor(lengths_k)[:, None]
    padded_k[mask], padded_v[mask] = k, v
    k_cache, v_cache, table = paged_cache(padded_k, padded_v, mask, page, g)
    paged, paged_lse, _ = fattn.flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, 130, 700,
                                                       block_table=table, **kw)
    assert torch.equal(paged, out) and torch.equal(paged_lse, lse)
    # seqused_k instead of cu_seqlens_k
    used = int32(lengths_k)
    by_used, _, _ = fattn.flash_attn_varlen_func(q, k_cache, v_cache, cu_q, None, 130, 700,
                                                 block_table=table, seqused_k=used, **kw)
    assert torch.equal(by_used, out)
    # packed rows with 3 spare NaN rows after each sequence, seqused_k their keys
    wide_k = torch.full((int(cu_k[-1]) + 3 * len(lengths_k), hkv, d), float("nan"), dtype=dtype)
    wide_v = wide_k.clone()
    starts = [int(cu_k[b]) + 3 * b for b in range(len(lengths_k))]
    for b, n in enumerate(lengths_k):
        wide_k[starts[b]:starts[b] + n] = k[cu_k[b]:cu_k[b + 1]]
        wide_v[starts[b]:starts[b] + n] = v[cu_k[b]:cu_k[b + 1]]
    cu_wide = int32(starts + [wide_k.size(0)])
    by_rows, _, _ = fattn.flash_attn_varlen_func(q, wide_k, wide_v, cu_q, cu_wide, 130, 703,
                                                 seqused_k=used, **kw)
    assert torch.equal(by_rows, out)


def _small_paged():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(10, 4, 32, generator=g)
    k_cache = torch.randn(4, 16, 2, 32, generator=g)
    v_cache = torch.randn(4, 16, 2, 32, generator=g)
    return q, k_cache, v_cache, int32([0, 4, 10]), int32([0, 20, 30]), int32([[0, 1], [2, 3]])


def test_paged_errors_name_the_argument():
    q, kc, vc, cu_q, cu_k, table = _small_paged()
    fa = fattn.flash_attn_varlen_func
    with pytest.raises(RuntimeError, match=r"block_table\[1\]\[0\] = 7 is outside \[0, 4\)"):
        fa(q, kc, vc, cu_q, cu_k, 6, 20, block_table=int32([[0, 1], [7, 3]]))
    with pytest.raises(RuntimeError, match="sequence 1 has 40 keys .* more than its pages hold: "
                                           "block_table.size\\(1\\) × block_size = 32"):
        fa(q, kc, vc, cu_q, int32([0, 20, 60]), 6, 40, block_table=table)
    with pytest.raises(RuntimeError, match=r"seqused_k\[0\] must be in \[0, 32\]"):
        fa(q, kc, vc, cu_q, None, 6, 40, block_table=table, seqused_k=int32([33, 1]))
    with pytest.raises(RuntimeError, match="must be a multiple of 16"):
        fa(q, kc[:, :8], vc[:, :8], cu_q, int32([0, 5, 10]), 6, 5, block_table=table)
    with pytest.raises(ValueError, match="block_table.dtype must be torch.int32"):
        fa(q, kc, vc, cu_q, cu_k, 6, 20, block_table=table.long())
    with pytest.raises(ValueError, match=r"k must have 4 dimensions \(num_blocks, block_size, "
                                         r"Hkv, D\)"):
        fa(q, kc[0], vc[0], cu_q, cu_k, 6, 20, block_table=table)
    with pytest.raises(ValueError, match="max_seqlen_k = 5 is less than the longest sequence in "
                                         "seqused_k, 9"):
        fa(q, kc, vc, cu_q, None, 6, 5, block_table=table, seqused_k=int32([9, 1]))
    with pytest.raises(RuntimeError, match="cu_seqlens_k or seqused_k"):
        varlen_kvcache_op(q, kc.transpose(1, 2), vc.transpose(1, 2), cu_q, block_table=table)


def test_paged_without_queries():
    """A batch with no query row gives empty outputs, as the packed call does."""
    _, kc, vc, _, cu_k, table = _small_paged()
    q = torch.randn(0, 4, 32)
    out, lse, _ = fattn.flash_attn_varlen_func(q, kc, vc, int32([0, 0, 0]), cu_k, 0, 20,
                                               block_table=table, return_attn_probs=True)
    assert out.shape == (0, 4, 32) and lse.shape == (4, 0)


def test_paged_is_inference_only():
    q, kc, vc, cu_q, cu_k, table = _small_paged()
    q.requires_grad_()
    out = fattn.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 6, 20, block_table=table)
    with pytest.raises(RuntimeError, match="not implemented"):
        out.sum().backward()


def test_opcheck_and_compile_paged_varlen():
    q, kc, vc, cu_q, cu_k, table = _small_paged()
    args = (q, kc.transpose(1, 2), vc.transpose(1, 2), cu_q, cu_k, None, table)
    torch.library.opcheck(varlen_kvcache_op.default, args, {"causal": True})
    step = torch.compile(lambda *a: fattn.flash_attn_varlen_func(*a, block_table=table,
                                                                 causal=True),
                         fullgraph=True, backend="aot_eager")
    eager = fattn.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 6, 20, block_table=table,
                                         causal=True)
    torch._dynamo.reset()
    assert torch.equal(step(q, kc, vc, cu_q, cu_k, 6, 20), eager)
