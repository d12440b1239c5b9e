# Sourced by tests/vllm_venv.sh and tests/openenv_venv.sh: a venv built once per key under $RLVR_CACHE
# (default ~/.cache/rlvr), outside any checkout, so that a clean clone (CI) pays for the install once.
#   cached_venv NAME PINS BUILD   sets $base to $RLVR_CACHE/venv-NAME-<key>, key = hash(PINS, python -VV);
#                                 builds it when missing by calling `BUILD DIR` on an empty venv DIR.
# A build runs under a lock and is renamed into place only once complete (its scripts' shebangs name the build
# path: use bin/python -m); cached venvs of NAME unused for 7 days go.
cached_venv() {
  local name=$1 pins=$2 build=$3
  PY="${PYTHON:-python3}"
  CACHE="${RLVR_CACHE:-$HOME/.cache/rlvr}"
  local key
  key=$({ cat "$pins"; "$PY" -VV; } | sha256sum | cut -c1-16)
  base="$CACHE/venv-$name-$key"
  mkdir -p "$CACHE"
  (
    flock 9
    if [ ! -f "$base/.complete" ]; then
      local t0 tmp
      t0=$(date +%s)
      tmp="$base.tmp.$$"
      rm -rf "$tmp"
      "$PY" -m venv "$tmp"
      "$build" "$tmp"
      touch "$tmp/.complete"
      rm -rf "$base"
      mv "$tmp" "$base"
      echo "built $base in $(( $(date +%s) - t0 )) s ($(du -sh "$base" | cut -f1))"
    fi
    touch "$base/.used"
    find "$CACHE" -maxdepth 2 -path "$CACHE/venv-$name-*/.used" -mtime +7 -printf '%h\n' | xargs -r rm -rf
  ) 9>"$CACHE/venv-$name.lock"
}
