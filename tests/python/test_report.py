"""The report generator (report/, python -m report) and fattn.launches."""
import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from report import document, fmt, model_section, roofline, sources  # noqa: E402

COMMITTED = REPO / "results" / "report"


@pytest.fixture
def results_dir(tmp_path):
    """A copy of the committed results, free to be broken by a test."""
    target = tmp_path / "results"
    shutil.copytree(COMMITTED, target, ignore=shutil.ignore_patterns("*.png", "*.csv"))
    return target


def test_number_formats():
    assert fmt.num(1234.5) == "1234"
    assert fmt.num(0.3) == "0.300"
    assert fmt.num(31.03) == "31.0"
    assert fmt.num(0) == "0"
    assert fmt.integer(2097152) == "2 097 152"
    assert fmt.size(1 << 20) == "1.0 MiB"
    assert fmt.size(512) == "512 B"
    assert fmt.ratio(1.234) == "1.23×"
    assert fmt.plain(1.0) == "1"
    assert fmt.plain(2.5) == "2.5"


def test_roofline_arithmetic():
    machine = {"fma_peak_gflops": 200.0, "bandwidth_gbs": 25.0}
    assert roofline.ridge(200.0, 25.0) == 8.0
    assert roofline.attainable(2.0, 200.0, 25.0) == 50.0
    assert roofline.attainable(100.0, 200.0, 25.0) == 200.0
    assert roofline.bound(0.3, machine) == "memory"
    assert roofline.bound(32.0, machine) == "compute"


def test_model_limits_from_the_table():
    bench = json.loads((COMMITTED / "fattn-bench.json").read_text())
    model = bench["model"]
    # 7 passes over the scores; naive AI → 4·D / (7·e): 4·64 / 28 for fp32
    assert model_section.score_passes(model, "float32", 4096) == 7
    assert model_section.naive_limit(model, "float32") == pytest.approx(256 / 28)
    assert model_section.naive_limit(model, "16-bit") == pytest.approx(256 / 14)
    # fused fp32 at S = 128: 4·128²·64 / (4·4·128·64) = 32
    assert model_section.row(model, "float32", 128, "fused")["ai_matmul_only"] == 32


def test_ridge_against_the_unfused_limit():
    model = json.loads((COMMITTED / "fattn-bench.json").read_text())["model"]
    # limit 4·64 / (7·4) = 9.14 for fp32
    assert "right of the ridge" in model_section.machine_note(model, "float32", 5.0)
    assert "left of the ridge" in model_section.machine_note(model, "float32", 20.0)


def test_generates_every_section(results_dir, tmp_path):
    shutil.rmtree(results_dir / "gpu", ignore_errors=True)  # the GPU section's absent case
    out = tmp_path / "out"
    path = document.write(sources.load(results_dir), out)
    text = path.read_text()
    for heading in ("## 1. Arithmetic intensity", "## 2. Profiler evidence", "## 3. Analysis",
                    "## 4. Plots"):
        assert heading in text
    assert "| float32 | 128 |" in text  # the AI table
    assert "No GPU evidence is committed yet" in text
    for png in ("roofline_cpu.png", "time_vs_s.png", "memory_vs_s.png", "launch_counts.png"):
        assert (out / "figures" / png).stat().st_size > 10_000


def test_numbers_come_from_the_data(results_dir, tmp_path):
    bench_path = results_dir / "fattn-bench.json"
    bench = json.loads(bench_path.read_text())
    bench["machine"]["fma_peak_gflops"] = 1000.0
    bench["machine"]["roofline"].pop("amx", None)  # the FMA peak is then the kernels' roof
    bench["machine"]["bandwidth_gbs"] = 8.0
    bench_path.write_text(json.dumps(bench))
    text = document.write(sources.load(results_dir), tmp_path / "out").read_text()
    assert "1000 GFLOP/s / 8.00 GB/s = **125 FLOP/byte**" in text


def test_read_bandwidth_beside_the_triad(results_dir, tmp_path):
    bench_path = results_dir / "fattn-bench.json"
    bench = json.loads(bench_path.read_text())
    machine = bench["machine"]
    # A file from before fattn-bench measured the read-only stream: the report says so.
    read_keys = ("read_bandwidth_gbs", "read_bandwidth_one_thread_gbs",
                 "read_bandwidth_buffer_mib", "read_bandwidth_isa")
    for key in read_keys:
        machine.pop(key, None)
    bench_path.write_text(json.dumps(bench))
    text = document.write(sources.load(results_dir), tmp_path / "before").read_text()
    assert "DRAM read bandwidth" in text and "not measured in this run" in text
    machine.update(zip(read_keys, (41.3, 30.5, 1024.0, "avx512")))
    machine["bandwidth_gbs"] = 36.0
    bench_path.write_text(json.dumps(bench))
    text = document.write(sources.load(results_dir), tmp_path / "after").read_text()
    assert ("41.3 GB/s on all 2 threads, 30.5 GB/s on one, summing floats in avx512 vectors "
            "over 1.0 GiB; the triad beside it: 36.0 GB/s") in text
    assert "not measured in this run" not in text


def test_amx_kernels_take_the_amx_roof(results_dir, tmp_path):
    bench_path = results_dir / "fattn-bench.json"
    bench = json.loads(bench_path.read_text())
    machine = bench["machine"]
    machine["isa"], machine["bandwidth_gbs"] = "amx", 10.0
    machine["roofline"]["amx"] = {"bf16_gflops": 6000.0, "fp32_split_gflops": 1000.0,
                                  "partial_products": 6}
    assert roofline.peak(machine) == 1000.0
    assert roofline.bound(90.0, machine) == "memory"  # ridge 100, not the FMA peak's
    bench_path.write_text(json.dumps(bench))
    text = document.write(sources.load(results_dir), tmp_path / "out").read_text()
    assert "1000 GFLOP/s / 10.0 GB/s = **100 FLOP/byte**" in text
    assert "| amx float32 (3-part split) | 1000 |" in text
    assert "| amx bfloat16 tiles | 6000 |" in text
    # The FMA kernels keep the FMA peak even where the AMX one was measured.
    machine["isa"] = "avx512"
    assert roofline.peak(machine) == machine["fma_peak_gflops"]


def test_gpu_evidence_when_present(results_dir, tmp_path):
    from report import gpu_section
    gpu = fresh_gpu_dir(results_dir)
    (gpu / "ncu_raw.csv").write_text(
        f'"{gpu_section.NCU_KERNEL}","{gpu_section.NCU_MEMORY}","{gpu_section.NCU_SM}"\n'
        '"","%","%"\n"fused_fma_d64","41.5","77.2"\n"fused_fma_d64","40.9","77.0"\n')
    shape = {"suite": "b2h8", "dtype": "float32", "B": 2, "Hq": 8, "D": 64,
             "causal": False, "Sq": 1024, "gflops": 100.0}
    (gpu / "bench.json").write_text(json.dumps({
        "machine": {"device": "NVIDIA H100", "date": "2026-01-01T00:00:00Z"},
        "results": [{**shape, "impl": "naive", "ms_median": 3.0},
                    {**shape, "impl": "fused", "ms_median": 1.5}]}))
    text = document.write(sources.load(results_dir), tmp_path / "out").read_text()
    assert "No GPU evidence" not in text
    assert "| fused_fma_d64 | 41.5 | 77.2 |" in text
    assert "| fused_fma_d64 | 2 |" in text  # launches per kernel
    assert "| float32 | 2 | 8 | 64 | no | 1024 | 3.00 | 1.50 | 2.00× | 0.100 |" in text
    assert "fattn vs PyTorch SDPA" not in text  # no bench_cuda_*.json
    assert "Not evaluated: no bench_cuda_b2h8.json." in text


def fresh_gpu_dir(results_dir):
    """An empty results/gpu/, whether or not GPU evidence is committed."""
    gpu = results_dir / "gpu"
    shutil.rmtree(gpu, ignore_errors=True)
    gpu.mkdir()
    return gpu


def torch_row(impl, ms, *, dtype="float32", B=2, Hq=8, Sq=4096, D=64, causal=False, err=1e-6,
              peak=None, skipped=None):
    """A bench_cuda_*.json row (python -m fattn.bench_cuda); ms=None: skipped."""
    row = {"impl": impl, "suite": "b2h8", "dtype": dtype, "B": B, "Hq": Hq, "Hkv": Hq,
           "Sq": Sq, "Sk": Sq, "D": D, "causal": causal, "skipped": skipped}
    if ms is None:
        row["skipped"] = skipped or "not available"
        return row
    flops = 4 * B * Hq * Sq * Sq * D / (2 if causal else 1)
    return {**row, "ms_median": ms, "tflops": flops / (ms * 1e-3) / 1e12, "max_abs_err": err,
            "peak_extra_bytes": peak if peak is not None else B * Hq * Sq * 256}


def bench_row(impl, ms, *, dtype="float16", suite="flash", B=4, Hq=16, Sq=4096, D=128,
              causal=False, gflops=None):
    """A bench.json row (gpu/gpu_bench.cu)."""
    flops = 4 * B * Hq * Sq * Sq * D / (2 if causal else 1)
    return {"impl": impl, "kernel": impl, "dtype": dtype, "suite": suite, "B": B, "Hq": Hq,
            "Hkv": Hq, "Sq": Sq, "Sk": Sq, "D": D, "causal": causal, "ms_median": ms,
            "gflops": gflops if gflops is not None else flops / (ms * 1e-3) / 1e9,
            "max_abs_err": 1e-5, "extra_bytes": 0}


GPU_MACHINE = {"device": "NVIDIA H100", "driver": "580", "torch_version": "2.11.0",
               "cuda": "13.0", "date": "2026-01-01T00:00:00Z"}


def test_gpu_sdpa_table_with_a_skipped_backend(results_dir, tmp_path):
    gpu = fresh_gpu_dir(results_dir)
    shape = {"dtype": "float16", "Sq": 1024}
    (gpu / "bench_cuda_flash.json").write_text(json.dumps({
        "machine": {**GPU_MACHINE, "note": "merged from two runs"},
        "results": [torch_row("fattn_naive", 4.0, peak=64 << 20, **shape),
                    torch_row("fattn_fused", 1.0, peak=2 << 20, **shape),
                    torch_row("fattn_fused_tf32", None, skipped="float32 only", **shape),
                    torch_row("sdpa_flash", 1.5, **shape),
                    torch_row("sdpa_efficient", 3.0, **shape),
                    torch_row("sdpa_cudnn", None, skipped="out of memory", **shape),
                    torch_row("sdpa_math", 8.0, **shape)]}))
    text = document.write(sources.load(results_dir), tmp_path / "out").read_text()
    assert "No GPU evidence" not in text
    assert "fattn vs PyTorch SDPA on the GPU (`bench_cuda_flash.json`)" in text
    assert ("`bench_cuda_flash.json`: NVIDIA H100, driver 580, torch 2.11.0, "
            "2026-01-01T00:00:00Z. Note: merged from two runs") in text
    # 4·2·8·1024²·64 FLOP in 1 ms = 4.29 TFLOP/s; flash is the best SDPA backend (1.5 ms);
    # cuDNN skipped; no fused_tf32 column for float16
    assert ("| 2 | 8 | 1024 | 64 | no | 4.29 | flash 2.86 | 1.50× | 3.00× | – | 64.0 | 2.00 |"
            in text)
    assert "Skipped (–): sdpa_cudnn at every shape (out of memory)." in text
    # bench.json and bench_cuda_b2h8.json absent: those bars are not evaluated
    assert "Not evaluated: no bench.json." in text
    assert "Not evaluated: no bench_cuda_b2h8.json." in text


def test_gpu_sdpa_table_float32_has_the_tf32_column():
    from report import gpu_section
    shape = {"Sq": 512}
    results = [torch_row("fattn_fused", 2.0, **shape), torch_row("fattn_fused_tf32", 1.0, **shape),
               torch_row("sdpa_flash", None, **shape), torch_row("sdpa_efficient", 3.0, **shape),
               torch_row("sdpa_cudnn", None, **shape), torch_row("fattn_naive", None, **shape)]
    text = gpu_section.sdpa_table(results, "b2h8", "float32")
    assert "| fused TFLOP/s | fused_tf32 TFLOP/s | best SDPA, TFLOP/s |" in text
    # 4·2·8·512²·64 FLOP = 1.07 GFLOP: 0.537 TFLOP/s in 2 ms; naive skipped: '–'
    assert ("| 2 | 8 | 512 | 64 | no | 0.537 | 1.07 | efficient 0.358 | – | 1.50× | – | – "
            "| 2.00 |") in text


def test_gpu_goal_fp32_met_and_not_met():
    from report import gpu_section
    results = []
    for causal in (False, True):
        results += [torch_row("fattn_fused", 1.0, causal=causal),
                    torch_row("fattn_fused_tf32", 0.5, causal=causal, err=2e-3),
                    torch_row("sdpa_efficient", 2.5, causal=causal),
                    torch_row("fattn_fused", 9.0, Sq=1024, causal=causal)]  # another shape
    text = "\n".join(gpu_section.goal_fp32({"machine": GPU_MACHINE, "results": results}))
    # fused: 2.5× and error 1e-6, met; TF32: 5× but error 2e-3, not met
    assert "| fattn_fused | 3xTF32, the default | no | 1.00 | 2.50 | 2.50× | 1.0e-06 | met |" \
        in text
    assert "| 5.00× | 2.0e-03 | not met |" in text
    assert ("2x SDPA float32 target: fattn_fused **met** (2 of 2); fattn_fused_tf32 **not met** "
            "(0 of 2).") in text
    slow = [dict(r, ms_median=2.0) if r["impl"] == "fattn_fused" else r for r in results]
    text = "\n".join(gpu_section.goal_fp32({"results": slow}))
    assert "fattn_fused **not met** (0 of 2)" in text
    assert "Not evaluated" in "\n".join(gpu_section.goal_fp32(None))


def test_gpu_goal_tflops_met_and_not_met():
    from report import gpu_section
    rows = [bench_row("fused", 1.0, Sq=4096, gflops=310_000),
            bench_row("fused", 1.0, Sq=8192, B=2, dtype="bfloat16", gflops=320_000),
            bench_row("fused", 1.0, Sq=2048, gflops=100.0),                 # S below 4096
            bench_row("fused", 1.0, causal=True, gflops=100.0),             # causal
            bench_row("fused", 1.0, D=64, gflops=100.0),                    # D = 64
            bench_row("fused", 1.0, dtype="float32", gflops=100.0),         # fp32
            bench_row("fused", 1.0, suite="b2h8", gflops=100.0)]            # not the sweep
    text = "\n".join(gpu_section.goal_tflops({"results": rows}))
    assert "| float16 | 4 | 16 | 4096 | 310 | met |" in text
    assert ("300 TFLOP/s target: **met** — 2 of 2 shapes reach 300 TFLOP/s; the best is "
            "320 TFLOP/s") in text
    rows.append(bench_row("fused", 1.0, Sq=16384, B=1, gflops=250_000))
    text = "\n".join(gpu_section.goal_tflops({"results": rows}))
    assert "| float16 | 1 | 16 | 16384 | 250 | not met |" in text
    assert "300 TFLOP/s target: **not met** — 2 of 3 shapes" in text
    assert "Not evaluated: no bench.json." in "\n".join(gpu_section.goal_tflops(None))


def test_gpu_goal_fused_vs_naive():
    from report import gpu_section
    rows = [bench_row("naive", 4.0, Sq=512), bench_row("fused", 1.0, Sq=512),
            bench_row("naive", 9.0, Sq=1024), bench_row("fused", 3.0, Sq=1024),
            bench_row("naive", 0.1, Sq=128), bench_row("fused", 1.0, Sq=128)]  # below 512
    torch_docs = {"bench_cuda_b2h8.json": {"results": [
        torch_row(impl, 1.0, Sq=s, peak=s * (256 if impl == "fattn_fused" else s * 4))
        for s in (512, 1024, 4096) for impl in ("fattn_fused", "fattn_naive")]}}
    text = "\n".join(gpu_section.goal_fused_vs_naive({"results": rows}, torch_docs))
    assert ("Time (bench.json): **met** — fused is faster at 2 of the 2 shapes with S ≥ 512 "
            "that both ran; the smallest naive / fused time ratio is 3.00×") in text
    # fused grows as S (k = 1), naive as S² (k = 2)
    assert "| 512–4096 | 4096 | 1.00 | 64.0 | 64.00× | 1.0 | 2.0 |" in text
    assert "Memory (peak allocated during one call, bench_cuda_*.json): **met**" in text
    rows.append(bench_row("naive", 1.0, Sq=2048))
    rows.append(bench_row("fused", 2.0, Sq=2048))
    quadratic = {"f.json": {"results": [torch_row(impl, 1.0, Sq=s, peak=s * s)
                                        for s in (512, 4096)
                                        for impl in ("fattn_fused", "fattn_naive")]}}
    text = "\n".join(gpu_section.goal_fused_vs_naive({"results": rows}, quadratic))
    assert "Time (bench.json): **not met** — fused is faster at 2 of the 3 shapes" in text
    assert "ratio is 0.50× (float16, suite flash, B = 4, H = 16, D = 128, non-causal, " \
        "S = 2048)" in text
    assert "bench_cuda_*.json): **not met**" in text
    text = "\n".join(gpu_section.goal_fused_vs_naive(None, {}))
    assert "Time: not evaluated, no bench.json." in text
    assert "Memory: not evaluated" in text


def test_gpu_query_tile_table():
    from report import gpu_section
    br64, br128 = gpu_section.TILE_IMPLS[64], gpu_section.TILE_IMPLS[128]
    rows = [bench_row(br64, 2.0, Sq=4096), bench_row(br128, 1.0, Sq=4096),
            bench_row("fused", 1.0, Sq=4096),
            bench_row(br64, 1.0, Sq=512), bench_row(br128, 2.0, Sq=512),
            bench_row(br64, 1.0, Sq=512, dtype="bfloat16"),
            bench_row(br128, 2.0, Sq=512, dtype="bfloat16")]
    text = gpu_section.tile_table({"results": rows})
    assert "| flash | 4 | 16 | 128 | no | 4096 | 275 | 550 | 2.00× | 550 |" in text
    assert "| flash | 4 | 16 | 128 | no | 512 | 8.59 | 4.29 | 0.50× | – |" in text  # no fused
    assert "float16: the 128-row tile is faster at 1 of 2 shapes, the 64-row tile at 1." in text


def test_gpu_wgmma_table():
    from report import gpu_section
    rows = [bench_row("fused", 2.0, Sq=4096), bench_row("fused_wgmma", 1.0, Sq=4096),
            bench_row("fused_wgmma_pipelined", 0.5, Sq=4096),
            bench_row("fused", 1.0, Sq=512), bench_row("fused_wgmma", 2.0, Sq=512),
            bench_row("fused_wgmma_pipelined", 4.0, Sq=512),
            bench_row("fused_wgmma", 1.0, Sq=1024)]  # no fused, no pipelined row
    rows[2]["max_abs_err"] = 3e-4
    text = gpu_section.wgmma_table({"results": rows})
    assert "| flash | float16 | 4 | 16 | 128 | no | 4096 | 275 | 550 | 1100 | 4.00× | 3.0e-04 |" \
        in text
    assert "| flash | float16 | 4 | 16 | 128 | no | 1024 | – | 34.4 | – | – | 1.0e-05 |" in text
    assert ("The faster wgmma schedule beats the dispatched kernel at 1 of 3 shapes; the "
            "pipelined schedule is the faster one at 1 of the 2 shapes that ran both.") in text
    assert "no shape was run by the wgmma kernels" in gpu_section.wgmma_table(
        {"results": [rows[0], rows[3]]})


def test_gpu_bench_cuda_without_results_is_a_clear_error(results_dir):
    gpu = fresh_gpu_dir(results_dir)
    (gpu / "bench_cuda_b2h8.json").write_text(json.dumps(
        {"machine": GPU_MACHINE, "results": [{"impl": "fattn_fused"}]}))
    with pytest.raises(sources.ReportInputError, match=r"results\[0\] lacks 'suite'"):
        sources.load(results_dir)


@pytest.mark.skipif(not (COMMITTED / "gpu" / "bench.json").is_file(),
                    reason="no GPU evidence committed")
def test_gpu_section_from_the_committed_evidence(results_dir, tmp_path):
    text = document.write(sources.load(results_dir), tmp_path / "out").read_text()
    for said in ("300 TFLOP/s target: **", "2x SDPA float32 target: fattn_fused **",
                 "Time (bench.json): **",
                 "#### 128-row vs 64-row query tiles"):
        assert said in text


def test_missing_file_is_a_clear_error(results_dir):
    (results_dir / "launches.json").unlink()
    with pytest.raises(sources.ReportInputError, match="launches.json: no such file"):
        sources.load(results_dir)


def test_missing_key_is_a_clear_error(results_dir):
    path = results_dir / "fattn-bench.json"
    bench = json.loads(path.read_text())
    del bench["results"][0]["ai_model"]
    path.write_text(json.dumps(bench))
    with pytest.raises(sources.ReportInputError, match=r"results\[0\] lacks 'ai_model'"):
        sources.load(results_dir)


def test_quick_run_without_roofline_is_refused(results_dir):
    path = results_dir / "fattn-bench.json"
    bench = json.loads(path.read_text())
    del bench["machine"]["roofline"]["fma_peaks"]
    path.write_text(json.dumps(bench))
    with pytest.raises(sources.ReportInputError, match="without --quick"):
        sources.load(results_dir)


def test_command_line_exit_codes(results_dir, tmp_path, capsys):
    from report.__main__ import main
    assert main(["--results", str(results_dir), "--out", str(tmp_path / "out")]) == 0
    assert main(["--results", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")]) == 2
    assert "no such file" in capsys.readouterr().err


def fake_event(name, children=(), shapes=((4, 4),)):
    return SimpleNamespace(name=name, cpu_children=list(children), input_shapes=list(shapes),
                           cpu_parent=None, device_type="DeviceType.CPU")


def test_compute_operators_skip_views_and_scalars():
    from fattn import launches
    copy = fake_event("aten::copy_", shapes=((), ()))
    mul = fake_event("aten::mul_", [fake_event("aten::to", [copy], shapes=((),))])
    bmm = fake_event("aten::bmm", [fake_event("aten::resolve_conj")])
    matmul = fake_event("aten::matmul", [fake_event("aten::expand"), bmm])
    bmm.cpu_parent = matmul
    events = [matmul, bmm, mul, copy]
    counts = launches.count_events(events, "cpu")
    assert counts["compute_op_names"] == {"aten::bmm": 1, "aten::mul_": 1}


def test_profiled_counts_standard_vs_fused():
    from fattn import launches
    standard = launches.measure("torch_standard", 1, 2, 32, 16, False, "cpu")
    fused = launches.measure("fattn_fused", 1, 2, 32, 16, False, "cpu")
    assert standard["compute_op_names"].get("aten::bmm") == 2
    assert standard["compute_ops"] >= 4  # bmm, mul_, _softmax, bmm
    assert fused["compute_ops"] == 1
