"""Inside a PyTorch process fattn shares torch's thread pool: one OpenMP runtime, and
torch.get_num_threads() busy threads during a call, no more. Each test runs in a fresh
interpreter, so that earlier tests' thread settings do not leak in."""
import json

import pytest

from conftest import run_python

# Per-thread CPU time of this process, from /proc/self/task/<tid>/stat (utime + stime).
TASKS = """
import os, time
def cpu_by_thread():
    hz = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / hz  # utime, stime
    return out

def busy_threads(fn, min_share=0.15):
    # threads that ran for at least min_share of the call's wall time
    before = cpu_by_thread()
    t0 = time.monotonic()
    fn()
    wall = time.monotonic() - t0
    after = cpu_by_thread()
    used = {t: after[t] - before.get(t, 0.0) for t in after}
    busy = sorted(t for t, c in used.items() if c >= min_share * wall)
    return busy, wall, sum(used.values()), len(after)

def repeat(fn, seconds):
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        fn()
"""


def test_one_openmp_runtime():
    out = run_python("""
        import torch, fattn
        q = torch.randn(2, 8, 256, 64)
        torch.ops.fattn.attention(q, q, q)                      # fattn ran
        torch.nn.functional.scaled_dot_product_attention(q, q, q)  # torch ran
        names = ("libgomp", "libiomp", "libomp", "libgomp-")
        libs = set()
        for line in open("/proc/self/maps"):
            path = line.split()[-1]
            if any(n in path.rsplit("/", 1)[-1] for n in names):
                libs.add(path)
        import json; print(json.dumps(sorted(libs)))
    """)
    libs = json.loads(out.strip().splitlines()[-1])
    assert len(libs) == 1, f"more than one OpenMP runtime loaded: {libs}"
    assert "/torch/lib/" in libs[0], libs  # torch's own libgomp


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_busy_threads_follow_torch(threads):
    # Calls for ~1 s: exactly torch.get_num_threads() threads do the work. (3 on a 2-core
    # machine shows that the count comes from torch's setting, not from the cores.)
    out = run_python(TASKS + f"""
import torch, fattn, json
torch.set_num_threads({threads})
q = torch.randn(1, 8, 1024, 64)
f = lambda: torch.ops.fattn.attention(q, q, q)
f()  # warm: torch's team exists from here on
busy, wall, cpu, nthreads = busy_threads(lambda: repeat(f, 1.0))
print(json.dumps(dict(busy=len(busy), wall=wall, cpu=cpu, threads=nthreads,
                      fattn_threads=fattn.num_threads())))
""")
    r = json.loads(out.strip().splitlines()[-1])
    assert r["fattn_threads"] == threads
    assert r["busy"] == threads, r


def test_fattn_runs_on_torchs_pool():
    # The threads busy during a fattn call are threads torch's own parallel operators use
    # (the same OpenMP team), and fattn adds no thread to the process.
    out = run_python(TASKS + """
import torch, fattn, json
torch.set_num_threads(2)
x = torch.randn(1 << 24)
q = torch.randn(1, 8, 1024, 64)
torch_work = lambda: repeat(lambda: torch.exp(x).sum(), 0.5)
fattn_work = lambda: repeat(lambda: torch.ops.fattn.attention(q, q, q), 0.5)
torch_work()
busy_torch, _, _, n_before = busy_threads(torch_work)
busy_fattn, wall, cpu, n_after = busy_threads(fattn_work)
print(json.dumps(dict(torch=busy_torch, fattn=busy_fattn, n_before=n_before, n_after=n_after,
                      cpu_per_wall=cpu / wall)))
""")
    r = json.loads(out.strip().splitlines()[-1])
    assert len(r["fattn"]) == 2, r
    assert set(r["fattn"]) <= set(r["torch"]), r
    assert r["n_after"] == r["n_before"], r  # no new threads
    assert r["cpu_per_wall"] <= 2.3, r  # about 2 cores' worth at most (2 threads)


def test_default_is_torch_default():
    out = run_python("""
        import torch, fattn
        print(fattn.num_threads(), torch.get_num_threads())
    """)
    a, b = out.split()
    assert a == b
