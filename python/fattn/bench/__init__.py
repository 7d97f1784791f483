"""fattn's Python benchmarks against torch, one module each, on what core shares.

  core      what they share: names, memory and contention measurements, machine record,
            JSON/CSV output, plots, the float64 row reference
  cli       ``python -m fattn.bench``: the forward sweeps, and the entry to the others
            (``--pass train``, ``--decode``, ``--ring``, ``--model``, ``--variants``)
  forward   fattn fused / naive vs torch SDPA / standard attention, forward
  train     the same, forward + backward
  decode    short queries against a KV cache, beside torch SDPA with enable_gqa
            (also ``python -m fattn.bench_decode``)
  ring      ring attention across processes beside one process
  model     a Llama-shaped transformers model, fattn vs transformers' sdpa
  variants  masks, sliding window, softcap, ALiBi
  cuda      fattn vs torch SDPA on a GPU, every SDPA backend forced in turn
            (``python -m fattn.bench_cuda``)
  gpu       fattn.triton and the CUDA operator vs SDPA's GPU backends and FlexAttention:
            masked and plain forward, decode (``python -m fattn.bench --gpu``)
Modules import only from core (cli also from the benchmarks it starts); none imports another's
private names.
"""
