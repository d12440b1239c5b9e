"""The Tinker protocol's ids and paths, composed in one place: a session's models and samplers are
``{session}:train:{seq}`` / ``{session}:sample:{seq}`` (as the SDK builds them), saved weights
``tinker://{model}/weights/{name}`` (a training state) or ``tinker://{model}/sampler_weights/{name}``."""
from __future__ import annotations

from typing import Literal

TINKER = "tinker://"


def model_id(session_id: str, seq: int) -> str:
    return f"{session_id}:train:{seq}"


def sampler_id(session_id: str, seq: int) -> str:
    return f"{session_id}:sample:{seq}"


def weights_path(model: str, kind: Literal["weights", "sampler_weights"], name: str) -> str:
    return f"{TINKER}{model}/{kind}/{name}"
