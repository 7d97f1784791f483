"""Attention dropout in the Triton kernels: the mask of src/model/dropout.hpp, the same
function the CPU kernels evaluate (so a call keeps the same probabilities on either
device): Philox4x32-10 keyed by the 64-bit seed, counter (query row, key // 8, b·Hq + h,
offset); its four words hold eight 16-bit draws, key j taking draw j % 8 (word (j % 8) // 2,
low half for even j): kept iff >= threshold = round(p·2^16). Triton's philox with 32-bit
counters is that generator (key: the seed's low, high words).
"""
from __future__ import annotations

import triton
import triton.language as tl


def threshold_of(p: float) -> int:
    """round(p · 2^16), at most 2^16 − 1: a 16-bit draw below it drops its key."""
    return min(round(p * 65536.0), 65535)


@triton.jit
def factors(seed, offset, threshold, scale, stream, rows, keys):
    """scale where P[rows, keys] of the head whose stream is `stream` (b·Hq + h) survives,
    0 where it is dropped; rows and keys broadcast against each other (a [M, 1] and a
    [1, N] index tile, or the reverse)."""
    zero = rows * 0 + keys * 0
    c0 = (rows + zero).to(tl.uint32)
    c1 = ((keys >> 3) + zero).to(tl.uint32)
    c2 = (zero + stream).to(tl.uint32)
    c3 = (zero + offset).to(tl.uint32)
    w0, w1, w2, w3 = tl.philox(seed, c0, c1, c2, c3)
    word = ((keys & 7) >> 1) + zero
    w = tl.where(word == 0, w0, tl.where(word == 1, w1, tl.where(word == 2, w2, w3)))
    draw = tl.where(((keys & 1) + zero) == 1, w >> 16, w & 0xFFFF)
    return tl.where(draw >= threshold.to(tl.uint32), scale, 0.0)
