"""The JSON results the report is made from, loaded and checked.

  <results>/fattn-bench.json   build/bench/fattn-bench --json: machine (with "roofline":
                               FMA peak per ISA, triad per cache level, hardware-counter
                               probe), results (naive with "stages"), "model"
  <results>/torch/bench.json   python -m fattn.bench: fattn vs torch SDPA vs standard
                               attention, time and memory vs S
  <results>/launches.json      python -m fattn.launches: operator counts (torch.profiler)
  <results>/gpu/               GPU evidence (scripts/gpu-check.sh: bench.json,
                               ncu_raw.csv; python -m fattn.bench_cuda:
                               bench_cuda_b2h8.json, bench_cuda_flash.json);
                               each optional
Missing or malformed inputs raise ReportInputError naming the file and the key.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path


class ReportInputError(ValueError):
    """A results file is missing, or lacks what the report needs."""


@dataclass
class Sources:
    bench_path: Path
    bench: dict
    torch_path: Path
    torch: dict
    launches_path: Path
    launches: dict
    gpu_dir: Path
    gpu_bench: dict | None = None
    gpu_ncu_rows: list[dict] = field(default_factory=list)
    gpu_torch: dict[str, dict] = field(default_factory=dict)  # file name -> bench_cuda JSON


def read_json(path: Path, required: dict[str, list[str]]) -> dict:
    """The JSON object in `path`; `required` maps each top-level key to the keys its
    value (an object, or every object of a list) must have."""
    if not path.is_file():
        raise ReportInputError(f"{path}: no such file (see report/sources.py for what makes it)")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ReportInputError(f"{path}: not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ReportInputError(
            f"{path}: expected a JSON object at the top, got {type(doc).__name__}")
    for key, inner in required.items():
        if key not in doc:
            raise ReportInputError(f"{path}: missing key {key!r}")
        items = doc[key] if isinstance(doc[key], list) else [doc[key]]
        if not items:
            raise ReportInputError(f"{path}: {key!r} is empty")
        for i, item in enumerate(items):
            missing = [k for k in inner if k not in item]
            if missing:
                where = f"{key}[{i}]" if isinstance(doc[key], list) else key
                raise ReportInputError(f"{path}: {where} lacks {', '.join(map(repr, missing))}")
    return doc


BENCH_KEYS = {
    "machine": ["cpu", "isa", "threads", "fma_peak_gflops", "bandwidth_gbs", "date", "roofline",
                "other_processes_cores_ceilings", "other_processes_cores_sweep"],
    "results": ["impl", "Sq", "Sk", "D", "causal", "ms_median", "gflops", "ai_model",
                "flops", "model_bytes", "extra_bytes", "other_processes_cores"],
    "model": ["dtype", "element_bytes", "S", "D", "impl", "stage", "matmul_flops",
              "softmax_flops", "traffic_bytes", "bytes", "ai", "ai_matmul_only"],
}
TORCH_KEYS = {
    "machine": ["cpu", "threads", "date", "torch_version"],
    "results": ["impl", "Sq", "D", "causal", "ms_median", "skipped"],
}
LAUNCH_KEYS = {
    "machine": ["device", "torch_version", "date"],
    "results": ["impl", "S", "causal", "top_level_ops", "compute_ops", "compute_op_names"],
}
ROOFLINE_KEYS = ["fma_peaks", "bandwidth_levels", "hardware_counters", "hardware_counters_detail"]


def load(results_dir: Path) -> Sources:
    bench_path = results_dir / "fattn-bench.json"
    bench = read_json(bench_path, BENCH_KEYS)
    missing = [k for k in ROOFLINE_KEYS if k not in bench["machine"]["roofline"]]
    if missing:
        raise ReportInputError(f"{bench_path}: machine.roofline lacks {', '.join(missing)} "
                               "(run fattn-bench without --quick)")
    if not any(r["impl"] == "naive" and "stages" in r for r in bench["results"]):
        raise ReportInputError(f"{bench_path}: no naive result with 'stages'")
    torch_path = results_dir / "torch" / "bench.json"
    launches_path = results_dir / "launches.json"
    sources = Sources(bench_path, bench, torch_path, read_json(torch_path, TORCH_KEYS),
                      launches_path, read_json(launches_path, LAUNCH_KEYS), results_dir / "gpu")
    load_gpu(sources)
    return sources


# python -m fattn.bench_cuda's output (bench_cuda.json) per suite, as committed under gpu/.
GPU_TORCH_B2H8 = "bench_cuda_b2h8.json"     # --suite b2h8: B=2, H=8, D=64
GPU_TORCH_FLASH = "bench_cuda_flash.json"   # --suite flash: FlashAttention's sweep
GPU_TORCH_FILES = (GPU_TORCH_B2H8, GPU_TORCH_FLASH)
GPU_TORCH_KEYS = {
    "machine": ["device", "date"],
    "results": ["impl", "suite", "dtype", "B", "Hq", "Sq", "D", "causal", "skipped"],
}


def load_gpu(sources: Sources) -> None:
    """GPU evidence, where committed: bench.json and ncu_raw.csv of scripts/gpu-check.sh,
    bench_cuda_*.json of python -m fattn.bench_cuda (fattn vs torch SDPA on the GPU)."""
    bench = sources.gpu_dir / "bench.json"
    if bench.is_file():
        sources.gpu_bench = json.loads(bench.read_text())
    ncu = sources.gpu_dir / "ncu_raw.csv"
    if ncu.is_file():
        with ncu.open(newline="") as f:
            rows = list(csv.DictReader(f))
        sources.gpu_ncu_rows = rows[1:]  # ncu's second line gives the units
    for name in GPU_TORCH_FILES:
        path = sources.gpu_dir / name
        if path.is_file():
            sources.gpu_torch[name] = read_json(path, GPU_TORCH_KEYS)
