"""Host time of small CUDA-path calls on CPU tensors through the CPU-key override (the
dispatch tests' fixture, tests/python/test_cuda_dispatch.py), with the Triton kernels'
launches stubbed: the glue from the public function to the kernel launch (checks, layout,
plan, the operator), nothing else. Prints microseconds per call (the best of 5 runs of 200
calls) as JSON.

  PYTHONPATH=<a fattn package's parent> python scripts/cuda_path_host_overhead.py

Comparing two revisions: extract each one's python/fattn (git archive REV python/fattn),
copy the installed fattn/_C*.so beside it (the operators' schemas must agree), and run the
script on each in turn, alternating."""
import json
import os
import time
import warnings

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: CPU tensors take the GPU path
import torch

import fattn
import fattn.triton.forward as fwd
import fattn.triton.problem as problem
from fattn import cuda_dispatch


class Launch:
    """A kernel whose launch does nothing."""
    def __getitem__(self, grid):
        return lambda *a, **k: None


for name in ("_forward_kernel", "_combine_kernel"):
    setattr(fwd, name, Launch())
problem.interpreted = lambda: True  # the stubs stand in for the interpreted kernels

lib = torch.library.Library("fattn", "IMPL")
with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    lib.impl("attention", lambda *args: cuda_dispatch.attention(*args), "CPU")
    lib.impl("attention_kvcache", cuda_dispatch.attention_kvcache, "CPU")

torch.manual_seed(0)
q = torch.randn(1, 8, 4, 64)          # (B, S, H, D)
k = torch.randn(1, 8, 2, 64)
v = torch.randn(1, 8, 2, 64)
qd = torch.randn(2, 1, 8, 64)
kc = torch.randn(2, 256, 2, 64)
vc = torch.randn(2, 256, 2, 64)
lens = torch.tensor([100, 200], dtype=torch.int32)
kn = torch.randn(2, 1, 2, 64)
vn = torch.randn(2, 1, 2, 64)
calls = {
    "flash_attention(causal)": lambda: fattn.flash_attention(q, k, v, causal=True),
    "flash_attention(window, softcap)": lambda: fattn.flash_attention(
        q, k, v, causal=True, window_size=(3, 0), softcap=5.0),
    "flash_attn_with_kvcache": lambda: fattn.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=lens),
    "flash_attn_with_kvcache(append)": lambda: fattn.flash_attn_with_kvcache(
        qd, kc, vc, k=kn, v=vn, cache_seqlens=lens.clone()),
}
out = {}
with torch.no_grad():
    for name, f in calls.items():
        for _ in range(20):
            f()
        best = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(200):
                f()
            best.append((time.perf_counter() - t) / 200 * 1e6)
        out[name] = min(best)
print(json.dumps(out))
