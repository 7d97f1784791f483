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
autograd.

What fattn cannot do raises an error naming the option (dropout > 0 while training,
attention weights asked for); nothing falls back to another implementation.

``append_cache(config)`` is transformers' DynamicCache with its full-attention layers
appending in place, for inference: each layer keeps K and V in buffers that grow by
doubling (up to twice the tokens held), writes a step's new tokens into them and returns
views of the filled part, which fattn reads as they lie. DynamicCache concatenates the whole
cache into new tensors at every step (a copy of every layer's K and V, and fresh pages for
them, per generated token), which at long contexts costs more than the attention itself
(docs/perf-log.md, 2026-11-27, "transformers decode: a cache that appends in place"). Pass
it as ``cache=fattn.transformers.append_cache(model.config)`` to ``generate`` or a forward
call; the sliding-window layers stay transformers' own (their size is bounded). Where
gradients flow into the new keys or values, a layer concatenates as DynamicCache does.

transformers itself is imported only by ``register`` and ``append_cache``.
"""
from __future__ import annotations

import functools

import torch

from .functional import per_head, sliding_window as sliding_window_of

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
    # With a mask, transformers has put the window in it.
    window = sliding_window_of(None if attention_mask is not None else sliding_window, causal)
    if causal and kv_len > q_len:  # transformers' empty static-cache prefill: top-left keys
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    out, _ = torch.ops.fattn.attention(
        query, key, value, causal, False, scaling, "auto", attention_mask, window[0], window[1],
        float(softcap) if softcap else 0.0, None, per_head(s_aux, query))
    return out.transpose(1, 2).contiguous(), None


# Capacity of a new buffer, in tokens: at least this many, or twice what the first update
# brings, so a prompt and its first steps share one allocation.
_FIRST_CAPACITY = 256


@functools.lru_cache(maxsize=None)
def _append_layer_class():
    """AppendLayer, defined on first use: transformers is imported only here and by
    register."""
    from transformers.cache_utils import DynamicLayer

    class AppendLayer(DynamicLayer):
        """DynamicLayer's contract (keys and values (B, H, S, D), grown by update) on buffers
        of (B, H, capacity, D) that grow by doubling: update copies the new tokens in place
        and returns views of the first S positions. Whatever replaces keys or values from
        outside (DynamicLayer's reorder_cache, batch_select_indices, offload, ...) is taken
        as the new content on the next update."""

        _layer_type = None  # never registered as transformers' own layer type
        _buffers = None     # (K buffer, V buffer)
        _views = None       # the (keys, values) views update returned last

        def _ours(self) -> bool:
            """Whether keys and values are still the views of the buffers update left."""
            return (self._views is not None and self.keys is self._views[0]
                    and self.values is self._views[1])

        def _fits(self, need: int, key_states, value_states) -> bool:
            """Whether the buffers take `need` tokens of these keys and values: each buffer
            their batch, heads, head dim, dtype and device, and (inference tensors)
            inference mode as it is now."""
            def fits(buffer, states):
                return (need <= buffer.shape[-2] and buffer.shape[:2] == states.shape[:2]
                        and buffer.shape[-1] == states.shape[-1]
                        and buffer.dtype == states.dtype and buffer.device == states.device
                        and (torch.is_inference_mode_enabled() or not buffer.is_inference()))
            return fits(self._buffers[0], key_states) and fits(self._buffers[1], value_states)

        def _make_room(self, add: int, key_states, value_states) -> int:
            """Room for `add` more tokens; returns how many the buffers hold. The buffers as
            they are while keys and values are still their views and they fit; else new
            ones of twice the tokens (at least _FIRST_CAPACITY) holding the current keys
            and values."""
            held = self.get_seq_length()
            need = held + add
            if self._ours() and self._fits(need, key_states, value_states):
                return held
            capacity = max(_FIRST_CAPACITY, 2 * need)

            def grown(current, states):
                b, h, _, d = states.shape
                buffer = states.new_empty((b, h, capacity, d))
                if held:
                    buffer[:, :, :held].copy_(current)
                return buffer

            self._buffers = (grown(self.keys, key_states), grown(self.values, value_states))
            return held

        def _check_extends(self, key_states, value_states) -> None:
            """New keys and values (B, H, S, D) that extend the held ones: the same batch,
            heads and tokens as each other, and the same batch, heads and head dim as the
            held ones (once any are held)."""
            if key_states.dim() != 4 or value_states.dim() != 4:
                raise ValueError(
                    "fattn append_cache: key_states and value_states must be (batch, heads, "
                    f"tokens, head_dim), got {tuple(key_states.shape)} and "
                    f"{tuple(value_states.shape)}")
            if key_states.shape[:3] != value_states.shape[:3]:
                raise ValueError(
                    "fattn append_cache: key_states and value_states must have the same batch, "
                    f"heads and tokens, got {tuple(key_states.shape)} and "
                    f"{tuple(value_states.shape)}")
            if not self.get_seq_length():
                return
            for name, states, held in (("key_states", key_states, self.keys),
                                       ("value_states", value_states, self.values)):
                if states.shape[:2] != held.shape[:2] or states.shape[-1] != held.shape[-1]:
                    raise ValueError(
                        f"fattn append_cache: {name} of shape {tuple(states.shape)} do not extend "
                        f"the {held.shape[-2]} cached tokens of shape {tuple(held.shape)}: "
                        "batch, heads and head_dim must match (reset the cache, or select its "
                        "batch rows first)")

        def update(self, key_states, value_states, *args, **kwargs):
            if torch.is_grad_enabled() and (key_states.requires_grad or value_states.requires_grad):
                # An in-place write would change tensors autograd saved: concatenate.
                self._buffers = self._views = None
                return super().update(key_states, value_states, *args, **kwargs)
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            self._check_extends(key_states, value_states)
            held = self._make_room(key_states.shape[-2], key_states, value_states)
            end = held + key_states.shape[-2]
            k_buf, v_buf = self._buffers
            k_buf[:, :, held:end].copy_(key_states)
            v_buf[:, :, held:end].copy_(value_states)
            self.keys, self.values = k_buf[:, :, :end], v_buf[:, :, :end]
            self._views = (self.keys, self.values)
            return self.keys, self.values

        def crop(self, tokens_to_remove: int) -> None:
            ours = self._ours()
            super().crop(tokens_to_remove)  # its checks, then shorter views of the buffers
            if ours:
                self._views = (self.keys, self.values)

        def reset(self) -> None:
            self._buffers = self._views = None
            super().reset()

        def offload(self):
            self._buffers = self._views = None  # the offloaded copies are the content now
            super().offload()

    return AppendLayer


def append_cache(config=None):
    """transformers' DynamicCache (for ``config``'s layer types) whose full-attention layers
    append in place (see the module's docstring)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer
    layer = _append_layer_class()
    cache = DynamicCache(config=config)
    cache.layers = [layer() if type(x) is DynamicLayer else x for x in cache.layers]
    if cache.layer_class_to_replicate is DynamicLayer:  # no config: layers made on first use
        cache.layer_class_to_replicate = layer
    return cache


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
