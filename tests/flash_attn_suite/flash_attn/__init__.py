"""The `flash_attn` package FlashAttention's test file imports, answered by fattn: its
functions are fattn.flash_attn_interface's (fattn's own code; only this name is borrowed,
so FlashAttention's tests run unchanged against fattn). Used by scripts/fa-tests.sh only."""
from .flash_attn_interface import *  # noqa: F401,F403  (FlashAttention's seven functions)
