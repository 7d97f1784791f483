"""python -m fattn.selftest: the command a user runs to verify their GPU's kernels.

Here on CPU tensors: the Triton kernels under Triton's interpreter at small shapes, the C++
kernels reported skipped, nothing recorded. A kernel made to give wrong results, or
different bits run to run, must fail its cases; the parts only a GPU run reaches (records,
timing) are driven directly.
"""
import io
import json
import os
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():  # conftest.py sets it first; this is for a lone run
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from fattn.dispatch import records  # noqa: E402
from fattn.selftest import environment, suite, timing  # noqa: E402
from fattn.selftest.__main__ import main  # noqa: E402
from fattn.selftest.cases import Case, backward_cases  # noqa: E402
from fattn.selftest.checks import measure  # noqa: E402
from fattn.selftest.definition import definition  # noqa: E402
from fattn.selftest.inputs import Inputs  # noqa: E402
from fattn.selftest.report import record_name, write_records  # noqa: E402
from fattn.selftest.routes import Candidate, plan_kernel  # noqa: E402


def interpreter_or_skip():
    """The in-process runs need the interpreter where there is no GPU."""
    if not torch.cuda.is_available() and environment.interpreter_incompatibility():
        pytest.skip(environment.interpreter_incompatibility())


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """fattn's cache (verification records, machine-code hashes) in a fresh directory."""
    monkeypatch.setenv("FATTN_CACHE_DIR", str(tmp_path / "cache"))
    records.reload()
    yield tmp_path / "cache"
    records.reload()


def test_cpu_run_passes_the_triton_kernels_and_records_nothing(tmp_path):
    """The whole command without a GPU: exit 0, every Triton candidate ran and passed, every
    C++ one skipped for want of a GPU, the report has the rows, no record written."""
    if environment.interpreter_incompatibility():
        pytest.skip(environment.interpreter_incompatibility())
    report_path = tmp_path / "report.json"
    env = dict(os.environ, FATTN_CACHE_DIR=str(tmp_path / "cache"), CUDA_VISIBLE_DEVICES="")
    env.pop("TRITON_INTERPRET", None)  # the selftest sets it itself without a GPU
    run = subprocess.run([sys.executable, "-m", "fattn.selftest", "--json", str(report_path)],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = json.loads(report_path.read_text())
    rows = {row["kernel"]: row for row in report["rows"]}
    engines = {row["engine"] for row in rows.values()}
    assert engines == {"triton", "cuda_cpp"}, rows.keys()
    for row in rows.values():
        if row["engine"] == "triton":
            assert row["cases"] and all(c["status"] == "passed" for c in row["cases"]), row
            assert not row["skipped"]
        else:
            assert row["skipped"] == "no GPU" and not row["cases"], row
    assert {"forward", "varlen", "kvcache", "backward", "varlen_backward"} <= {
        c["entry"] for row in rows.values() for c in row["cases"]}
    assert report["exit_status"] == 0 and report["records"]["path"] is None
    assert report["environment"]["torch"] == torch.__version__
    assert set(report["dispatch_rows"]) == {"forward", "varlen", "kvcache", "backward",
                                            "varlen_backward"}
    assert not (tmp_path / "cache" / "verified").exists() or \
        not any((tmp_path / "cache" / "verified").iterdir())
    for kernel in rows:
        assert kernel in run.stdout  # the progress lines and the table name every kernel
    assert "verified now" in run.stdout


def test_a_kernel_with_wrong_output_fails(monkeypatch, cache_dir):
    """The last query rows of the last head zeroed (a tile skipped): the forward's cases
    fail, the run's exit status is 1, the progress line says which case."""
    interpreter_or_skip()
    import fattn.triton
    real = fattn.triton.attention

    def skips_a_tile(*args, **kwargs):
        out, lse = real(*args, **kwargs)
        out[:, -1, -16:] = 0
        return out, lse

    monkeypatch.setattr(fattn.triton, "attention", skips_a_tile)
    printed = io.StringIO()
    report = suite.run(suite.Options(kernels=["triton_forward"], record=False, quick=True),
                       out=printed)
    row, = report["rows"]
    assert row["cases"] and all(c["status"] == "failed" for c in row["cases"]), row["cases"]
    assert all(c["measurements"]["out"]["ratio"] > 1 for c in row["cases"])
    assert report["exit_status"] == 1
    assert "FAILED forward" in printed.getvalue()


def test_a_backward_that_changes_bits_fails(monkeypatch, cache_dir):
    """Every other run of the backward one ulp different in one element (accurate, but not
    deterministic): the second run's bits differ, so each case fails."""
    interpreter_or_skip()
    import fattn.triton
    real, calls = fattn.triton.attention_backward, []

    def nondeterministic(*args, **kwargs):
        grads = real(*args, **kwargs)
        calls.append(1)
        if len(calls) % 2 == 0:
            bits = grads[0].view(torch.int16)  # 16-bit gradients, laid out as q
            bits[(0,) * bits.dim()] ^= 1
        return grads

    monkeypatch.setattr(fattn.triton, "attention_backward", nondeterministic)
    cases = [c for c in backward_cases(torch.cuda.is_available(), quick=True)
             if c.entry == "backward"][:1]
    row, reached = plan_kernel(
        Candidate("triton_backward", "triton", ["backward"]), cases,
        environment.architecture())
    suite.run_kernel(row, reached, timing=False)
    case, = row["cases"]
    assert case["status"] == "failed", case
    assert case["measurements"]["same_bits_twice"]["equal"] is False


def test_the_float64_definition_is_fattns_reference():
    """The selftest's float64 evaluation (on the device) is fattn.triton.reference's
    definition, every variant and a mask together."""
    from fattn.triton import reference
    case = Case("forward", "everything", torch.float32, 32, 4, 2, (23,), (31,),
                causal="bottom_right", window=(9, 2), softcap=2.5, alibi=True, sinks=True,
                mask=True)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, h, s, 32, generator=g) for h, s in ((4, 23), (2, 31), (2, 31)))
    inp = Inputs(q, k, v, sinks=torch.randn(4, generator=g), slopes=torch.rand(4, generator=g),
                 mask=torch.rand(1, 1, 23, 31, generator=g) > 0.3)
    out, lse = definition(q, k, v, case, inp, exact=True)
    ref, ref_lse = reference.attention(q, k, v, attn_mask=inp.mask, causal="bottom_right",
                                       window_size=(9, 2), softcap=2.5, sinks=inp.sinks,
                                       alibi_slopes=inp.slopes)
    assert (out - ref).abs().max().item() < 1e-12
    assert (lse - ref_lse).abs().max().item() < 1e-12


def test_the_rule_bounds_by_torchs_error():
    exact = torch.tensor([1.0, -2.0], dtype=torch.float64)
    theirs = torch.tensor([1.0, -2.0 + 2 ** -7], dtype=torch.bfloat16)
    ulp = 2.0 * 2 ** -7  # the floor: one bfloat16 ulp at the largest value
    bound = 2 * 2 ** -7 + ulp
    good = measure(exact.to(torch.bfloat16), exact, theirs, torch.bfloat16)
    assert good["ratio"] == 0 and good["bound"] == pytest.approx(bound)
    bad = measure(exact.to(torch.bfloat16) + 0.1, exact, theirs, torch.bfloat16)
    assert bad["ratio"] > 1
    nan = measure(torch.full((2,), float("nan")), exact, theirs, torch.bfloat16)
    assert nan["ratio"] == float("inf")


def test_records_for_the_kernels_that_passed(cache_dir):
    """What a GPU run writes: a record per kernel that passed every case, for the machine
    code that ran; a failed kernel loses its earlier record, the others keep theirs."""
    env = {"architecture": "sm_90", "device": "NVIDIA H100 80GB HBM3", "driver": "550.54.15",
           "cuda": "12.4", "torch": "2.11", "triton": "3.6.0", "fattn": "0.1.0",
           "date": "2026-12-01T10:00:00+00:00"}
    name = record_name(env)
    assert name == "NVIDIA_H100_80GB_HBM3-driver-550.54.15-fattn-0.1.0"
    earlier = [records.Record(k, "sm_90", f"sha256:{k}-old", "earlier", "old.json")
               for k in ("fused_mma", "decode", "triton_varlen")]
    records.write_local(name, earlier, "earlier run")

    def row(kernel, statuses):
        return {"kernel": kernel, "entries": ["forward"],
                "cases": [{"status": s} for s in statuses],
                "verified_before": {"machine_code": f"sha256:{kernel}"}}

    rows = [row("triton_forward", ["passed", "passed"]), row("fused_mma", ["passed", "failed"]),
            row("decode", ["passed"]), row("fused_tma", [])]
    path, written = write_records(rows, env, cache_dir / "report.json")
    assert written == ["triton_forward", "decode"]
    got = {(r.kernel, r.machine_code): r for r in records.read(path)}
    assert set(got) == {("triton_forward", "sha256:triton_forward"), ("decode", "sha256:decode"),
                        ("triton_varlen", "sha256:triton_varlen-old")}
    fresh = got[("triton_forward", "sha256:triton_forward")]
    assert fresh.suite.startswith("fattn.selftest: 2 cases") and fresh.revision == "0.1.0"
    assert fresh.evidence == str(cache_dir / "report.json") and fresh.device == env["device"]
    assert records.find(records.all_records(), "decode", "sm_90", "sha256:decode")


def test_timing_reports_tflops_beside_sdpa(monkeypatch):
    """The timing's plumbing (a GPU's only) with a clock that says 1 ms: the forward's and
    the backward's products over the visible pairs, SDPA's beside them."""
    interpreter_or_skip()
    monkeypatch.setattr(timing, "_milliseconds", lambda fn: (fn(), 1.0)[1])
    monkeypatch.setitem(timing.TIMING_SHAPE, "seq", 64)
    monkeypatch.setitem(timing.TIMING_SHAPE, "heads", 2)
    for entry, kernel in (("forward", "triton_forward"), ("backward", "triton_backward")):
        case = Case(entry, "causal", torch.float16, 64, 4, 2, (8,), (8,), causal="top_left")
        timed = timing.time_kernel(kernel, None, case)
        products = 4 * 2 * 2 * 64 * (64 * 65 / 2) * (2.5 if entry == "backward" else 1.0)
        assert timed["tflops"] == pytest.approx(products / 1e9)
        assert timed["sdpa_tflops"] == pytest.approx(timed["tflops"])


def test_an_unknown_kernel_is_an_error(capsys):
    assert main(["--kernels", "no_such_kernel", "--no-record"]) == 2
    assert "no_such_kernel" in capsys.readouterr().err
