"""FlashAttention's apply_rotary_emb (its Triton kernel's semantics) in torch operations,
for the references of FlashAttention's kvcache tests: x (B, S, H, D); cos, sin
(seqlen_ro, rotary_dim / 2); the first rotary_dim dims of each head rotated at positions
seqlen_offsets + t (an int or a (B,) tensor), interleaved pairs (0, 1), (2, 3), ... or
halves (i, i + rotary_dim / 2); the rest kept."""
import torch


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0,
                     cu_seqlens=None, max_seqlen=None):
    assert cu_seqlens is None, "packed rotary is not used by the tests fattn runs"
    b, s = x.shape[:2]
    rotary_dim = 2 * cos.size(-1)
    offsets = torch.as_tensor(seqlen_offsets, device=x.device).reshape(-1, 1)
    at = (offsets + torch.arange(s, device=x.device)).expand(b, s)
    c = cos[at].unsqueeze(2).float()  # (B, S, 1, rotary_dim / 2)
    n = sin[at].unsqueeze(2).float()
    rot = x[..., :rotary_dim].float()
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack((x1 * c - x2 * n, x1 * n + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = rot.chunk(2, dim=-1)
        out = torch.cat((x1 * c - x2 * n, x1 * n + x2 * c), dim=-1)
    result = torch.cat((out.to(x.dtype), x[..., rotary_dim:]), dim=-1)
    if inplace:
        x.copy_(result)
        return x
    return result
