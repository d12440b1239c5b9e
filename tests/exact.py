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

import importlib.abc
import importlib.util
import sys


def _rms_forward(self, hidden_states):
    import torch  # here, not at the top: install_on_import's processes import torch only when they need it

    if hidden_states.dtype != torch.float64:
        return _ORIG["rms"](self, hidden_states)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _rope_forward(self, x, position_ids):
    import torch

    if x.dtype != torch.float64:
        return _ORIG["rope"](self, x, position_ids)
    freqs = position_ids[..., None].double() * self.inv_freq.to(device=x.device, dtype=torch.float64)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


_ORIG: dict = {}


def install(m=None) -> None:
    """Patch LlamaRMSNorm and LlamaRotaryEmbedding for float64 inputs (float32 behaviour unchanged); ``m``:
    transformers' modeling_llama module (default: imported here)."""
    if m is None:
        from transformers.models.llama import modeling_llama as m

    if not _ORIG:
        _ORIG["rms"], _ORIG["rope"] = m.LlamaRMSNorm.forward, m.LlamaRotaryEmbedding.forward
    m.LlamaRMSNorm.forward = _rms_forward
    m.LlamaRotaryEmbedding.forward = _rope_forward


def uninstall() -> None:
    from transformers.models.llama import modeling_llama as m

    if _ORIG:
        m.LlamaRMSNorm.forward, m.LlamaRotaryEmbedding.forward = _ORIG["rms"], _ORIG["rope"]


_LLAMA = "transformers.models.llama.modeling_llama"


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``_LLAMA`` is about to load, it steps aside, lets the other finders find it,
    and has its loader call ``install`` right after the module runs."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _LLAMA:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:  # not installed: the import fails as it would without us
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            install(module)

        spec.loader.exec_module = exec_module
        return spec


def install_on_import() -> None:
    """``install`` once a process imports transformers' Llama module, and not before: a process that never
    does (the API, a CLI call) does not pay torch's and transformers' imports at startup (tests/tinker_server.py's
    sitecustomize runs in every process it starts; importing them there took 7 s a process on a slow host)."""
    if _LLAMA in sys.modules:
        install(sys.modules[_LLAMA])
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
