"""The losses the training primitives serve (Tinker's ``forward_backward(data, loss_fn, loss_fn_config)``): one
record per loss — the function's name in trainer.algos, the datum inputs it reads, its config keys with their
defaults — read by the API door (a 422 before anything is queued) and by the session worker alike. Torch-free:
the door checks a request without loading torch; the function is looked up where the loss runs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class DatumLoss:
    fn: str                      # the per-token loss in trainer.algos: (logp, inputs, config) -> (N,)
    inputs: tuple[str, ...]      # loss_fn_inputs it reads besides target_tokens (a missing `weights` is all ones)
    config: dict[str, float]     # loss_fn_config keys (Tinker's names) and their defaults; others are refused


DATUM_LOSSES: dict[str, DatumLoss] = {
    "cross_entropy": DatumLoss("datum_cross_entropy", ("weights",), {}),
    "importance_sampling": DatumLoss("datum_importance_sampling", ("logprobs", "advantages"), {}),
    "ppo": DatumLoss("datum_ppo", ("logprobs", "advantages"), {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
    "cispo": DatumLoss("datum_cispo", ("logprobs", "advantages"),
                       {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
    # Tinker documents beta (its example: 0.05), not its default: 0.05 here (docs/tinker.md says so)
    "dro": DatumLoss("datum_dro", ("logprobs", "advantages"), {"beta": 0.05}),
}


def datum_loss_errors(loss_fn: str, config: dict[str, float], inputs: list[set[str]]) -> list[tuple[tuple, str]]:
    """Why a forward_backward request cannot run, as (location, message); ``inputs``: each datum's input names."""
    loss = DATUM_LOSSES.get(loss_fn)
    if loss is None:
        return [(("loss_fn",), f"loss_fn {loss_fn!r} is not served here; known: {', '.join(sorted(DATUM_LOSSES))}")]
    errors = [(("loss_fn_config", k), f"not a {loss_fn} setting; known: {sorted(loss.config) or 'none'}")
              for k in sorted(set(config) - set(loss.config))]
    for i, names in enumerate(inputs):
        errors += [(("data", i, "loss_fn_inputs", n), f"required by {loss_fn}")
                   for n in loss.inputs if n != "weights" and n not in names]
    return errors[:20]


def datum_loss(loss_fn: str) -> tuple[Callable, dict[str, float]]:
    """The loss's function (trainer.algos) and its default config."""
    from . import algos

    loss = DATUM_LOSSES[loss_fn]
    return getattr(algos, loss.fn), loss.config
