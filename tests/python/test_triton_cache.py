"""fattn.triton.attention_with_kvcache and attention_varlen (the GPU's KV cache and packed
sequences) against the float64 definition, sequence by sequence; the append in place; bad
input raises before anything is written. On CUDA tensors with a GPU, under Triton's
interpreter on CPU tensors otherwise (see test_triton.py)."""
import os
import re

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")

import fattn.triton  # noqa: E402
from fattn.triton import reference  # noqa: E402
from conftest import int32  # noqa: E402
from test_triton import DEVICE, assert_matches  # noqa: E402

HQ, HKV, D = 4, 2, 32


def randn(*shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def variants(name, batch, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "plain": {},
        "causal": {"causal": True},
        "window_causal": {"causal": True, "window_size": (3, 0)},
        "window_both": {"window_size": (4, 1)},
        "everything": {"causal": True, "window_size": (6, 0), "softcap": 3.0,
                       "sinks": torch.randn(HQ, generator=g),
                       "alibi_slopes": torch.rand(batch, HQ, generator=g)},
        "sinks_alibi_heads": {"sinks": torch.randn(HQ, generator=g),
                              "alibi_slopes": torch.rand(HQ, generator=g)},
    }[name]


def on_device(kw):
    return {k: (v.to(DEVICE) if torch.is_tensor(v) else v) for k, v in kw.items()}


# --- KV cache ---------------------------------------------------------------------------
def make_cache(paged, batch, capacity, page, seed):
    if paged:
        pages = batch * (capacity // page) + 3
        k_cache = randn(pages, page, HKV, D, seed=seed)
        v_cache = randn(pages, page, HKV, D, seed=seed + 1)
        g = torch.Generator().manual_seed(seed)
        table = torch.randperm(pages, generator=g)[:batch * (capacity // page)]
        return k_cache, v_cache, table.view(batch, -1).to(torch.int32)
    return randn(batch, capacity, HKV, D, seed=seed), randn(batch, capacity, HKV, D,
                                                            seed=seed + 1), None


CACHE_CASES = [  # (paged, sq, new, splits, variant)
    (False, 1, 0, 1, "plain"),
    (False, 1, 1, 0, "causal"),
    (False, 3, 2, 3, "everything"),
    (True, 1, 1, 4, "causal"),
    (True, 2, 3, 1, "window_causal"),
    (True, 5, 0, 2, "sinks_alibi_heads"),
    (False, 20, 4, 1, "window_both"),     # more rows than a packed tile: per-head tiles
]


@pytest.mark.parametrize("case", CACHE_CASES, ids=lambda c: "-".join(map(str, c)))
def test_kvcache_against_definition(case):
    paged, sq, new, splits, name = case
    batch, capacity, page = 3, 48, 16
    lens = torch.tensor([7, 0, 40], dtype=torch.int32)[:batch]
    k_cache, v_cache, table = make_cache(paged, batch, capacity, page, seed=sq + new)
    q = randn(batch, sq, HQ, D, seed=5)
    k_new = randn(batch, new, HKV, D, seed=6) if new else None
    v_new = randn(batch, new, HKV, D, seed=7) if new else None
    kw = variants(name, batch)
    k_dev, v_dev = k_cache.to(DEVICE), v_cache.to(DEVICE)
    out, lse = fattn.triton.attention_with_kvcache(
        q.to(DEVICE), k_dev, v_dev, k=None if k_new is None else k_new.to(DEVICE),
        v=None if v_new is None else v_new.to(DEVICE), cache_seqlens=lens.to(DEVICE),
        block_table=None if table is None else table.to(DEVICE), num_splits=splits,
        return_lse=True, block_n=16, **on_device(kw))
    assert out.shape == (batch, sq, HQ, D) and lse.shape == (batch, HQ, sq)
    k_after, v_after = k_dev.cpu(), v_dev.cpu()
    ends = (lens + new).tolist()
    for b in range(batch):  # the append, and nothing else written
        got_k = reference.cache_rows(k_after, b, ends[b], table)
        got_v = reference.cache_rows(v_after, b, ends[b], table)
        before = reference.cache_rows(k_cache, b, int(lens[b]), table)
        assert torch.equal(got_k[:int(lens[b])], before)
        if new:
            assert torch.equal(got_k[int(lens[b]):], k_new[b])
            assert torch.equal(got_v[int(lens[b]):], v_new[b])
    written = torch.zeros(k_cache.shape[:2], dtype=torch.bool)
    for b in range(batch):
        for pos in range(int(lens[b]), ends[b]):
            if table is None:
                written[b, pos] = True
            else:
                written[table[b, pos // page], pos % page] = True
    assert torch.equal(k_after[~written], k_cache[~written])
    ref, ref_lse = reference.attention_with_kvcache(q, k_after, v_after, ends, table, **kw)
    assert_matches(out, lse, ref, ref_lse)


def test_kvcache_without_seqlens_reads_the_whole_cache():
    k_cache, v_cache, _ = make_cache(False, 2, 37, 16, seed=1)
    q = randn(2, 1, HQ, D, seed=2)
    out, lse = fattn.triton.attention_with_kvcache(q.to(DEVICE), k_cache.to(DEVICE),
                                                   v_cache.to(DEVICE), return_lse=True)
    ref, ref_lse = reference.attention_with_kvcache(q, k_cache, v_cache, [37, 37])
    assert_matches(out, lse, ref, ref_lse)


def test_kvcache_int_seqlens_and_bfloat16_within_a_16bit_bound():
    k_cache, v_cache, table = make_cache(True, 2, 64, 16, seed=3)
    k_cache, v_cache = k_cache.bfloat16(), v_cache.bfloat16()
    q = randn(2, 1, HQ, D, seed=4, dtype=torch.bfloat16)
    out = fattn.triton.attention_with_kvcache(q.to(DEVICE), k_cache.to(DEVICE),
                                              v_cache.to(DEVICE), cache_seqlens=50,
                                              block_table=table.to(DEVICE), causal=True,
                                              num_splits=3)
    ref, _ = reference.attention_with_kvcache(q, k_cache, v_cache, [50, 50], table, causal=True)
    assert out.dtype == torch.bfloat16
    # one bfloat16 rounding of P and of the output: 2^-8 of the largest |v| (~4) each
    assert (out.cpu().double() - ref).abs().max().item() <= 2 * 4 * 2 ** -8


def bad_kvcache_calls():
    q = torch.randn(2, 1, HQ, D)
    k_cache, v_cache, table = make_cache(True, 2, 32, 16, seed=0)
    new = torch.randn(2, 1, HKV, D)
    lens = torch.tensor([3, 5], dtype=torch.int32)
    full = torch.tensor([3, 32], dtype=torch.int32)
    bad_table = table.clone()
    bad_table[1, 0] = 99
    return (k_cache, v_cache), [
        (dict(q=q, k=new, v=new, cache_seqlens=full, block_table=table),
         r"cache_seqlens\[1\] \+ k_new.size\(2\) = 32 \+ 1 = 33 keys exceed the cache's "
         r"capacity of 32 keys per sequence \(block_table.size\(1\) × block_size\)"),
        (dict(q=q, k=new, v=new, cache_seqlens=lens, block_table=bad_table),
         r"block_table\[1\]\[0\] = 99 is outside \[0, 7\) \(k_cache.size\(0\), the cache's "
         r"pages\), and sequence 1 uses that block"),
        (dict(q=q, k=new, v=new, block_table=table),
         "k_new and v_new need cache_seqlens: the position at which to append"),
        (dict(q=q, k=new, v=None, cache_seqlens=lens, block_table=table),
         "k_new and v_new must be given together"),
        (dict(q=q, k=new, v=new, cache_seqlens=lens.long(), block_table=table),
         "cache_seqlens must be an int or an int32 tensor"),
        (dict(q=q, k=new, v=new, cache_seqlens=lens, block_table=table.long()),
         "block_table must be an int32 tensor"),
        (dict(q=q, k=new[:, :, :1], v=new[:, :, :1], cache_seqlens=lens, block_table=table),
         r"k_new must have shape \(B, Hkv, S_new, D\)"),
        (dict(q=q, k=new, v=new, cache_seqlens=lens, block_table=table.to("meta")),
         "block_table is on meta but q is on cpu"),
        (dict(q=q, k=new, v=new, cache_seqlens=lens, block_table=table, window_size=(-3, 0)),
         "window_left must be >= -1"),
        (dict(q=q, k=new, v=new, cache_seqlens=lens, block_table=table,
              sinks=torch.zeros(HQ + 1)), "sinks must have shape"),
    ]


@pytest.mark.parametrize("index", range(len(bad_kvcache_calls()[1])))
def test_kvcache_bad_input_raises_before_writing(index, monkeypatch):
    from fattn.triton import api
    monkeypatch.setattr(api, "DEVICE_SIDE_CHECKS", ())  # the host's verdict, on every device
    (k_cache, v_cache), calls = bad_kvcache_calls()
    kw, match = calls[index]
    k0, v0 = k_cache.clone(), v_cache.clone()
    with pytest.raises(fattn.triton.ArgumentError, match=match):
        fattn.triton.attention_with_kvcache(k_cache=k_cache, v_cache=v_cache, **kw)
    assert torch.equal(k_cache, k0) and torch.equal(v_cache, v0)


# The checks of a CUDA decode step, run here on CPU tensors: the verdict through
# torch._assert_async (on a CUDA device, a device-side assert at the next synchronisation;
# on the CPU it raises at once), no host read of a device tensor, nothing written.
@pytest.mark.skipif(DEVICE != "cpu", reason="a device-side assert ends the CUDA context")
@pytest.mark.parametrize("index, names", [(0, "cache_seqlens"), (1, "block_table")])
def test_kvcache_device_side_checks(index, names, monkeypatch):
    from fattn.triton import api
    monkeypatch.setattr(api, "DEVICE_SIDE_CHECKS", ("cpu",))
    (k_cache, v_cache), calls = bad_kvcache_calls()
    kw, _ = calls[index]
    k0 = k_cache.clone()
    with pytest.raises(RuntimeError, match=f"every {names} entry"):
        fattn.triton.attention_with_kvcache(k_cache=k_cache, v_cache=v_cache, **kw)
    assert torch.equal(k_cache, k0)


@pytest.mark.skipif(DEVICE != "cpu", reason="a device-side assert ends the CUDA context")
def test_kvcache_device_side_check_of_a_shared_slot(monkeypatch):
    from fattn.triton import api
    monkeypatch.setattr(api, "DEVICE_SIDE_CHECKS", ("cpu",))
    k_cache, v_cache, table = make_cache(True, 2, 32, 16, seed=0)
    table[1, 0] = table[0, 0]
    q, new = torch.randn(2, 1, HQ, D), torch.randn(2, 2, HKV, D)
    k0 = k_cache.clone()
    with pytest.raises(RuntimeError, match=re.escape(api._APPEND_RULE)):
        fattn.triton.attention_with_kvcache(q, k_cache, v_cache, new, new,
                                            cache_seqlens=int32([3, 2]), block_table=table)
    assert torch.equal(k_cache, k0)


def _cache_argument_errors():
    """Calls with one bad cache index each, as (name, call(api), where api is fattn or
    fattn.triton): the same arguments through FlashAttention's functions on the CPU (fattn's
    C++ checks) and through fattn.triton's (its own host checks)."""
    k_cache, v_cache, table = make_cache(True, 2, 32, 16, seed=0)
    flat_k, flat_v, _ = make_cache(False, 2, 32, 16, seed=0)
    q, new = torch.randn(2, 1, HQ, D), torch.randn(2, 1, HKV, D)
    lens = int32([3, 5])
    bad_table = table.clone()
    bad_table[1, 0] = 99

    def kvcache(kc, vc, **kw):
        def call(api):
            run = (api.flash_attn_with_kvcache if api is fattn
                   else fattn.triton.attention_with_kvcache)
            return run(q, kc.clone(), vc.clone(), **kw)
        return call

    shared = table.clone()
    shared[1, 0] = table[0, 0]  # both sequences' first page: appends at slots 3-4 and 2-3
    two = torch.randn(2, 2, HKV, D)
    strided = torch.stack([table, table], dim=2)[:, :, 0]  # the table's values, stride(1) 2

    cu_q = int32([0, 1, 2])
    qv = torch.randn(2, HQ, D)

    def varlen(**kw):
        # The operator's page layout for the operator and fattn.triton's function.
        args = (qv, k_cache.transpose(1, 2), v_cache.transpose(1, 2), cu_q,
                kw.get("cu_seqlens_k"), kw.get("seqused_k"), kw["block_table"])

        def call(api):
            if api is not fattn:
                return fattn.triton.attention_varlen_kvcache(*args)
            if kw.get("cu_seqlens_k") is None and kw.get("seqused_k") is None:
                # FlashAttention's function takes no call without cu_seqlens_k (a TypeError
                # before any kernel); the CPU operator's check is the one to compare.
                return torch.ops.fattn.attention_varlen_kvcache(*args)
            return fattn.flash_attn_varlen_func(qv, k_cache, v_cache, cu_q, kw.get(
                "cu_seqlens_k"), 1, 64, seqused_k=kw.get("seqused_k"),
                block_table=kw["block_table"])
        return call

    return [
        ("appended past the pages",
         kvcache(k_cache, v_cache, k=new, v=new, block_table=table, cache_seqlens=int32([3, 32]))),
        ("appended past the cache",
         kvcache(flat_k, flat_v, k=new, v=new, cache_seqlens=int32([32, 3]))),
        ("negative length", kvcache(flat_k, flat_v, cache_seqlens=int32([3, -2]))),
        ("page out of range",
         kvcache(k_cache, v_cache, k=new, v=new, cache_seqlens=lens, block_table=bad_table)),
        ("varlen page out of range", varlen(seqused_k=lens, block_table=bad_table)),
        ("seqused_k past the pages", varlen(seqused_k=int32([3, 33]), block_table=table)),
        ("cu_seqlens_k past the pages", varlen(cu_seqlens_k=int32([0, 3, 36]), block_table=table)),
        ("paged varlen without key lengths", varlen(block_table=table)),
        ("two appends to one slot",
         kvcache(k_cache, v_cache, k=two, v=two, block_table=shared, cache_seqlens=int32([3, 2]))),
        ("a table's rows not contiguous",
         kvcache(k_cache, v_cache, block_table=strided, cache_seqlens=lens)),
        ("a paged varlen table's rows not contiguous", varlen(seqused_k=lens, block_table=strided)),
        ("append without cache_seqlens",
         kvcache(k_cache, v_cache, k=new, v=new, block_table=table)),
        ("pages not a multiple of 16 keys",
         kvcache(k_cache[:, :8], v_cache[:, :8], block_table=table, cache_seqlens=lens)),
        ("a table per sequence",
         kvcache(k_cache, v_cache, block_table=table[:1], cache_seqlens=lens)),
        ("a cache row per sequence", kvcache(flat_k[:1], flat_v[:1], cache_seqlens=lens)),
        ("query heads a multiple of kv heads",
         kvcache(k_cache[:, :, :1].expand(-1, -1, 3, -1), v_cache[:, :, :1].expand(-1, -1, 3, -1),
                 block_table=table, cache_seqlens=lens)),
        ("one head dim", kvcache(k_cache[..., :16], v_cache[..., :16], block_table=table,
                                 cache_seqlens=lens)),
        ("a varlen table per sequence", varlen(seqused_k=lens, block_table=table[:1])),
        ("a negative softcap", kvcache(k_cache, v_cache, block_table=table, cache_seqlens=lens,
                                       softcap=-1.0)),
    ]


@pytest.mark.parametrize("index", range(len(_cache_argument_errors())))
def test_cache_index_errors_read_the_same_on_every_device(index, monkeypatch):
    """A bad cache index is worded as fattn's C++ checks word it, whichever kernels run."""
    from fattn.triton import api
    monkeypatch.setattr(api, "DEVICE_SIDE_CHECKS", ())  # the host's verdict, which names the entry
    name, call = _cache_argument_errors()[index]
    with pytest.raises(RuntimeError) as cpu:
        call(fattn)
    with pytest.raises(fattn.triton.ArgumentError) as gpu:
        call(fattn.triton)
    cpu_words = str(cpu.value).split("\n")[0].removeprefix("fattn: ")
    gpu_words = str(gpu.value).split(": ", 1)[1]
    assert gpu_words == cpu_words, name


def test_device_side_rules_are_the_cuda_kernels():
    """The rules a device-side check states on CUDA read as the CUDA decode kernel's own."""
    from fattn.triton import api
    source = os.path.join(os.path.dirname(__file__), "..", "..", "src", "cuda", "decode.cuh")
    if not os.path.exists(source):
        pytest.skip("fattn's source tree is not here")
    text = open(source).read()
    # each require(condition, "..." "..."): its message, the literal's pieces joined
    messages = [re.findall(r'"((?:[^"\\]|\\.)*)"', call)
                for call in re.findall(r"require\((.*?)\);[ \t]*\n", text, re.S)]
    kernel_rules = ["".join(pieces).removeprefix("fattn: ") for pieces in messages]
    assert api._LENGTH_RULES["cache_seqlens"] in kernel_rules
    assert api._table_rule("k_cache") in kernel_rules
    assert api._APPEND_RULE in kernel_rules


@pytest.mark.skipif(DEVICE != "cpu", reason="checked on CPU tensors")
def test_kvcache_device_side_checks_read_nothing_on_the_host(monkeypatch):
    from fattn.triton import api
    monkeypatch.setattr(api, "DEVICE_SIDE_CHECKS", ("cpu",))
    _, _, table = make_cache(True, 2, 32, 16, seed=0)
    lens = torch.tensor([3, 5], dtype=torch.int32)

    def host_read(*args, **kwargs):
        raise AssertionError("a host read of a device tensor")
    for name in ("tolist", "item", "__bool__", "nonzero", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, host_read)
    api._check_cache_indices("attention_with_kvcache", lens, 1, 32, table, 7, 16)
    monkeypatch.undo()
    monkeypatch.setattr(api, "DEVICE_SIDE_CHECKS", ())
    with pytest.raises(AssertionError):  # the host path does read: the patch would see it
        for name in ("tolist", "__bool__"):
            monkeypatch.setattr(torch.Tensor, name, host_read)
        api._check_cache_indices("attention_with_kvcache", lens, 1, 32, table, 7, 16)


# --- varlen -----------------------------------------------------------------------------
VARLEN_CASES = [  # (q lengths, k lengths, variant)
    ([5, 0, 17, 3], [9, 4, 17, 0], "plain"),
    ([5, 0, 17, 3], [9, 4, 17, 0], "causal"),
    ([1, 33, 2], [40, 33, 1], "everything"),
    ([20, 7], [7, 20], "window_both"),
]


@pytest.mark.parametrize("case", VARLEN_CASES, ids=lambda c: c[2] + "-" + "-".join(map(str, c[0])))
def test_varlen_against_definition(case):
    lq, lk, name = case
    cu_q = torch.tensor([0] + torch.tensor(lq).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(lk).cumsum(0).tolist(), dtype=torch.int32)
    q = randn(sum(lq), HQ, D, seed=1)
    k = randn(sum(lk), HKV, D, seed=2)
    v = randn(sum(lk), HKV, D, seed=3)
    kw = variants(name, len(lq))
    out, lse = fattn.triton.attention_varlen(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE),
                                             cu_q.to(DEVICE), cu_k.to(DEVICE), max(lq), max(lk),
                                             return_lse=True, **TILES_16, **on_device(kw))
    assert out.shape == q.shape and lse.shape == (HQ, sum(lq))
    ref, ref_lse = reference.attention_varlen(q, k, v, cu_q, cu_k, **kw)
    assert_matches(out, lse, ref, ref_lse)


TILES_16 = dict(block_m=16, block_n=16)


@pytest.mark.parametrize("cu_q,cu_k,match", [
    ([0, 3, 2], [0, 2, 4], "cu_seqlens_q must be non-decreasing"),
    ([1, 3, 5], [0, 2, 4], r"cu_seqlens_q\[0\] must be 0"),
    ([0, 3, 4], [0, 2, 4], r"cu_seqlens_q\[-1\] must equal the packed rows 5"),
    ([0, 3, 5], [0, 4], "cu_seqlens_k must have 3 entries"),
])
def test_varlen_bad_offsets(cu_q, cu_k, match):
    q, k = torch.randn(5, HQ, D), torch.randn(4, HKV, D)
    with pytest.raises(fattn.triton.ArgumentError, match=match):
        fattn.triton.attention_varlen(q, k, k, torch.tensor(cu_q, dtype=torch.int32),
                                      torch.tensor(cu_k, dtype=torch.int32))


def test_varlen_max_seqlen_below_the_longest():
    q, k = torch.randn(5, HQ, D), torch.randn(4, HKV, D)
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    with pytest.raises(fattn.triton.ArgumentError, match="max_seqlen_q = 2 is less than"):
        fattn.triton.attention_varlen(q, k, k, cu, torch.tensor([0, 2, 4], dtype=torch.int32),
                                      2, 4)
