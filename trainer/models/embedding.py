"""The input embedding's gradient added straight into the weight's ``.grad`` (CPU training).

torch's embedding backward builds a dense zero tensor the size of the whole table, writes the used rows into it,
and hands it to the weight's gradient accumulator, once per embedding call. On SmolLM2 that table is
49,152 x 576 floats (113 MB), and an update called the embedding twice (the two-call shared-prompt forward embeds
the prompts and the completions apart; the packed row of trainer/models/segments.py once): profiled on one
thread, ~140 ms each of allocating, page-faulting and zeroing for an update of ~5.4 s, to add a few thousand
rows. Here the backward adds those rows into the weight's existing ``.grad`` (``index_add_``) and gives autograd
nothing for the weight: the same sum, no table.

Applied to the policy on the CPU only (a GPU's caching allocator already reuses the table, and CUDA's
``index_add_`` is not deterministic), never under FSDP (sharded weights) or to an embedding that renormalises,
scales by frequency or is sparse. The rows of ``padding_idx`` get no gradient, as in torch's own backward.
"""
from __future__ import annotations

import types

import torch

from . import grads


class _GradInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.weight, ctx.padding_idx = weight, padding_idx
        return torch.nn.functional.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (ids,) = ctx.saved_tensors
        w = ctx.weight
        flat, rows = ids.reshape(-1), grad.reshape(-1, grad.shape[-1])
        if ctx.padding_idx is not None:
            keep = flat != ctx.padding_idx
            flat, rows = flat[keep], rows[keep]
        live = grads.live(w)
        if w.grad is None:  # the tied output layer's accumulator, if it runs later, adds to this one in place
            w.grad = torch.zeros_like(w)
        elif not live:  # an earlier step's buffer (grads.py): rows are added, so it is zeroed here
            w.grad.zero_()
        w.grad.index_add_(0, flat, rows.to(w.grad.dtype))
        return None, None, None


def _forward(self: torch.nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled() and self.weight.requires_grad:
        return _GradInPlace.apply(ids, self.weight, self.padding_idx)
    return torch.nn.functional.embedding(ids, self.weight, self.padding_idx)


def grad_in_place(model: torch.nn.Module) -> bool:
    """Give ``model``'s input embedding the in-place backward (module docstring); whether it applied."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if (type(emb) is not torch.nn.Embedding or emb.weight.device.type != "cpu" or emb.max_norm is not None
            or emb.scale_grad_by_freq or emb.sparse):
        return False
    emb.forward = types.MethodType(_forward, emb)
    grads.adopt(emb.weight)
    return True
