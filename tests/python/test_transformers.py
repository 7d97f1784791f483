"""fattn as a transformers attention backend: tiny random models (Llama: GQA; Mistral:
sliding window; Gemma 2: softcap and alternating sliding windows; gpt-oss: sinks) against
transformers' own "eager" attention (float32, the plain formula) on logits of unpadded
and left-padded batches, greedy generate() of 32 tokens with a KV cache, bfloat16 logits
within the 16-bit rule, the gradients of a training step, and a BERT-style encoder
trained with attention dropout beside transformers' SDPA."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

import fattn.transformers  # noqa: E402

NAME = fattn.transformers.register()


def tiny(kind, attn):
    torch.manual_seed(0)
    common = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  max_position_embeddings=256, attn_implementation=attn)
    if kind == "llama":
        config = transformers.LlamaConfig(**common)
        model = transformers.LlamaForCausalLM(config)
    elif kind == "mistral":
        config = transformers.MistralConfig(**common, sliding_window=8)
        model = transformers.MistralForCausalLM(config)
    elif kind == "gemma2":
        config = transformers.Gemma2Config(**common, sliding_window=8,
                                           attn_logit_softcapping=3.0,  # scores reach it
                                           final_logit_softcapping=None)
        model = transformers.Gemma2ForCausalLM(config)
    else:
        config = transformers.GptOssConfig(**common, num_local_experts=2, num_experts_per_tok=1,
                                           sliding_window=8)
        model = transformers.GptOssForCausalLM(config)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0, 2)
    with torch.no_grad():  # scores of order 1-10, not the ~1e-3 of the initial weights
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(12.0)
            layer.self_attn.k_proj.weight.mul_(12.0)
    return model.eval()


def batch(padded):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 101, (3, 21), generator=g)
    mask = torch.ones_like(ids)
    if padded:  # left padding, as generate() pads a batch
        mask[0, :7] = 0
        mask[1, :2] = 0
    return ids, mask


KINDS = ["llama", "mistral", "gemma2", "gpt_oss"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("padded", [False, True])
def test_logits_match_eager(kind, padded):
    ids, mask = batch(padded)
    with torch.no_grad():
        ours = tiny(kind, NAME)(input_ids=ids, attention_mask=mask).logits
        ref = tiny(kind, "eager")(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()  # logits at padding positions mean nothing
    err = (ours[keep] - ref[keep]).abs().max().item()
    assert err <= 1e-4 * max(1.0, ref[keep].abs().max().item()), err


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_generate_matches_eager(kind):
    ids, mask = batch(padded=True)  # prompts of 14, 19 and 21 tokens
    kw = dict(attention_mask=mask, max_new_tokens=32, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        ours = tiny(kind, NAME).generate(ids, **kw)
        ref = tiny(kind, "eager").generate(ids, **kw)
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("kind", ["llama", "gemma2"])
def test_bfloat16_logits_within_rule(kind):
    """bfloat16 models: the logits' error against the float64 model at most 2x that of
    transformers' "sdpa" in bfloat16 ("eager" for Gemma 2's softcap), plus one bfloat16 ulp
    at the largest logit. The float64 model runs fattn's float64 reference (transformers'
    eager path gives NaN in float64 on padded batches; its float32 logits match fattn's
    above)."""
    ids, mask = batch(padded=True)
    keep = mask.bool()
    with torch.no_grad():
        ref = tiny(kind, NAME).double()(input_ids=ids, attention_mask=mask).logits[keep]
        errors = {}
        for attn in (NAME, "sdpa" if kind == "llama" else "eager"):
            logits = tiny(kind, attn).bfloat16()(input_ids=ids, attention_mask=mask).logits
            errors[attn] = (logits[keep].double() - ref).abs().max().item()
    theirs = [e for a, e in errors.items() if a != NAME][0]
    floor = ref.abs().max().item() * 2.0 ** -7
    assert errors[NAME] <= 2 * theirs + floor, errors


@pytest.mark.parametrize("kind", ["llama", "gpt_oss"])
def test_training_gradients_match_eager(kind):
    ids, mask = batch(padded=False)
    grads = []
    for attn in (NAME, "eager"):
        model = tiny(kind, attn).train()
        model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    ours, ref = grads
    assert ours.keys() == ref.keys()
    for n in ref:
        bound = 1e-4 * max(1e-3, ref[n].abs().max().item())
        assert (ours[n] - ref[n]).abs().max().item() <= bound, n


def bert_losses(attn, steps=40, p=0.1):
    """A tiny BERT-style encoder (bidirectional attention, attention dropout p, no other
    dropout) trained for `steps` AdamW steps on one masked-language-model batch: the loss
    of each step, from torch.manual_seed(0) (weights, data and dropout draws)."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=101, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=96,
                                     max_position_embeddings=64, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=p, attn_implementation=attn)
    model = transformers.BertForMaskedLM(config).train()
    ids = torch.randint(5, 101, (8, 24))
    labels = torch.where(torch.rand(ids.shape) < 0.3, ids, torch.full_like(ids, -100))
    inputs = torch.where(labels >= 0, torch.full_like(ids, 4), ids)  # [MASK] = 4
    mask = torch.ones_like(ids)
    mask[0, 20:] = 0  # padding in two rows
    mask[3, 17:] = 0
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        loss = model(input_ids=inputs, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_bert_trains_with_attention_dropout_as_sdpa_does():
    """The loss curve on fattn with attention dropout 0.1 within the noise of transformers'
    SDPA one (same seeds policy; the masks themselves differ): both fall by more than half,
    the last 10 steps' mean losses within 5 % of each other (0.4 % on dev-zen4); and the dropout is applied
    (the curve differs from p = 0's)."""
    ours, theirs = bert_losses(NAME), bert_losses("sdpa")
    for curve in (ours, theirs):
        assert curve[-1] < 0.5 * curve[0], curve
    tail = lambda c: sum(c[-10:]) / 10  # noqa: E731
    assert abs(tail(ours) - tail(theirs)) <= 0.05 * tail(theirs), (tail(ours), tail(theirs))
    assert bert_losses(NAME, steps=3, p=0.0) != ours[:3]
    assert bert_losses(NAME, steps=3) == ours[:3]  # reproducible from torch.manual_seed


@pytest.mark.parametrize("kind", KINDS)
def test_generate_with_append_cache_gives_the_same_tokens(kind):
    """append_cache through generate(): 300 new tokens (EOS suppressed), so the buffers grow
    past their first capacity (256 tokens); the same tokens as with transformers'
    DynamicCache (fattn reads K and V as they lie: the same bits from the buffers' views as
    from contiguous copies). Mistral's layers are all sliding-window ones, which stay
    transformers' own."""
    ids, mask = batch(padded=True)
    kw = dict(attention_mask=mask, max_new_tokens=300, min_new_tokens=300, do_sample=False,
              pad_token_id=0)
    model = tiny(kind, NAME)
    with torch.no_grad():
        cache = fattn.transformers.append_cache(model.config)
        ours = model.generate(ids, cache=cache, **kw)
        ref = model.generate(ids, cache=transformers.DynamicCache(config=model.config), **kw)
    assert torch.equal(ours, ref)
    appended = [x for x in cache.layers if type(x).__name__ == "AppendLayer"]
    types = getattr(model.config, "layer_types", None) or ["full_attention"] * len(cache.layers)
    assert len(appended) == (0 if kind == "mistral" else types.count("full_attention"))
    for layer in appended:
        assert layer.keys.shape[-2] == ours.shape[1] - 1
        assert layer.keys.data_ptr() == layer._buffers[0].data_ptr()  # a view, not a copy


def test_append_cache_keeps_dynamic_caches_contents():
    """Update by update, crop and batch selection (beam search's path): the same keys and
    values as DynamicCache, and a step within capacity writes into the same buffers."""
    from transformers import DynamicCache
    g = torch.Generator().manual_seed(3)
    ours, ref = fattn.transformers.append_cache(), DynamicCache()

    def step(tokens, batch_size=2):
        k, v = (torch.randn(batch_size, 2, tokens, 16, generator=g) for _ in range(2))
        a, b = ours.update(k, v, 0), ref.update(k.clone(), v.clone(), 0)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        return a[0].data_ptr()

    step(100)
    first = step(1)
    while ours.get_seq_length() < 256:
        assert step(1) == first  # within the first capacity: in place
    assert step(1) != first  # past it: new buffers, holding what the old ones held
    within = step(1)
    ours.crop(-5)
    ref.crop(-5)
    assert step(3) == within  # the crop kept the buffers
    ours.batch_select_indices(torch.tensor([1]))
    ref.batch_select_indices(torch.tensor([1]))
    step(2, batch_size=1)  # the selected rows taken as the new content
    assert ours.get_seq_length() == ref.get_seq_length()


def test_append_cache_rejects_states_that_do_not_extend_it():
    """New keys or values of another batch size, head count or head dim than the cached ones,
    or keys and values of different batch, heads or tokens: a ValueError naming the
    argument and both shapes, and the cache as it was."""
    g = torch.Generator().manual_seed(5)
    cache = fattn.transformers.append_cache()
    keys, values = (torch.randn(2, 3, 5, 8, generator=g) for _ in range(2))
    cache.update(keys, values, 0)
    for k_shape, v_shape, message in (
            ((4, 3, 1, 8), (4, 3, 1, 8), r"key_states of shape \(4, 3, 1, 8\) do not extend the 5 "
                                         r"cached tokens of shape \(2, 3, 5, 8\)"),
            ((2, 3, 1, 8), (2, 1, 1, 8), r"same batch, heads and tokens, got \(2, 3, 1, 8\) and "
                                         r"\(2, 1, 1, 8\)"),
            ((2, 3, 1, 8), (2, 3, 1, 4), r"value_states of shape \(2, 3, 1, 4\)"),
            ((2, 3, 1, 4), (2, 3, 1, 8), r"key_states of shape \(2, 3, 1, 4\)"),
            ((2, 3, 2, 8), (2, 3, 1, 8), r"same batch, heads and tokens, got \(2, 3, 2, 8\) and"),
            ((2, 3, 8), (2, 3, 1, 8), r"\(batch, heads, tokens, head_dim\)")):
        with pytest.raises(ValueError, match=message):
            cache.update(torch.randn(k_shape, generator=g), torch.randn(v_shape, generator=g), 0)
    assert torch.equal(cache.layers[0].keys, keys) and torch.equal(cache.layers[0].values, values)
    # Cropped to nothing, the buffers kept: values of another head dim than the value
    # buffer's become the content, as in DynamicCache, in buffers of their own.
    cache.crop(-5)
    k, v = torch.randn(2, 3, 1, 8, generator=g), torch.randn(2, 3, 1, 4, generator=g)
    got_k, got_v = cache.update(k, v, 0)
    assert torch.equal(got_k, k) and torch.equal(got_v, v)


def test_append_cache_after_outside_changes():
    """What DynamicLayer allows, the append layer allows with the same contents: a crop before
    any update, a reorder then a crop then an update (the reordered rows, not the buffers'
    old ones), a reset, buffers made in inference mode updated outside it, a change of
    dtype, and new keys that require grad (concatenated, so backward works)."""
    from transformers import DynamicCache
    g = torch.Generator().manual_seed(4)
    ours, ref = fattn.transformers.append_cache(), DynamicCache()
    ours.crop(-1)  # nothing held yet: nothing to do
    ref.crop(-1)

    def step(tokens, dtype=torch.float32, requires_grad=False):
        k, v = (torch.randn(3, 2, tokens, 8, generator=g, dtype=dtype) for _ in range(2))
        k.requires_grad_(requires_grad)
        a, b = ours.update(k, v, 0), ref.update(k.detach().clone(), v.clone(), 0)
        assert a[0].shape == b[0].shape and torch.equal(a[0].detach(), b[0])
        assert torch.equal(a[1].detach(), b[1])
        return a

    with torch.inference_mode():
        step(10)
    step(1)  # inference-mode buffers, a step outside it: new buffers
    for cache in (ours, ref):
        cache.reorder_cache(torch.tensor([2, 0, 1]))
        cache.crop(-2)
    step(1)
    for cache in (ours, ref):
        cache.reset()
    step(4)
    step(1, dtype=torch.float64)  # the content follows the new dtype, as torch.cat's result
    keys, _ = step(1, requires_grad=True)
    keys.sum().backward()
