"""FlashAttention's test file on the CPU against fattn (scripts/fa-tests.sh): the file's
CUDA queries answered as a 16 GiB sm_80 GPU would answer them (so its
own "reference implementation OOM" skips apply to sequences of 2048 and more), and a
deterministic sample of its cases (FATTN_FA_SAMPLE). FATTN_FA_PATH=triton: fattn's Triton
kernels under Triton's interpreter instead of its CPU kernels (flash_attn/_triton_path.py)."""
import os
import types
import zlib

import pytest

if os.environ.get("FATTN_FA_PATH") == "triton":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402

torch.cuda.get_device_capability = lambda device=None: (8, 0)
torch.cuda.get_device_properties = lambda device=None: types.SimpleNamespace(
    total_memory=16 * 2**30, name="cpu (fattn)", major=8, minor=0)
torch.cuda.synchronize = lambda device=None: None


@pytest.hookimpl(trylast=True)  # after -k has selected
def pytest_collection_modifyitems(config, items):
    """FATTN_FA_SAMPLE=N: of each test function's selected cases, the 1 in N (at least one)
    whose ids hash lowest: every function stays covered, the same cases every run."""
    every = int(os.environ.get("FATTN_FA_SAMPLE", "1"))
    if every <= 1:
        return
    by_function = {}
    for it in items:
        by_function.setdefault(it.originalname, []).append(it)
    keep = set()
    for cases in by_function.values():
        cases.sort(key=lambda it: zlib.crc32(it.nodeid.encode()))
        keep.update(id(it) for it in cases[:max(1, round(len(cases) / every))])
    deselected = [it for it in items if id(it) not in keep]
    items[:] = [it for it in items if id(it) in keep]
    config.hook.pytest_deselected(items=deselected)
