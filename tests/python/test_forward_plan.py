"""fattn.forward_plan: what the CPU operator runs for a call, the decode kernel's plan included."""
import pytest
import torch

import fattn


def tensors(b, hq, hkv, sq, sk, d, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, hq, sq, d, generator=g).to(dtype)
    k = torch.randn(b, hkv, sk, d, generator=g).to(dtype)
    return q, k, torch.randn(b, hkv, sk, d, generator=g).to(dtype)


def test_decode_plan_of_a_decode_step():
    q, k, v = tensors(2, 32, 8, 1, 4096, 128)
    plan = fattn.forward_plan(q, k, v, is_causal=True, causal_bottom_right=True)
    assert plan["impl"] == "decode"
    d = plan["decode"]
    assert d["rows"] == 4 and d["reads_in_place"]
    groups = -(-8 // d["heads_per_item"])
    assert d["items"] == 2 * groups * d["splits"]
    assert d["scores"] in d["reason"]
    assert d["prefetch_tiles"] == 1 and "1 key tile ahead" in d["reason"]
    # The level the core was probed for (fattn::decode_prefetch_level_choice).
    assert d["prefetch_level"] in (1, 2)
    assert ("into L2 (PREFETCHT1" if d["prefetch_level"] == 2 else "into L1 (PREFETCHT0") in d["reason"]
    if plan["isa"] in ("avx512", "avx2"):
        assert d["scores"].endswith("direct")
    asked = fattn.forward_plan(q, k, v, True, True, "decode", kv_splits=3)["decode"]
    assert asked["splits"] == 3 and "as asked" in asked["reason"]


def test_no_decode_plan_for_a_prefill_and_errors_named():
    q, k, v = tensors(1, 4, 4, 256, 256, 64)
    plan = fattn.forward_plan(q, k, v, is_causal=True)
    assert plan["impl"] == "fused" and plan["decode"] is None
    with pytest.raises(RuntimeError, match="impl must be one of auto, reference, naive, fused, decode"):
        fattn.forward_plan(q, k, v, impl="fast")
