"""A directory as a tar stream: headers and file bytes yielded in chunks as they are read, so a
checkpoint of any size (a 7B model with Adam state is 80+ GB) downloads in constant memory."""
from __future__ import annotations

import os
import tarfile
from pathlib import Path
from typing import Iterator

CHUNK = 1 << 20
BLOCK = tarfile.BLOCKSIZE  # 512


def tar_stream(folder: Path, arcname: str, skip: set[str] = frozenset()) -> Iterator[bytes]:
    """The tar archive of ``folder`` (as ``arcname/…``), minus top-level entries named in ``skip``.
    PAX headers: no 8 GB file-size or 100-character name limits. Symlinks are not followed."""
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        rel = Path(root).relative_to(folder)
        if rel == Path("."):
            dirs[:] = [d for d in dirs if d not in skip]
            files = [f for f in files if f not in skip]
        yield _header(Path(root), f"{arcname}/{rel}".rstrip("/.") if str(rel) != "." else arcname)
        for name in sorted(files):
            path = Path(root) / name
            if path.is_symlink() or not path.is_file():
                continue
            yield _header(path, f"{arcname}/{rel / name}" if str(rel) != "." else f"{arcname}/{name}")
            size = 0
            with path.open("rb") as f:
                while chunk := f.read(CHUNK):
                    size += len(chunk)
                    yield chunk
            if size % BLOCK:
                yield b"\0" * (BLOCK - size % BLOCK)
    yield b"\0" * (2 * BLOCK)  # end of archive


def _header(path: Path, name: str) -> bytes:
    st = path.stat()
    info = tarfile.TarInfo(name)
    info.mtime, info.mode = int(st.st_mtime), st.st_mode & 0o777
    if path.is_dir():
        info.type, info.size = tarfile.DIRTYPE, 0
    else:
        info.size = st.st_size
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
