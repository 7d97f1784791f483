"""fattn's FlashAttention 2 functions, and the one helper FlashAttention's test file takes
from its interface module. FATTN_FA_PATH=triton: the functions on fattn's Triton kernels
(the CUDA tensors' path) under Triton's interpreter (_triton_path.py); else fattn's own
(fattn.flash_attn_interface: the CPU kernels for CPU tensors)."""
import os

from fattn._attn_probs import key_block
from fattn.flash_attn_interface import __all__  # noqa: F401  (star-imports take these)

if os.environ.get("FATTN_FA_PATH") == "triton":
    from ._triton_path import *  # noqa: F401,F403
else:
    from fattn.flash_attn_interface import *  # noqa: F401,F403


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    """The key-block width FlashAttention's test undoes S_dmask's scaling with
    (normalize_flash_attn_S): fattn's S_dmask is scaled as FlashAttention's kernel leaves
    it, over the blocks of fattn._attn_probs.key_block (S_dmask exists only with dropout)."""
    return key_block(head_dim)
