"""python -m fattn.bench --quick: runs, and writes fattn-bench's JSON schema, a CSV and plots."""
import csv
import json
import subprocess
import sys

import pytest

KEYS = {"impl", "dtype", "B", "Hq", "Hkv", "Sq", "Sk", "D", "causal", "ms_median", "ms_min",
        "ms_max", "gflops", "max_abs_err", "extra_bytes"}


def test_bench_quick(tmp_path):
    p = subprocess.run([sys.executable, "-m", "fattn.bench", "--quick", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "fused vs sdpa" in p.stdout
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert {"device", "cpu", "isa", "threads", "date", "fattn_version"} <= set(doc["machine"])
    results = doc["results"]
    assert {r["impl"] for r in results} == {"fattn_fused", "fattn_naive", "torch_sdpa",
                                            "torch_standard"}
    for r in results:
        assert KEYS <= set(r), KEYS - set(r)
        assert r["dtype"] == "float32" and r["ms_median"] > 0 and r["gflops"] > 0
        assert r["ms_min"] <= r["ms_median"] <= r["ms_max"]
        assert r["max_abs_err"] < 1e-5
        assert r["extra_bytes"] is not None and r["extra_bytes"] >= 0
    with open(tmp_path / "bench.csv") as f:
        assert len(list(csv.DictReader(f))) == len(results)
    for png in ("time_vs_s.png", "memory_vs_s.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_train_quick(tmp_path):
    p = subprocess.run([sys.executable, "-m", "fattn.bench", "--pass", "train", "--quick",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "forward + backward" in p.stdout
    results = json.loads((tmp_path / "train.json").read_text())["results"]
    assert {r["impl"] for r in results} == {"fattn_fused", "fattn_naive", "torch_sdpa",
                                            "torch_standard"}
    for r in results:
        assert r["pass"] == "forward+backward" and r["ms_median"] > 0 and r["gflops"] > 0
        assert r["max_abs_err"] < 1e-4  # dq, dk, dv against float64
    for png in ("train_time_vs_s.png", "train_memory_vs_s.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_cuda_smoke_on_cpu(tmp_path):
    # the GPU side-by-side's logic (backends forced one by one, skips with reasons, JSON),
    # run on the CPU so that it cannot rot between GPU sessions
    p = subprocess.run([sys.executable, "-m", "fattn.bench_cuda", "--suite", "quick", "--device",
                        "cpu", "--dtypes", "float32", "--min-reps", "2", "--max-reps", "2",
                        "--budget", "0.01", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads((tmp_path / "bench_cuda.json").read_text())
    assert "not a GPU measurement" in doc["machine"]["device"]
    by_impl = {}
    for r in doc["results"]:
        by_impl.setdefault(r["impl"], []).append(r)
    for impl in ("fattn_fused", "fattn_naive", "sdpa_math"):
        for r in by_impl[impl]:
            assert r["skipped"] is None and r["ms_median"] > 0 and r["max_abs_err"] < 1e-5
    for r in by_impl["sdpa_cudnn"]:  # no cuDNN attention on the CPU: skipped, with a reason
        assert r["skipped"]


def test_bench_variants_quick(tmp_path):
    p = subprocess.run([sys.executable, "-m", "fattn.bench", "--variants", "--quick", "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    results = json.loads((tmp_path / "variants.json").read_text())["results"]
    assert {r["row"] for r in results} == {"mask_all_true", "mask_padding", "softcap", "alibi",
                                           "window", "decode_window"}
    for r in results:
        assert r["fattn_s"] > 0 and r["baseline_s"] > 0 and r["ratio"] > 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bench_model_quick(tmp_path, dtype):
    pytest.importorskip("transformers")
    p = subprocess.run([sys.executable, "-m", "fattn.bench", "--model", "--quick", "--dtype", dtype,
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads((tmp_path / "model.json").read_text())
    assert report["machine"]["model"]["dtype"] == dtype
    assert (tmp_path / "model.png").stat().st_size > 0
    results = report["results"]
    assert {(r["row"], r["batch"]) for r in results} == {
        ("prefill", 1), ("decode", 1), ("decode", 2), ("decode_append", 1), ("decode_append", 2)}
    for r in results:
        assert 0 < r["fattn_attention_s"] < r["fattn_s"] and 0 < r["sdpa_attention_s"] < r["sdpa_s"]


@pytest.mark.parametrize("pass_", ["forward", "train"])
def test_bench_ring_quick(tmp_path, pass_):
    p = subprocess.run([sys.executable, "-m", "fattn.bench", "--ring", "--quick", "--pass", pass_, "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    (row,) = json.loads((tmp_path / "ring.json").read_text())["results"]
    assert row["pass"] == pass_
    assert row["ring_s"] > 0 and row["single_s"] > 0 and row["waited_s"] >= 0
    assert row["rank_qkv_bytes"] * 2 == row["single_qkv_bytes"]  # O(S/P) per rank


def test_bench_ring_memory_budget(tmp_path):
    # Under a budget the quick shapes fit in, both sides run, each capped by RLIMIT_AS, and
    # report their peak resident memory above their start.
    run = lambda budget: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "fattn.bench", "--ring", "--quick", "--memory-budget-gib",
         str(budget), "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    p = run(0.5)
    assert p.returncode == 0, p.stdout + p.stderr
    (row,) = json.loads((tmp_path / "ring.json").read_text())["results"]
    assert row["memory_budget_bytes"] == 2**29
    assert 0 < row["rank_peak_bytes"] < 2**29 and 0 < row["single_peak_bytes"] < 2**29
    assert row["single_s"] > 0
    # A negative budget is refused before any process starts.
    p = run(-1)
    assert p.returncode == 2 and "--memory-budget-gib must be >= 0, got -1" in p.stderr
    # Under a budget of nothing, the ranks' first allocation fails: an error, not a hang.
    p = run(0)
    assert p.returncode != 0 and "can't allocate memory" in p.stdout + p.stderr
