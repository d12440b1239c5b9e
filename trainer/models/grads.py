"""Gradient buffers kept from step to step and overwritten, not zeroed, by a step's first write (CPU training).

trainer.context.optimize keeps every parameter's ``.grad`` between steps (a fresh buffer each step page-faults the
whole model in again). Zeroing them all costs a pass over every gradient (SmolLM2-135M: 540 MB, ~60 ms of a 2.7 s
update) only for a step's first weight product to add into zeros. So the buffers our in-place writers fill
(linear.py's weight products, embedding.py's rows) are marked stale instead (``zero``), and the first writer of a
step overwrites a stale buffer whole (a product with beta = 0, which reads nothing of it: NaN there never
propagates). Autograd's own accumulator may still reach such a weight (bf16 autocast, a weight used outside its
module): a hook on the parameter zeroes a stale buffer before autograd adds into it. ``finish`` zeroes what no
write reached by the end of the step. Every other parameter's buffer is zeroed as before.
"""
from __future__ import annotations

import weakref
from collections.abc import Iterable

import torch

_STALE = "_rlvr_stale_grad"  # on a parameter: its .grad holds an earlier step's values, to be overwritten
_OURS = "_rlvr_grad_writer"  # on a parameter: an in-place writer owns its .grad (adopt)


def adopt(p: torch.Tensor) -> None:
    """Mark ``p``'s gradient as one our in-place writers fill (they call ``live``), so that ``zero`` may leave it
    stale; autograd's accumulator, should it reach ``p``, finds a stale buffer zeroed first. A frozen weight is
    left alone (were it unfrozen later, ``zero`` zeroes its buffer as any other)."""
    if getattr(p, _OURS, False) or not p.requires_grad:
        return
    ref = weakref.ref(p)  # the hook lives on p: a strong reference would be a cycle

    def settle(grad: torch.Tensor) -> None:  # runs before autograd adds ``grad`` into p.grad
        q = ref()
        if q is not None and q.__dict__.pop(_STALE, False) and q.grad is not None:
            q.grad.zero_()

    p.register_hook(settle)
    setattr(p, _OURS, True)


def zero(params: Iterable[torch.Tensor]) -> None:
    """The start of a step (``optimizer.zero_grad(set_to_none=False)``'s place): adopted buffers marked stale,
    every other existing buffer zeroed in place."""
    rest = []
    for p in params:
        if p.grad is None:
            continue
        if getattr(p, _OURS, False):
            setattr(p, _STALE, True)
        else:
            rest.append(p.grad)
    if rest:
        torch._foreach_zero_(rest)


def live(p: torch.Tensor) -> bool:
    """For a writer, before it writes ``p.grad``: whether the buffer holds this step's sum so far (add into it);
    False when there is none or it is stale (write it whole). The buffer counts as this step's afterwards."""
    stale = p.__dict__.pop(_STALE, False)
    return p.grad is not None and not stale


def finish(params: Iterable[torch.Tensor]) -> None:
    """The end of a step's backwards: a buffer still stale (no write reached it: a layer the step skipped) is
    zeroed, so the optimiser reads a zero gradient, as it would have after ``zero_grad``."""
    for p in params:
        if p.__dict__.pop(_STALE, False) and p.grad is not None:
            p.grad.zero_()
