"""No server paths in anything a tenant reads: error messages, events and verdict reasons pass through here."""
from __future__ import annotations

import re

_ABS_PATH = re.compile(r"(?<![\w.~:/\\-])/(?:[^\s'\"`,;:()\[\]{}<>|/]+/)+([^\s'\"`,;:()\[\]{}<>|/]*)")


def redact_paths(text: str) -> str:
    """Absolute server paths in a message (a worker's exception text, a broker error) → their last
    component: responses name files and checkpoints, never where they live on the server."""
    return _ABS_PATH.sub(lambda m: m.group(1) or "…", text) if "/" in text else text
