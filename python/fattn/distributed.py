"""Context-parallel (ring) attention over torch.distributed: a sequence split across ranks,
K/V blocks passed around the ring, fattn computing each block.

    import torch.distributed as dist, fattn.distributed as fd
    q_local = fd.shard(q, dim=2)                 # this rank's part of the sequence
    out_local = fd.ring_attention(q_local, k_local, v_local, causal=True)
    out = fd.unshard(out_local, dim=2)           # the whole sequence, on every rank

Sharding ("zigzag", as ring-flash-attn and torch's context parallel load-balance causal
attention): the sequence is cut into 2P chunks of equal length and rank r holds chunks r
and 2P−1−r, so under a causal mask every rank has the same number of visible pairs. S must
be a multiple of 2P (an error says so otherwise; pad the sequence and mask the padding).

Forward: P steps. At step s, rank r holds the K/V of rank r − s; the next transfer
(batch_isend_irecv to r + 1, from r − 1) is started before the step's attention and waited
for after it, so communication runs under compute. Each (query chunk, key chunk) pair is
one fattn call: whole (key chunk before query chunk, or no mask), causal (the same chunk),
or skipped (a later chunk). Partial results are merged exactly by their log-sum-exps:
lse = logaddexp(lse_a, lse_b), out = out_a·e^(lse_a − lse) + out_b·e^(lse_b − lse).

Backward (torch.autograd.Function): the same ring again; each block's gradients come from
fattn's backward given the *merged* out and lse (so P and Δ are the full softmax's), dQ
accumulates on its rank, and dK/dV accumulators travel with their K/V block and arrive back
at their owner after P transfers. Sums run in a fixed order: the same bits for a fixed world
size. Device-agnostic: gloo with CPU tensors (what the tests run), NCCL with CUDA tensors.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist


def _world(group):
    return dist.get_world_size(group), dist.get_rank(group)


def chunk_ids(rank: int, world: int) -> tuple[int, int]:
    """The two of the 2·world sequence chunks that rank holds (shard's zigzag split)."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"chunk_ids: rank must be in [0, world) and world >= 1, got rank={rank}, "
                         f"world={world}")
    return (rank, 2 * world - 1 - rank)


def shard(x: torch.Tensor, dim: int = 2, group=None) -> torch.Tensor:
    """This rank's part of the full tensor x along dim: chunks r and 2P−1−r of 2P."""
    world, rank = _world(group)
    n = x.size(dim)
    if n % (2 * world) != 0:
        raise ValueError(f"fattn.distributed.shard: the sequence length {n} (dim {dim}) must be "
                         f"a multiple of 2 × world size = {2 * world}; pad it and mask the padding")
    chunks = x.chunk(2 * world, dim=dim)
    a, b = chunk_ids(rank, world)
    return torch.cat([chunks[a], chunks[b]], dim=dim)


def unshard(x_local: torch.Tensor, dim: int = 2, group=None) -> torch.Tensor:
    """The full tensor from every rank's part (all_gather), in sequence order."""
    world, _ = _world(group)
    parts = [torch.empty_like(x_local) for _ in range(world)]
    dist.all_gather(parts, x_local.contiguous(), group=group)
    chunks = [None] * (2 * world)
    for r, part in enumerate(parts):
        a, b = chunk_ids(r, world)
        chunks[a], chunks[b] = part.chunk(2, dim=dim)
    return torch.cat(chunks, dim=dim)


def transfer_wait_seconds(reset: bool = False) -> float:
    """Seconds this process has waited for ring transfers since the last reset: the
    communication that compute did not hide. reset=True starts the count again."""
    waited = _Ring.waited
    if reset:
        _Ring.waited = 0.0
    return waited


class _Ring:
    """The ring's neighbours, and one exchange of a tensor with them (started, then waited).
    waited: seconds this process has spent waiting for transfers (the communication compute
    did not hide), for the benchmark."""

    waited = 0.0

    def __init__(self, group):
        self.group = group
        self.world, self.rank = _world(group)
        self.send_to = dist.get_global_rank(group, (self.rank + 1) % self.world) if group \
            else (self.rank + 1) % self.world
        self.recv_from = dist.get_global_rank(group, (self.rank - 1) % self.world) if group \
            else (self.rank - 1) % self.world

    def start(self, tensor):
        received = torch.empty_like(tensor)
        ops = [dist.P2POp(dist.isend, tensor, self.send_to, self.group),
               dist.P2POp(dist.irecv, received, self.recv_from, self.group)]
        return received, dist.batch_isend_irecv(ops)

    @classmethod
    def wait(cls, requests):
        start = time.perf_counter()
        for r in requests:
            r.wait()
        cls.waited += time.perf_counter() - start


def _pairs(rank, source, world, causal):
    """(query chunk slot, key chunk slot, causal?) of the blocks rank computes against the
    K/V of `source`; slots 0 and 1 are a rank's two chunks."""
    for qi, q_chunk in enumerate(chunk_ids(rank, world)):
        for ki, k_chunk in enumerate(chunk_ids(source, world)):
            if not causal or k_chunk < q_chunk:
                yield qi, ki, False
            elif k_chunk == q_chunk:
                yield qi, ki, True


def _merge(out, lse, block_out, block_lse):
    """(out, lse) ← the exact merge of two partial softmaxes over disjoint keys."""
    new_lse = torch.logaddexp(lse, block_lse)
    finite = torch.isfinite(new_lse)
    a = torch.where(finite, torch.exp(lse - new_lse), torch.zeros_like(lse))
    b = torch.where(finite, torch.exp(block_lse - new_lse), torch.zeros_like(lse))
    out.mul_(a.unsqueeze(-1)).add_(block_out.float() * b.unsqueeze(-1))
    lse.copy_(new_lse)


def _kv_pack(k, v):
    return torch.cat([k.reshape(-1), v.reshape(-1)])


def _kv_unpack(packed, k_like, v_like):
    n = k_like.numel()
    return packed[:n].view_as(k_like), packed[n:].view_as(v_like)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, scale):
        ring = _Ring(group)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        qs, c = q.chunk(2, dim=2), k.size(2) // 2
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)
        outs, lses = out.chunk(2, dim=2), lse.chunk(2, dim=2)
        kv = _kv_pack(k, v)
        for step in range(ring.world):
            if step + 1 < ring.world:
                incoming, requests = ring.start(kv)
            kb, vb = _kv_unpack(kv, k, v)
            source = (ring.rank - step) % ring.world
            for qi, ki, diagonal in _pairs(ring.rank, source, ring.world, causal):
                block_out, block_lse = torch.ops.fattn.attention(
                    qs[qi], kb[:, :, ki * c:(ki + 1) * c], vb[:, :, ki * c:(ki + 1) * c],
                    diagonal, False, scale, "auto")
                _merge(outs[qi], lses[qi], block_out, block_lse)
            if step + 1 < ring.world:
                ring.wait(requests)
                kv = incoming
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.causal, ctx.scale = group, causal, scale
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        ring = _Ring(ctx.group)
        c = k.size(2) // 2
        grad_out = grad_out.contiguous()
        qs, outs, dos, lses = (t.chunk(2, dim=2) for t in (q, out, grad_out, lse))
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dqs = dq.chunk(2, dim=2)
        kv = _kv_pack(k, v)
        dkv = torch.zeros(kv.shape, dtype=torch.float32, device=kv.device)
        for step in range(ring.world):
            if step + 1 < ring.world:
                incoming, requests = ring.start(kv)
            kb, vb = _kv_unpack(kv, k, v)
            dkb, dvb = _kv_unpack(dkv, k, v)
            source = (ring.rank - step) % ring.world
            for qi, ki, diagonal in _pairs(ring.rank, source, ring.world, ctx.causal):
                keys = slice(ki * c, (ki + 1) * c)
                bdq, bdk, bdv, _ = torch.ops.fattn.attention_backward(
                    dos[qi], qs[qi], kb[:, :, keys], vb[:, :, keys], outs[qi], lses[qi], None,
                    diagonal, False, ctx.scale, "auto")
                dqs[qi].add_(bdq)
                dkb[:, :, keys].add_(bdk)
                dvb[:, :, keys].add_(bdv)
            if step + 1 < ring.world:
                ring.wait(requests)
                kv = incoming
            # The dK/dV accumulator follows its K/V block: after P transfers it is home.
            dkv, requests = ring.start(dkv)
            ring.wait(requests)
        dk, dv = _kv_unpack(dkv, k, v)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def ring_attention(q, k, v, group=None, causal=False, scale=None, return_lse=False):
    """Attention of this rank's queries against the whole sequence's keys, held by the
    ranks of `group` (default: the world) in the zigzag sharding (`shard`): q (B, Hq,
    S_local, D), k and v (B, Hkv, S_local, D), Hq a multiple of Hkv, one dtype; every rank
    calls it with the same shapes. causal: the full sequence's causal mask. Returns this
    rank's output (B, Hq, S_local, D) (and its (B, Hq, S_local) float32 logsumexp, which
    carries no gradient). Differentiable in q, k and v."""
    if not dist.is_initialized():
        raise RuntimeError("fattn.distributed.ring_attention: torch.distributed is not "
                           "initialized (dist.init_process_group)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"fattn.distributed.ring_attention: {name} must be (B, H, "
                             f"S_local, D), got shape {tuple(t.shape)}")
        if t.size(2) % 2:
            raise ValueError(f"fattn.distributed.ring_attention: {name}.size(2) = {t.size(2)} "
                             "must be even (two chunks per rank: shard())")
    if k.size(2) != q.size(2):
        raise ValueError("fattn.distributed.ring_attention: q and k must hold the same "
                         f"sequence chunks, got {q.size(2)} and {k.size(2)} rows")
    out, lse = _RingAttention.apply(q, k, v, group, bool(causal), scale)
    return (out, lse) if return_lse else out
