"""FlashAttention's ``S_dmask``: the attention probabilities of a call with dropout, each
negated where dropout dropped it — what ``return_attn_probs=True`` returns with
``dropout_p > 0`` (FlashAttention's tests read the dropout pattern from its signs and undo
its scaling to compare the probabilities with theirs).

fattn's kernels never form the (Sq, Sk) probabilities; this forms them after the call from
the logits as fattn defines them (fattn._scores), and the mask from the call's dropout
stream (the function the kernels evaluate), so the signs are exactly the kernel's mask.
Shape and scaling are FlashAttention's: (B, Hq, Sq, Sk), each rounded up to a multiple of
128, zero outside the sequences; each value exp(s − m), m the row's largest score over
the key blocks from its own to the last, as FlashAttention's forward leaves them (it walks
the key blocks last to first), blocks of FlashAttention's width for the head dim under
dropout (key_block). In q's dtype; one float32 (Hq, Sq, Sk) block at a time beside it."""
from __future__ import annotations

import torch

from . import _C
from ._scores import scores

ROUNDING = 128  # FlashAttention rounds S_dmask's two sequence dimensions to this


def key_block(head_dim: int) -> int:
    """FlashAttention 2's key-block width with dropout on sm80 and sm90 (its
    _get_block_size_n, which its tests undo S_dmask's scaling with)."""
    if head_dim <= 32:
        return 128
    return 32 if 96 < head_dim <= 128 else 64


def _rounded(n: int) -> int:
    return (n + ROUNDING - 1) // ROUNDING * ROUNDING


def _signed(q, k, keep, scale, causal, window_size, softcap, alibi_slopes):
    """(Hq, sq, sk) scaled probabilities of one sequence, negated where `keep` is False:
    q (Hq, sq, D), k (Hkv, sk, D), keep (Hq, sq, sk)."""
    s = scores(q.unsqueeze(0).float(), k.unsqueeze(0).float(), scale, causal, window_size,
               softcap, alibi_slopes)[0]
    width = key_block(q.size(-1))
    sk = s.size(-1)
    blocks = -(-sk // width)
    padded = torch.nn.functional.pad(s, (0, blocks * width - sk), value=float("-inf"))
    block_max = padded.view(*s.shape[:-1], blocks, width).amax(-1)
    from_here_on = block_max.flip(-1).cummax(-1).values.flip(-1)
    m = from_here_on.repeat_interleave(width, dim=-1)[..., :sk]
    probs = torch.exp(s - m).nan_to_num(0.0)  # keys hidden from here on: 0
    return torch.where(keep, probs, -probs)


def _fill(sequences, batch, hq, max_q, max_k, q, stream, scale, causal, window_size, softcap,
          alibi_slopes):
    """S_dmask (batch, Hq, max_q, max_k rounded) with sequence n's (q (Hq, sq, D), k (Hkv,
    sk, D)) at [n, :, :sq, :sk], its mask counting n as its batch index (as the kernels
    do); zero elsewhere. q: the call's, for dtype and device."""
    p, seed, offset = stream
    keep = _C.dropout_mask(batch, hq, max_q, max_k, p, int(seed), int(offset)).to(q.device)
    out = torch.zeros(batch, hq, _rounded(max_q), _rounded(max_k), dtype=q.dtype,
                      device=q.device)
    for n, (q_n, k_n) in enumerate(sequences):
        sq, sk = q_n.size(1), k_n.size(1)
        slopes = alibi_slopes[n] if alibi_slopes is not None and alibi_slopes.dim() == 2 \
            else alibi_slopes
        out[n, :, :sq, :sk] = _signed(q_n, k_n, keep[n, :, :sq, :sk], scale,
                                      "bottom_right" if causal else None, window_size,
                                      softcap, slopes)
    return out


@torch.no_grad()
def dense(q, k, stream, scale, causal, window_size, softcap, alibi_slopes):
    """S_dmask of a dense call: q (B, Hq, Sq, D), k (B, Hkv, Sk, D),
    stream (p, seed, offset) as the operator took it, causal aligned bottom-right."""
    b, hq, sq, _ = q.shape
    return _fill(((q[n], k[n]) for n in range(b)), b, hq, sq, k.size(2), q, stream, scale,
                 causal, window_size, softcap, alibi_slopes)


@torch.no_grad()
def varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, stream, scale,
           causal, window_size, softcap, alibi_slopes):
    """S_dmask of a packed call: q (total_q, Hq, D), k (total_k, Hkv, D); sequence n's
    probabilities at [n, :, :Sq_n, :Sk_n]."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    sequences = ((q[cq[n]:cq[n + 1]].transpose(0, 1), k[ck[n]:ck[n + 1]].transpose(0, 1))
                 for n in range(len(cq) - 1))
    return _fill(sequences, len(cq) - 1, q.size(1), max_seqlen_q, max_seqlen_k, q, stream,
                 scale, causal, window_size, softcap, alibi_slopes)
