"""``python -m service.cli``: the ``rlvr`` command."""
import sys

from service.cli.main import app

sys.exit(app())
