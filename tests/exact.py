"""Make a float64 tiny Llama float64 all the way through, for the invariance tests.

transformers computes two pieces in float32 whatever the model's dtype: RMSNorm's variance (it casts
the hidden state down) and RoPE's cos/sin. Both are exact *per element*, but a float32 rounding step
turns the ~1e-16 differences that a changed summation order leaves in float64 into 1-ulp float32 flips
(~1e-7), and elementwise cos/sin may round differently in a vector lane and in a scalar tail, which
depends on the batch's width. The tests compare two ways of computing the same update (micro-batches,
skipped rows, two ranks), so they patch these two to keep the input's dtype: what remains is float64
round-off, and the tolerance can be derived from float64's epsilon instead of tuned to one CPU.
"""
from __future__ import annotations

import torch


def _rms_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    if hidden_states.dtype != torch.float64:
        return _ORIG["rms"](self, hidden_states)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _rope_forward(self, x, position_ids):
    if x.dtype != torch.float64:
        return _ORIG["rope"](self, x, position_ids)
    freqs = position_ids[..., None].double() * self.inv_freq.to(device=x.device, dtype=torch.float64)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


_ORIG: dict = {}


def install() -> None:
    """Patch LlamaRMSNorm and LlamaRotaryEmbedding for float64 inputs (float32 behaviour unchanged)."""
    from transformers.models.llama import modeling_llama as m

    if not _ORIG:
        _ORIG["rms"], _ORIG["rope"] = m.LlamaRMSNorm.forward, m.LlamaRotaryEmbedding.forward
    m.LlamaRMSNorm.forward = _rms_forward
    m.LlamaRotaryEmbedding.forward = _rope_forward


def uninstall() -> None:
    from transformers.models.llama import modeling_llama as m

    if _ORIG:
        m.LlamaRMSNorm.forward, m.LlamaRotaryEmbedding.forward = _ORIG["rms"], _ORIG["rope"]
