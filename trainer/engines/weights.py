"""Which weights an engine samples with: a version counter on the policy, bumped by whoever updates it.

An engine that keeps its own copy of the weights (vLLM) pushes the policy's weights into it before a
generate whenever this version moved since its last push. The count is explicit because tensors'
``_version`` counters cannot be trusted for it: the fused AdamW step the trainer uses updates the
parameters without bumping them (torch 2.13: every weight changed, the summed ``_version`` stayed 4 -> 4),
so an engine watching them never saw an optimiser step.
"""
from __future__ import annotations

ATTR = "rlvr_weights_version"


def changed(model) -> int:
    """Say that ``model``'s weights were updated in place (an optimiser step, weights copied in);
    returns the new version."""
    v = version(model) + 1
    setattr(model, ATTR, v)
    return v


def version(model) -> int:
    """How many updates ``model`` has had (0 for a model nobody has updated)."""
    return getattr(model, ATTR, 0)
