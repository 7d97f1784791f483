"""fattn.dispatch: the table as data, verification by machine code, the warning and the
FATTN_REQUIRE_VERIFIED error, and the committed defaults against this checkout's code."""
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from fattn import cuda_dispatch, dispatch
from fattn.dispatch import machine_code, records, status

ROOT = Path(__file__).resolve().parents[2]
LIBRARIES = sorted(str(p) for p in ROOT.glob("build/libfattn_cuda*.a"))
ENTRY_CALLS = {  # (operator entry, plan keywords) for every entry, plain and with variants
    "forward": ("attention", {}),
    "variants": ("attention", dict(window=(64, 0), softcap=True)),
    "varlen": ("attention_varlen", {}),
    "kvcache": ("attention_kvcache", {}),
    "backward": ("attention_backward", {}),
}


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    """No user records (a private cache dir) and no cached plans."""
    monkeypatch.setenv("FATTN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(dispatch.REQUIRE_VERIFIED, raising=False)
    records.reload()
    cuda_dispatch.forget_plans()
    dispatch._warned.clear()
    yield
    records.reload()
    cuda_dispatch.forget_plans()


def fake_world(monkeypatch, code: dict, known: list):
    """Every C++ candidate takes the call; the machine code and the records as given."""
    monkeypatch.setattr(dispatch.engines, "cpp_refusal", lambda kernel, call: "")
    monkeypatch.setattr(dispatch, "current_machine_code",
                        lambda kernel, arch: code.get((kernel, arch)))
    monkeypatch.setattr(records, "all_records", lambda: known)


def record(kernel, arch, code):
    return records.Record(kernel, arch, code, "a test suite", "results/test/evidence.json")


def hopper_call(**over):
    return dispatch.Call(**{**dict(entry="forward", dtype="bfloat16", head_dim=128,
                                   architecture="sm_90"), **over})


def test_every_entry_plans_on_hopper_and_ampere():
    """plan() answers every entry on (9, 0) and (8, 0) with a kernel of the table, whether
    it is verified and its evidence, from this process's real machine code (Triton's
    compiled for the architecture)."""
    for capability in ((9, 0), (8, 0)):
        for name, (entry, extra) in ENTRY_CALLS.items():
            chosen = cuda_dispatch.plan(entry, head_dim=128, dtype=torch.bfloat16,
                                        capability=capability, **extra)
            assert chosen.kernel in dispatch.kernels(), (capability, name)
            assert isinstance(chosen.verified, bool)
            assert (chosen.evidence is not None) == chosen.verified
            assert chosen.why and chosen.candidates, (capability, name)


def test_the_first_verified_candidate_is_the_default(monkeypatch):
    code = {("fused_tma", "sm_90"): "sha256:a", ("triton_forward", "sm_90"): "sha256:b"}
    fake_world(monkeypatch, code, [record("triton_forward", "sm_90", "sha256:b")])
    chosen = dispatch.plan(hopper_call(), warn=False)
    assert (chosen.kernel, chosen.verified) == ("triton_forward", True)
    assert chosen.evidence == "results/test/evidence.json"
    assert "verified on sm_90 by a test suite" in chosen.why
    # a record of the preferred kernel's code makes it the default
    fake_world(monkeypatch, code, [record("triton_forward", "sm_90", "sha256:b"),
                                   record("fused_tma", "sm_90", "sha256:a")])
    assert dispatch.plan(hopper_call(), warn=False).kernel == "fused_tma"
    # a record on another architecture verifies nothing here
    fake_world(monkeypatch, code, [record("fused_tma", "sm_80", "sha256:a")])
    chosen = dispatch.plan(hopper_call(), warn=False)
    assert (chosen.kernel, chosen.verified) == ("fused_tma", False)


def test_unverified_warns_once_and_raises_when_required(monkeypatch):
    fake_world(monkeypatch, {}, [])
    with pytest.warns(RuntimeWarning, match="python -m fattn.selftest"):
        assert dispatch.plan(hopper_call()).kernel == "fused_tma"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dispatch.plan(hopper_call())  # once per process and kernel
        dispatch.plan(hopper_call(), impl="triton")  # a kernel named by impl: no warning
    monkeypatch.setenv(dispatch.REQUIRE_VERIFIED, "1")
    with pytest.raises(RuntimeError, match="FATTN_REQUIRE_VERIFIED is set"):
        dispatch.plan(hopper_call())
    # a verified default does not raise
    fake_world(monkeypatch, {("fused_tma", "sm_90"): "sha256:a"},
               [record("fused_tma", "sm_90", "sha256:a")])
    assert dispatch.plan(hopper_call()).verified


PROBE = """
extern "C" __global__ void fattn_probe_kernel(float* x) { x[threadIdx.x] = %s; }
"""


@pytest.mark.skipif(shutil.which("nvcc") is None or machine_code.cuobjdump() is None,
                    reason="needs nvcc and cuobjdump")
def test_a_change_of_machine_code_demotes_a_verified_kernel(tmp_path, monkeypatch):
    """A kernel's code compiled, hashed and recorded as verified; the same source compiled
    again keeps it verified; a changed body demotes it, so Triton runs the call."""
    spec = {"machine_code": {"sm_90": {"cubin": "sm_90", "symbols": "fattn_probe_kernel"}}}

    def hash_of(body):
        source = tmp_path / "probe.cu"
        source.write_text(PROBE % body)
        cubin = tmp_path / "probe.cubin"
        subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-o", str(cubin), str(source)],
                       check=True)
        return machine_code.cpp_hash(spec, "sm_90", machine_code.sass_functions([cubin]))

    verified = hash_of("2.0f * x[threadIdx.x]")
    known = [record("fused_tma", "sm_90", verified)]
    code = {("fused_tma", "sm_90"): hash_of("2.0f * x[threadIdx.x]")}
    fake_world(monkeypatch, code, known)
    assert dispatch.plan(hopper_call(), warn=False).verified
    code[("fused_tma", "sm_90")] = hash_of("3.0f * x[threadIdx.x]")
    assert code[("fused_tma", "sm_90")] != verified
    chosen = dispatch.plan(hopper_call(), warn=False)
    assert (chosen.kernel, chosen.verified) == ("fused_tma", False)


def test_local_records_count(monkeypatch):
    """A record the selftest wrote under the user's cache verifies like a committed one."""
    monkeypatch.setattr(dispatch.engines, "cpp_refusal", lambda kernel, call: "")
    monkeypatch.setattr(dispatch, "current_machine_code", lambda kernel, arch: "sha256:x")
    monkeypatch.setattr(records, "committed", lambda: [])
    assert not dispatch.plan(hopper_call(), warn=False).verified
    path = records.write_local("test-device", [record("fused_tma", "sm_90", "sha256:x")],
                               "a test")
    assert path.parent == records.local_dir()
    chosen = dispatch.plan(hopper_call(), warn=False)
    assert chosen.verified and chosen.kernel == "fused_tma"


def test_the_table_names_only_known_kernels_and_every_entry():
    table = machine_code.load_table()
    assert set(table["entries"]) == set(dispatch.ENTRIES)
    for entry in dispatch.ENTRIES:  # every call has a row
        for arch in ("sm_80", "sm_86", "sm_90", "sm_100", None):
            for dtype in dispatch.DTYPES:
                for d in (32, 64, 96, 128, 256):
                    for window in ((-1, -1), (128, 0)):
                        dispatch.row_for(dispatch.Call(entry, dtype, d, arch, window))
    for entry in ("forward", "backward"):
        assert dispatch.row_for(hopper_call(entry=entry, attn_mask=True))["candidates"] == [
            "triton_forward" if entry == "forward" else "triton_backward"]
    for entry, rows in table["entries"].items():
        for row in rows:
            assert row["candidates"] and row["why"], (entry, row)
            assert set(row["candidates"]) <= set(table["kernels"]), (entry, row)
    for record_ in records.committed():
        assert record_.kernel in table["kernels"]
        assert (ROOT / record_.evidence).exists(), record_.evidence


@pytest.mark.skipif(not LIBRARIES, reason="no CUDA library built in build/ (nvcc missing)")
def test_committed_defaults_are_this_checkouts():
    """defaults.json (README's and REPORT.md's table) is what this checkout's machine code
    and verified.json give: a verified kernel whose code changed fails here until
    defaults.json says it is no longer verified."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "fattn.dispatch.status", "--check",
                          "--libraries", *LIBRARIES], capture_output=True, text=True, env=env,
                         cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    committed = json.loads((ROOT / status.SOURCE_DEFAULTS).read_text())["defaults"]
    assert committed and all(r["kernel"] in dispatch.kernels() for r in committed)


@pytest.mark.skipif(not LIBRARIES or machine_code.cuobjdump() is None,
                    reason="no CUDA library built in build/, or no cuobjdump")
def test_machine_code_of_one_architecture():
    """The operator reads only the cubins of its device's architecture: the same hashes as the
    whole read, none for an architecture no C++ kernel has code for."""
    hopper = machine_code.cpp_hashes(LIBRARIES, architectures=("sm_90",))
    assert hopper and all(set(by_arch) == {"sm_90"} for by_arch in hopper.values())
    assert {"fused_mma", "fused_tma", "decode", "backward_tma"} <= set(hopper)
    assert machine_code.cpp_hashes(LIBRARIES, architectures=("sm_100",)) == {}
    for record in records.committed():  # the seeded C++ records are today's sm_90 code
        if dispatch.kernels()[record.kernel]["engine"] == "cuda_cpp":
            assert hopper[record.kernel][record.architecture] == record.machine_code, record


def test_unreadable_machine_code_is_unverified_not_an_error(monkeypatch):
    """A compile that fails (a GPU this Triton does not know) leaves the kernel unverified and
    says so once; the call still plans."""
    from fattn.dispatch import current

    def broken(kernel, arch):
        raise RuntimeError("no backend for sm_999")

    monkeypatch.setattr(current, "triton_hash", broken)
    current._unreadable.clear()
    with pytest.warns(RuntimeWarning, match="could not be read, so it counts as unverified"):
        assert current.current_machine_code("triton_forward", "sm_999") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert current.current_machine_code("triton_forward", "sm_999") is None


def test_unverified_prefers_a_kernel_a_gpu_has_run(monkeypatch):
    """With nothing verified, a kernel no GPU ever ran (table.json's gpu_run null) is the
    default only where no other candidate takes the call."""
    fake_world(monkeypatch, {}, [])
    assert [k for k, spec in dispatch.kernels().items() if spec["gpu_run"] is None] == [
        "fused_tma_variants", "decode", "backward_tma", "triton_forward_full",
        "triton_backward_dropout"]
    assert dispatch.plan(hopper_call(entry="backward"), warn=False).kernel == "triton_backward"
    assert dispatch.plan(hopper_call(entry="kvcache", architecture="sm_80"),
                         warn=False).kernel == "triton_kvcache"
    assert dispatch.plan(hopper_call(), warn=False).kernel == "fused_tma"  # it ran on the H200
    monkeypatch.setattr(dispatch.engines, "triton_refusal", lambda call: "no triton here")
    chosen = dispatch.plan(hopper_call(entry="backward"), warn=False)
    assert chosen.kernel == "backward_tma" and "no GPU has ever run it" in chosen.why


def test_dropout_and_seqused_k_plan_their_own_kernels():
    """A call with dropout, or a varlen call with seqused_k, runs the Triton kernels that take
    their arguments: plan() names those (their own machine code, unverified until a GPU run
    records it, so the warning says so), not the entry's plain kernel; a C++ kernel named
    by impl= refuses dropout."""
    hopper = dict(dtype=torch.bfloat16, head_dim=128, capability=(9, 0))
    for entry, kernel in (("attention", "triton_forward_full"),
                          ("attention_varlen", "triton_forward_full"),
                          ("attention_backward", "triton_backward_dropout"),
                          ("attention_varlen_backward", "triton_backward_dropout")):
        chosen = cuda_dispatch.plan(entry, dropout=True, **hopper)
        assert (chosen.kernel, chosen.engine, chosen.verified) == (kernel, "triton", False), entry
    assert cuda_dispatch.plan("attention_varlen", seqused_k=True, **hopper).kernel == "triton_forward_full"
    assert cuda_dispatch.plan("attention_varlen", **hopper).kernel == "triton_varlen"
    assert dispatch.row_for(hopper_call(dropout=True, attn_mask=True))["candidates"] == [
        "triton_forward_full"]
    assert dispatch.row_for(hopper_call())["candidates"][0] == "fused_tma"
    with pytest.warns(RuntimeWarning, match="triton_forward_full runs this forward call"):
        cuda_dispatch.plan("attention", dropout=True, warn=True, **hopper)
    with pytest.raises(NotImplementedError, match="the C.. kernels take no dropout"):
        cuda_dispatch.plan("attention", impl="fused_tma", dropout=True, **hopper)
