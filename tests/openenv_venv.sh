#!/usr/bin/env bash
# The venv of the real OpenEnv server tests/test_openenv_server.py starts (openenv 0.10 pins Pillow < 13, which
# the project's venv is past): openenv and exactly what constraints-openenv.txt pins, built once per version of
# that file (tests/cached_venv.sh: a clean clone links it in a second instead of ~110 packages); the checkout's
# .cache/openenv-venv is a link to it. The venv holds nothing of any checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
. tests/cached_venv.sh
PINS=constraints-openenv.txt

build() {
  "$1/bin/python" -m pip install -q --upgrade pip
  "$1/bin/python" -m pip install -q -c "$PINS" openenv==0.10.0
  "$1/bin/python" -c "import openenv.core.env_server"
}
cached_venv openenv "$PINS" build

mkdir -p .cache
if [ "$(readlink .cache/openenv-venv 2>/dev/null)" != "$base" ]; then
  rm -rf .cache/openenv-venv
  ln -s "$base" .cache/openenv-venv
fi
.cache/openenv-venv/bin/python -c "import openenv.core.env_server"  # a broken cache fails here, not in a skip
