"""Owner-only files and directories under the state dir.

Owns: how the control plane creates what it keeps under ``state_dir`` (the job database, the
API and Ray tokens, the API URL, the local cluster's state and configs): directories 0700 and
files 0600 from the moment they exist, never created wider and narrowed afterwards. A file is
written to a fresh temporary name (created exclusively, 0600) and renamed over the old one, so
a reader never sees half a file and an old, wider file's mode is not inherited.

Must not: log or return what it writes, or loosen the mode of anything it did not create.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600
# Everything a process creates while this is its umask is owner-only.
PRIVATE_UMASK = 0o077


def private_dir(path: Path) -> Path:
    """Create `path` (and missing parents) 0700; an existing directory is left as it is."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    return path


def create_private(path: Path) -> None:
    """Create `path` empty and 0600 if it does not exist (for files a library then opens, such
    as SQLite's database: SQLite keeps the mode of an existing file, and its WAL and shared
    memory files take the database's mode)."""
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    except FileExistsError:
        return
    os.close(fd)


def write_private(path: Path, text: str) -> None:
    """Replace `path` with `text`, as a file that is 0600 from its creation."""
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def private_umask() -> Iterator[None]:
    """Run the body (and every process it starts) with umask 077, then restore the old one.

    The umask is per process: a thread that creates files meanwhile gets owner-only ones too,
    which is only ever narrower.
    """
    old = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(old)
