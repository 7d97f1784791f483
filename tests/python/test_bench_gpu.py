"""python -m fattn.bench --gpu --smoke: the GPU side by side's every row, at tiny sizes on the
CPU (Triton under its interpreter, FlexAttention eager), so that the script cannot rot
between GPU sessions. Nothing is timed here: the rows' statuses, errors and JSON are."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

KEYS = {"impl", "variant", "dtype", "B", "Hq", "Hkv", "Sq", "Sk", "D", "ms_median", "max_err",
        "status"}
GPU_ONLY = {"sdpa_flash", "sdpa_cudnn", "sdpa_efficient"}


def test_gpu_bench_smoke_on_cpu(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = subprocess.run([sys.executable, "-m", "fattn.bench", "--gpu", "--smoke", "--device",
                        "cpu", "--out", str(tmp_path), "--backward-tiles",
                        "16,32,4,2/32,16,4,2"], capture_output=True, text=True,
                       timeout=240, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    evidence = json.loads((tmp_path / "evidence.json").read_text())
    assert {"device", "driver", "cuda", "torch", "triton", "date", "fattn", "commit"} <= \
        set(evidence)
    assert "not a GPU measurement" in evidence["device"]
    rows = {}
    for section in ("masked", "forward", "decode", "training"):
        doc = json.loads((tmp_path / f"{section}.json").read_text())
        assert doc["section"] == section and doc["machine"]["torch"] == evidence["torch"]
        rows[section] = doc["rows"]
    # every implementation at every problem has its row
    assert {r["impl"] for r in rows["masked"]} == {"fattn_triton", "fattn_op", "flex"} | GPU_ONLY
    assert {r["mask"] for r in rows["masked"]} == {"causal", "window16", "padding", "softcap30",
                                                   "alibi_sinks_causal"}
    # dtypes x masks x impls, and the score variants x (fattn_triton, fattn_op) in one dtype
    assert len(rows["masked"]) == 2 * 3 * 6 + 2 * 2
    assert len(rows["forward"]) == 4 * 2 * 2 * 4       # shapes x dtypes x causal x impls
    # the copy; Sk x B x (impls + the CUDA-graph row + block_size 16); block_size 256 at 256;
    # the ring depths at one Sk x B
    assert len(rows["decode"]) == 1 + 3 * 2 * 6 + 2 + 3 * 2
    staged = [r for r in rows["decode"] if "decode_stages" in r]
    assert sorted({r["decode_stages"] for r in staged}) == [2, 3, 4]
    assert all(r["status"] == "ok" and r["impl"] == "fattn_op" for r in staged), staged
    graph = [r for r in rows["decode"] if r["variant"].startswith("CUDA graph replay")]
    assert len(graph) == 6 and all(r["status"] == "skipped: needs CUDA" for r in graph)
    paged = [r for r in rows["decode"] if "block_size" in r]
    assert sorted({r["block_size"] for r in paged}) == [16, 256]
    assert all(r["status"] == "ok" and r["max_err"] < 3e-2 for r in paged), paged
    assert all(r["host_ms"] > 0 for r in rows["decode"]
               if r["impl"] == "fattn_op" and "block_size" not in r and "decode_stages" not in r
               and r["status"] == "ok")
    assert len(rows["training"]) == 2 * 2 * 5          # dtypes x causal x (impls + sweep)
    swept = [r for r in rows["training"] if "tiles 16x32 w4 s2 / 32x16 w4 s2" in r["variant"]]
    assert len(swept) == 2 * 2 and all(r["impl"] == "fattn_triton" for r in swept)
    for r in rows["training"]:  # fattn's backward is deterministic; torch's not stated
        assert r["deterministic"] is (True if r["impl"].startswith("fattn") else None), r
    for section, rs in rows.items():
        for r in rs:
            assert KEYS <= set(r), (section, KEYS - set(r))
            status = r["status"]
            assert status == "ok" or status.startswith(("skipped: ", "error: ")), r
            if r["impl"] in GPU_ONLY:  # the peer cannot run on the CPU: said, not attempted
                assert status in ("skipped: needs CUDA",
                                  "skipped: SDPA's flash backend takes no attn_mask"), r
            elif r["impl"] in ("fattn_op", "flex", "torch_copy") and r not in graph:
                assert status == "ok", r
            if status == "ok":
                assert r["ms_median"] > 0
                if r["impl"] != "torch_copy":  # 16-bit outputs against float64
                    assert 0 <= r["max_err"] < 3e-2, r
                assert ("gbps" if section == "decode" else "tflops") in r
            else:
                assert r["ms_median"] is None
    # every fattn row runs: masks, window, KV cache, forward + backward
    for r in rows["forward"] + rows["masked"] + rows["decode"] + rows["training"]:
        if r["impl"] == "fattn_triton":
            assert r["status"] == "ok", r
    assert "wrote" in p.stdout
