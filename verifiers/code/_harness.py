# Runs INSIDE the jail, appended to values.py's source (so ``encode``/``decode`` are in scope).
# It loads the candidate, calls the entry point once per recorded call and writes each result as one
# JSON line. It holds no expected values and decides nothing: whatever it (or a candidate that
# tampers with it) writes is only a plain value that the judge, outside, compares.
import json as _json
import os as _os
import sys as _sys


def _main():
    req = _json.loads(_sys.stdin.buffer.read())
    out = _os.dup(1)                 # our channel; the candidate's prints go to stderr instead
    _os.dup2(2, 1)
    null = _os.open("/dev/null", _os.O_RDONLY)
    _os.dup2(null, 0)                # and it has no stdin to read

    def emit(obj):
        data = (_json.dumps(obj) + "\n").encode()
        while data:
            data = data[_os.write(out, data):]

    g = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(compile(req["code"], "solution.py", "exec"), g)
    except BaseException as e:  # noqa: BLE001 - any failure to load is the candidate's
        emit({"load_error": f"{type(e).__name__}: {e}"[:500]})
        return
    fn = g.get(req["entry_point"])
    if not callable(fn):
        emit({"load_error": f"no function named {req['entry_point']!r}"})
        return
    for args, kwargs in req["calls"]:
        try:
            r = fn(*decode(args), **decode(kwargs))
            line = {"ok": encode(r)}
        except BaseException as e:  # noqa: BLE001 - reported, judged outside
            line = {"exc": type(e).__name__}
        emit(line)


_main()
_sys.stdout.flush()
