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
    bench["machine"]["bandwidth_gbs"] = 8.0
    bench_path.write_text(json.dumps(bench))
    text = document.write(sources.load(results_dir), tmp_path / "out").read_text()
    assert "1000 GFLOP/s / 8.00 GB/s = **125 FLOP/byte**" in text


def test_gpu_evidence_when_present(results_dir, tmp_path):
    from report import gpu_section
    gpu = results_dir / "gpu"
    gpu.mkdir()
    (gpu / "ncu_raw.csv").write_text(
        f'"{gpu_section.NCU_KERNEL}","{gpu_section.NCU_MEMORY}","{gpu_section.NCU_SM}"\n'
        '"","%","%"\n"fused_fma_d64","41.5","77.2"\n"fused_fma_d64","40.9","77.0"\n')
    shape = {"dtype": "float32", "D": 64, "causal": False, "Sq": 1024, "gflops": 100.0}
    (gpu / "bench.json").write_text(json.dumps({
        "machine": {"device": "NVIDIA H100", "date": "2026-01-01T00:00:00Z"},
        "results": [{**shape, "impl": "naive", "ms_median": 3.0},
                    {**shape, "impl": "fused", "ms_median": 1.5}]}))
    text = document.write(sources.load(results_dir), tmp_path / "out").read_text()
    assert "No GPU evidence" not in text
    assert "| fused_fma_d64 | 41.5 | 77.2 |" in text
    assert "| fused_fma_d64 | 2 |" in text  # launches per kernel
    assert "| float32 | 64 | no | 1024 | 3.00 | 1.50 | 2.00× | 100 |" in text


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
