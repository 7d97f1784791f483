"""fattn's Python benchmarks against torch, one module each: ``python -m fattn.bench``
(fattn.bench.cli: the forward sweeps, ``--pass train``, ``--decode``).

  core     what they share: names, memory and contention measurements, machine record,
           JSON/CSV output and plots
  forward  fattn fused / naive vs torch SDPA / standard attention, forward
  train    the same, forward + backward
  decode   short queries against a KV cache, beside torch SDPA with enable_gqa
"""
