"""`python -m fattn.selftest`: checks fattn's GPU kernels on this GPU and records the ones
that pass, so that the dispatcher runs them as verified defaults.

For every candidate kernel of fattn.dispatch's table that this device would dispatch (the
rows of each entry whose architectures match it), a compact grid of calls runs with that
kernel forced: the Triton kernels through fattn.triton's functions, the C++ kernels through
torch.ops.fattn.cuda_attention / cuda_attention_backward / attention_kvcache. Each result
is held to fattn's accuracy rule: its largest error against a float64 evaluation of the
definition is at most twice torch's own error in the same dtype on the same inputs (scores
and P·V in the dtype, softmax in float32; in float32 with torch's TF32 setting), plus a
floor of one unit in the last place (two for gradients; fattn.triton's float32 tolerances
in float32). Every backward runs twice and must give the same bits. The forward and
backward candidates are then timed beside torch's SDPA.

Kernels that passed every case on a GPU get a verification record (fattn.dispatch.records)
for the machine code that ran; the report (--json) is the record's evidence, and what a bug
report attaches. Without a GPU the Triton kernels run on CPU tensors under Triton's
interpreter at small shapes, the C++ kernels are skipped, and nothing is recorded.

    python -m fattn.selftest [--json PATH] [--no-record] [--kernels k1,k2] [--quick]

Exit status: 0 when every case that ran passed, 1 otherwise, 2 for bad arguments.
"""
from __future__ import annotations

from . import environment  # noqa: F401  first: sets TRITON_INTERPRET before triton loads
from .suite import Options, run

__all__ = ["Options", "run"]
