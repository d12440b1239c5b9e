"""Which Python runs inside the jail, and which host paths it needs bound (read-only) to start.

Default: the interpreter running us (``sys.executable``, symlinks resolved: a venv's python is its base
interpreter), so the sandbox works wherever rlvr does — Debian's /usr/bin/python3.11, a python:3.11-slim
image's /usr/local, a pyenv or conda prefix. ``RLVR_SANDBOX_PYTHON`` picks another one.

Only what the interpreter needs is bound, never its whole prefix: the executable, its standard library
(pure and compiled parts, without its ``test`` package) and, when it is linked against one, its
``libpython`` — each at its host path, read-only. Its site-packages (pip, setuptools, whatever the host
installed, Debian's /usr/lib/python3/dist-packages) is covered by an empty tmpfs: jailed programs see the
standard library only, whichever interpreter it is.
Paths already inside the jail's /usr binds need no bind of their own.

bubblewrap runs as uid 65534, so it can bind only what that uid can reach. An interpreter it cannot reach
(a pyenv prefix under /root, mode 0700) is *staged* once: its files are hard-linked (copied across
filesystems, or when not world-readable) into a root-owned, world-readable directory
(``RLVR_SANDBOX_STAGE``, default /var/cache/rlvr/sandbox-python), and bound from there to their original
paths inside the jail, so the binary finds its libpython and stdlib where it was built to look.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .types import SandboxUnavailable

ENV = "RLVR_SANDBOX_PYTHON"
STAGE_ENV = "RLVR_SANDBOX_STAGE"
DEFAULT_STAGE = "/var/cache/rlvr/sandbox-python"
SKIP = {"site-packages", "dist-packages", "test", "idlelib", "turtledemo"}  # stdlib parts never needed
_ASK = (
    "import json, site, sys, sysconfig; v = sysconfig.get_config_var; p = sysconfig.get_paths();"
    "print(json.dumps({'stdlib': p['stdlib'], 'platstdlib': p['platstdlib'], 'site': site.getsitepackages(),"
    " 'shared': bool(v('Py_ENABLE_SHARED')), 'libdir': v('LIBDIR'), 'ldlibrary': v('LDLIBRARY'),"
    " 'instsoname': v('INSTSONAME'), 'version': sys.version.split()[0]}))"
)


@dataclass(frozen=True)
class Interpreter:
    executable: str                        # absolute, symlinks resolved; the same path inside the jail
    version: str
    binds: tuple[tuple[str, str], ...]     # (host source, path in the jail), bound read-only
    hidden: tuple[str, ...]                # directories inside bound ones covered by an empty tmpfs
    staged: str | None = None              # the staging directory, when the interpreter needed one

    def describe(self) -> str:
        return f"Python {self.version} at {self.executable}" + (f" (staged in {self.staged})" if self.staged else "")


def _covered(path: str, dirs: tuple[str, ...]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def reachable_by_others(path: str) -> bool:
    """Whether an unprivileged uid (not owner, not group) can walk to ``path`` and read it."""
    p = Path(path)
    for parent in p.parents:
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
    mode = os.stat(p).st_mode
    return bool(mode & stat.S_IROTH) and (not stat.S_ISDIR(mode) or bool(mode & stat.S_IXOTH))


@lru_cache(maxsize=8)
def resolve(path: str | None = None, covered: tuple[str, ...] = ()) -> Interpreter:
    """The jail's interpreter: ``path``, else $RLVR_SANDBOX_PYTHON, else the one running us. ``covered``:
    directories the jail binds anyway (its /usr parts). Raises :class:`SandboxUnavailable` with the reason."""
    chosen = path or os.environ.get(ENV) or sys.executable
    exe = os.path.realpath(chosen)
    if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        raise SandboxUnavailable(f"sandbox interpreter {chosen} not found or not executable (set {ENV})")
    try:
        out = subprocess.run([exe, "-I", "-S", "-c", _ASK], capture_output=True, timeout=30, env={}, check=True)
        info = json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        raise SandboxUnavailable(f"sandbox interpreter {exe} does not answer as a Python: {e}") from None
    paths = [exe] + [os.path.realpath(info[k]) for k in ("stdlib", "platstdlib")]
    if info["shared"] and info["libdir"]:  # linked against libpython: the dynamic loader needs it
        for name in sorted({info["ldlibrary"], info["instsoname"]} - {None, ""}):
            lib = os.path.join(info["libdir"], name)
            if os.path.exists(lib):
                paths.append(os.path.realpath(lib))
                if os.path.islink(lib):
                    paths.append(lib)  # bound from its target: the jail sees a plain file there
    paths = [p for p in dict.fromkeys(paths) if not _covered(p, covered)]
    # site-packages the interpreter would add (Debian's /usr/lib/python3/dist-packages sits inside /usr/lib)
    hidden = {os.path.realpath(d) for d in info["site"] if os.path.isdir(d)}
    hidden |= {os.path.join(p, s) for p in paths if os.path.isdir(p) for s in SKIP if os.path.isdir(os.path.join(p, s))}
    hidden = tuple(sorted(h for h in hidden if _covered(h, covered + tuple(paths))))
    if all(reachable_by_others(p) for p in paths):
        return Interpreter(exe, info["version"], tuple((p, p) for p in paths), hidden)
    stage = _stage(exe, info["version"], paths)
    return Interpreter(exe, info["version"], tuple((str(stage / p.lstrip("/")), p) for p in paths),
                       tuple(h for h in hidden if _covered(h, covered)),  # the stage holds no site-packages
                       str(stage))


def _stage(exe: str, version: str, paths: list[str]) -> Path:
    """A world-readable mirror of ``paths`` (hard links where possible), built once per interpreter."""
    base = Path(os.environ.get(STAGE_ENV) or DEFAULT_STAGE)
    key = hashlib.sha256(json.dumps([exe, version, [os.stat(p).st_mtime_ns for p in paths]]).encode()).hexdigest()
    out = base / f"py{version}-{key[:16]}"
    try:
        base.mkdir(parents=True, exist_ok=True, mode=0o755)
        for parent in [base, *base.parents]:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                raise SandboxUnavailable(f"sandbox stage {base}: {parent} is not walkable by other users "
                                         f"(set {STAGE_ENV} to a directory under a world-readable path)")
        with open(base / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be staging it right now
            if (out / ".complete").exists():
                _check_owner(out)
                return out
            tmp = base / f".tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            for p in paths:
                _mirror(Path(p), tmp / p.lstrip("/"))
            for d in [tmp, *(q for q in tmp.rglob("*") if q.is_dir() and not q.is_symlink())]:
                d.chmod(0o755)  # every directory on the way is walkable by uid 65534
            (tmp / ".complete").write_text(exe + "\n")
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
            return out
    except OSError as e:
        raise SandboxUnavailable(f"cannot stage the sandbox interpreter {exe} into {base}: {e} "
                                 f"(set {STAGE_ENV}, or {ENV} to an interpreter uid 65534 can read)") from None


def _check_owner(out: Path) -> None:
    st = os.stat(out)
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise SandboxUnavailable(f"sandbox stage {out} is not owned by us or is writable by others: refusing it")


def _mirror(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        for root, dirs, files in os.walk(src):
            dirs[:] = [d for d in dirs if d not in SKIP]
            rel = Path(root).relative_to(src)
            (dest / rel).mkdir(parents=True, exist_ok=True)
            for f in files:
                _link_or_copy(Path(root) / f, dest / rel / f)
    else:
        _link_or_copy(src.resolve(), dest)


def _link_or_copy(src: Path, dest: Path) -> None:
    if src.is_symlink():
        os.symlink(os.readlink(src), dest)
        return
    mode = src.stat().st_mode
    if mode & stat.S_IROTH:
        try:
            os.link(src, dest)  # same filesystem: free, and the file's own (world-readable) mode stays
            return
        except OSError:
            pass
    shutil.copy2(src, dest)
    dest.chmod(0o755 if mode & stat.S_IXUSR else 0o644)
