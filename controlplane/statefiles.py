"""Owner-only files and directories under the state dir.

Owns: how the control plane creates what it keeps under ``state_dir``: directories 0700 and
files 0600 from the moment they exist, never created wider and narrowed afterwards. A file is
written to a fresh temporary name (created exclusively, 0600) and renamed over the old one. A
file or directory an older version left wider is narrowed when the control plane opens it
(`narrow_private`), with a log line.

Must not: log or return what it writes, or change the mode of anything this user does not own.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600
# Everything a process creates while this is its umask is owner-only.
PRIVATE_UMASK = 0o077

log = logging.getLogger(__name__)


def private_dir(path: Path) -> Path:
    """Create `path` (and missing parents) 0700; an existing directory is left as it is."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    return path


def narrow_private(path: Path) -> bool:
    """Narrow `path` to 0600 (a file) or 0700 (a directory) if it is wider and this user owns
    it; log a line when it does. A missing path, a symlink or anything else is left alone.
    Returns whether the mode changed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISREG(st.st_mode):
        wanted = FILE_MODE
    elif stat.S_ISDIR(st.st_mode):
        wanted = DIR_MODE
    else:
        return False
    old = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.getuid() or not old & 0o077:
        return False
    os.chmod(path, old & wanted)
    log.warning(
        "narrowed %s from %04o to %04o: it was readable by others (an older version created "
        "it so); the control plane keeps its state files owner-only",
        path,
        old,
        old & wanted,
    )
    return True


def create_private(path: Path) -> None:
    """Create `path` empty and 0600 if it does not exist (for files a library then opens, such
    as SQLite's database: SQLite keeps the mode of an existing file, and its WAL and shared
    memory files take the database's mode); an existing one is narrowed (`narrow_private`)."""
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    except FileExistsError:
        narrow_private(path)
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
    """Run the body (and every process it starts) with umask 077, then restore the old one
    (per process: other threads' files are only ever narrower meanwhile)."""
    old = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(old)
