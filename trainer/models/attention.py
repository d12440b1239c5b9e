"""Grouped-query attention without ``repeat_kv`` on the CPU.

transformers' SDPA path copies every key/value head out to the query heads it serves (``repeat_kv``) whenever an
attention mask is passed: only CUDA without a mask gets torch's ``enable_gqa``. Our forwards always pass one (left
padding), so on SmolLM2 (9 query heads, 3 key/value heads) every multi-token attention call materialised its
keys and values three times, and the backward zero-filled and summed the three copies' gradients. torch's CPU
flash-attention kernel reads a key/value head once for its group of query heads, mask or not.

Measured on one thread (tests/test_attention_gqa.py checks the numbers; bench/update.py the speed): the attention
output and the query gradient are bitwise the ``repeat_kv`` ones; the key/value gradients sum the same three
per-head terms in another order, so they agree to fp32 rounding and are as close to a float64 reference. Only
float32 takes this path (in bfloat16 the kernel's own accumulation measured further from float64 on one shape);
other dtypes, devices, single-token decode (transformers already packs it) and anything else go to the stock
function unchanged.

One more case, for the sampler only: a decode step whose forward passes a shared-prompt cache (``SHARED_KV``,
trainer/engines/kv.py ``SharedPromptLayer``) attends over each prompt's keys and values held once for its group
of samples. ``shared_prompt_attention`` switches a model on "sdpa" to this function for one ``generate`` call.
And one for the update's forwards: a packed row of prompts and completions (``SEGMENTS``,
trainer/models/segments.py) attends by its segments; ``shared_prompt_attention`` switches the model for that call.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

NAME = "rlvr_sdpa_gqa"
SHARED_KV = "rlvr_shared_kv"  # the forward's keyword for a cache whose layers hold each prompt once (engines/kv.py)
SEGMENTS = "rlvr_segments"  # the forward's keyword for a packed row of prompts and completions (segments.py)


def _attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
               **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    segments = kwargs.pop(SEGMENTS, None)  # one packed row of prompts and completions (trainer/models/segments.py)
    if segments is not None:
        return segments.attend(query, key, value, scaling, dropout), None
    shared = kwargs.pop(SHARED_KV, None)  # a cache holding each prompt once (module docstring), via the forward
    if shared is not None:
        layer = shared.layers[module.layer_idx]
        out = None if _unusual(kwargs) or dropout else layer.attend(query, key, value, scaling)
        if out is not None:
            return out, None
        key, value = layer.full(key, value)  # the per-row layout the stock path and its mask expect
        if attention_mask is None:  # the sampler passes none to a shared-prompt decode step (engines/hf.py)
            attention_mask = layer.mask(query.dtype, key.shape[-2])
    groups = getattr(module, "num_key_value_groups", 1)
    if (groups == 1 or attention_mask is None or query.shape[2] == 1 or query.device.type != "cpu"
            or query.dtype != torch.float32 or kwargs.get("position_bias") is not None
            or kwargs.get("softcap") is not None or kwargs.get("output_attentions")):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    # what sdpa_attention_forward does with a mask (is_causal is False then), minus the copies
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def _unusual(kwargs) -> bool:  # anything the plain attention over keys and a padding mask would not honour
    return any(kwargs.get(k) is not None for k in ("position_bias", "softcap", "s_aux", "sinks", "sliding_window")) \
        or bool(kwargs.get("output_attentions"))


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    if NAME not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionInterface.register(NAME, _attention)
        AttentionMaskInterface.register(NAME, sdpa_mask)  # the very masks the "sdpa" implementation gets


def gqa_in_kernel(model):
    """Switch a model on transformers' SDPA attention to the same attention without the key/value copies (a
    no-op for any other implementation or a model without grouped heads). Returns the model."""
    cfg = model.config.get_text_config()
    heads, kv = getattr(cfg, "num_attention_heads", None), getattr(cfg, "num_key_value_heads", None)
    if getattr(model.config, "_attn_implementation", None) != "sdpa" or not heads or not kv or kv == heads:
        return model
    if tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 5):  # no enable_gqa before 2.5
        return model
    _register()
    model.set_attn_implementation(NAME)
    return model


@contextmanager
def shared_prompt_attention(model):
    """For the duration: a model on transformers' SDPA attention runs ours (the same function as "sdpa" for
    anything but the decode of a shared-prompt cache, ``SHARED_KV``, or a packed row, ``SEGMENTS``). Yields
    whether forwards may pass either; a model on any other attention (eager, flash, a sliding window's masks) is
    left as it is and yields False."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    impl = getattr(getattr(base, "config", None), "_attn_implementation", None)
    device = getattr(base, "device", None)
    if impl not in ("sdpa", NAME) or device is None or device.type != "cpu" \
            or not hasattr(base, "set_attn_implementation"):
        yield False
        return
    _register()
    if impl == NAME:
        yield True
        return
    base.set_attn_implementation(NAME)
    try:
        yield True
    finally:
        base.set_attn_implementation(impl)
