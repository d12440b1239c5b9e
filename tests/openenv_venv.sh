#!/usr/bin/env bash
# The venv of the real OpenEnv server tests/test_openenv_server.py starts (openenv 0.10 pins Pillow < 13, which
# the project's venv is past): openenv and exactly what constraints-openenv.txt pins.
#
# Built once per key = hash(constraints-openenv.txt, python -VV) under $RLVR_CACHE (default ~/.cache/rlvr), so
# a clean clone (CI) links it in a second instead of installing ~110 packages (~4 min); .cache/openenv-venv
# in the checkout is a link to it. The venv holds nothing of any checkout. A build runs under a lock and is
# renamed into place only once complete (its scripts' shebangs name the build path: use bin/python -m);
# cached venvs unused for 7 days go.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
CACHE="${RLVR_CACHE:-$HOME/.cache/rlvr}"
PINS=constraints-openenv.txt
key=$({ cat "$PINS"; "$PY" -VV; } | sha256sum | cut -c1-16)
base="$CACHE/venv-openenv-$key"
mkdir -p "$CACHE" .cache

(
  flock 9
  if [ ! -f "$base/.complete" ]; then
    t0=$(date +%s)
    tmp="$base.tmp.$$"
    rm -rf "$tmp"
    "$PY" -m venv "$tmp"
    "$tmp/bin/python" -m pip install -q --upgrade pip
    "$tmp/bin/python" -m pip install -q -c "$PINS" openenv==0.10.0
    "$tmp/bin/python" -c "import openenv.core.env_server"
    touch "$tmp/.complete"
    rm -rf "$base"
    mv "$tmp" "$base"
    echo "built $base in $(( $(date +%s) - t0 )) s"
  fi
  touch "$base/.used"
  find "$CACHE" -maxdepth 2 -path "$CACHE/venv-openenv-*/.used" -mtime +7 -printf '%h\n' | xargs -r rm -rf
) 9>"$CACHE/venv-openenv.lock"

if [ "$(readlink .cache/openenv-venv 2>/dev/null)" != "$base" ]; then
  rm -rf .cache/openenv-venv
  ln -s "$base" .cache/openenv-venv
fi
.cache/openenv-venv/bin/python -c "import openenv.core.env_server"  # a broken cache fails here, not in a skip
