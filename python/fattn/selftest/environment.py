"""The machine the selftest runs on: the device, the versions a bug report needs, and
whether the Triton kernels can run here (on a GPU, or on CPU tensors under Triton's
interpreter).

Imported first by the package: without a GPU it sets TRITON_INTERPRET before anything
imports triton.
"""
from __future__ import annotations

import datetime
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys

import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU and "triton" not in sys.modules:
    # Triton reads this once, on import: without a GPU its kernels take CPU tensors only
    # under the interpreter.
    os.environ["TRITON_INTERPRET"] = "1"

import fattn  # noqa: E402
from fattn import dispatch  # noqa: E402


def architecture() -> str | None:
    """sm_<major><minor> of the GPU the selftest runs on (None: no GPU)."""
    return dispatch.architecture_of(torch.cuda.get_device_capability()) if ON_GPU else None


def device() -> torch.device:
    return torch.device("cuda") if ON_GPU else torch.device("cpu")


def _version(package: str) -> str | None:
    try:
        from importlib.metadata import version
        return version(package)
    except Exception:  # not installed
        return None


def driver_version() -> str | None:
    """The NVIDIA driver's version (nvidia-smi), else the CUDA driver API's (torch)."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            run = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            if run.returncode == 0 and run.stdout.strip():
                return run.stdout.strip().splitlines()[0]
        except (OSError, subprocess.TimeoutExpired):
            pass
    if ON_GPU and hasattr(torch._C, "_cuda_getDriverVersion"):
        api = torch._C._cuda_getDriverVersion()
        return f"CUDA driver API {api // 1000}.{api % 1000 // 10}"
    return None


def environment() -> dict:
    """What a bug report needs to know of the machine."""
    env = {"device": "cpu (no GPU: the Triton kernels under Triton's interpreter)",
           "architecture": architecture(), "driver": driver_version(),
           "cuda": torch.version.cuda, "torch": torch.__version__, "triton": _version("triton"),
           "numpy": _version("numpy"), "fattn": fattn.__version__,
           "fattn_cuda_backend": bool(fattn._C.with_cuda), "python": platform.python_version(),
           "platform": platform.platform(), "interpreter": not ON_GPU,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if ON_GPU:
        props = torch.cuda.get_device_properties(0)
        env.update(device=torch.cuda.get_device_name(0),
                   multiprocessors=props.multi_processor_count,
                   memory_gib=round(props.total_memory / 2**30, 1))
    return env


def _version_tuple(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text or "")[:2])


def interpreter_incompatibility() -> str:
    """Why Triton's interpreter cannot run fattn's kernels in this environment ("" where it
    can): triton 3.6's interpreter takes a loop bound from a 1-element array, which numpy
    2.4 no longer converts to a scalar."""
    triton, numpy = _version("triton"), _version("numpy")
    if triton and numpy and _version_tuple(triton) <= (3, 6) and _version_tuple(numpy) >= (2, 4):
        return (f"Triton's interpreter (triton {triton}) needs numpy < 2.4, found numpy {numpy} "
                f"(pip install 'numpy<2.4')")
    return ""


def triton_unusable() -> str:
    """Why the Triton kernels cannot run here ("" where they can)."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install triton)"
    if ON_GPU:
        return ""
    from fattn.triton import problem
    if not problem.interpreted():
        return ("no GPU, and triton was imported before TRITON_INTERPRET=1 was set (its "
                "kernels take CPU tensors only under the interpreter)")
    return interpreter_incompatibility()
