"""fattn as a Hugging Face transformers attention backend.

    import fattn.transformers
    fattn.transformers.register()                       # once; name="fattn" by default
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="fattn")

``register`` adds fattn's attention function to transformers' ``AttentionInterface`` and,
under the same name, the mask format it reads to ``AttentionMaskInterface``: transformers'
SDPA mask (boolean, True = takes part, (B, 1, Sq, Sk), or None where the call is plain
causal attention). Without the second, transformers would hand a custom name no padding
mask at all, and a left-padded batch would attend to its padding.

Each call maps onto fattn's operator, on the CPU kernels (and on CUDA where its kernels
cover the call):
  no mask                  the causal flag (top-left, as transformers' SDPA path), no S×S mask
  a mask                   attn_mask: tiles the mask hides whole are skipped; with one new
                           token against a KV cache, the decode kernel
  softcap (Gemma 2)        softcap;   s_aux (gpt-oss's sinks)   sinks, with their gradient
  sliding_window           in the mask transformers builds; without a mask, the window
GQA needs no copies (Hq a multiple of Hkv). Training runs fattn's backward through
autograd. What fattn cannot do raises an error naming the option (dropout > 0 while
training, attention weights asked for); nothing falls back to another implementation.
transformers itself is imported only by ``register``.
"""
from __future__ import annotations

import torch

from .functional import per_head

# The transformers release the tests run (scripts/python_env.sh installs it).
TESTED_VERSION = "5.24.0"


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      is_causal=None, sliding_window=None, softcap=None, s_aux=None, **kwargs):
    """transformers' attention-function contract: query (B, Hq, Sq, D), key and value
    (B, Hkv, Sk, D); returns (output (B, Sq, Hq, D), None)."""
    if dropout:
        raise NotImplementedError(
            f"fattn: attention dropout {dropout} is not supported (fattn has no dropout); set "
            "the model's attention_dropout to 0.0 or call model.eval()")
    if kwargs.get("output_attentions"):
        raise NotImplementedError("fattn: output_attentions=True is not supported (fattn "
                                  "never forms the attention weights); use 'eager' for them")
    if kwargs.get("position_bias") is not None:
        raise NotImplementedError("fattn: position_bias (a learned additive bias) is not "
                                  "supported yet")
    q_len, kv_len = query.size(2), key.size(2)
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    # As transformers' SDPA path: the causal flag only without a mask, for more than one query.
    causal = bool(causal) and attention_mask is None and q_len > 1
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        attention_mask = attention_mask.to(query.dtype)
    window = (-1, -1)
    if attention_mask is None and sliding_window:  # key j visible iff i − j < sliding_window
        window = (int(sliding_window) - 1, 0 if causal else -1)
    if causal and kv_len > q_len:  # transformers' empty static-cache prefill: top-left keys
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    out, _ = torch.ops.fattn.attention(
        query, key, value, causal, False, scaling, "auto", attention_mask, window[0], window[1],
        float(softcap) if softcap else 0.0, None, per_head(s_aux, query))
    return out.transpose(1, 2).contiguous(), None


def register(name: str = "fattn") -> str:
    """Registers fattn's attention function and its mask format with transformers under
    ``name`` (then ``attn_implementation=name``); returns the name."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as e:
        raise ImportError("fattn.transformers.register needs the transformers package "
                          f"(tested with transformers=={TESTED_VERSION})") from e
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
