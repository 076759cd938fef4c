"""The API's token and URL files under the state dir.

Owns: ``<state_dir>/api-token`` (created once, mode 0600, never logged) and
``<state_dir>/api-url`` (where the API listens), which the SDK and CLI read when no
``RCP_API_TOKEN``/``RCP_API_URL`` is set.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from controlplane.statefiles import narrow_private, private_dir, write_private

TOKEN_FILE = "api-token"
URL_FILE = "api-url"


def ensure_token(state_dir: Path) -> str:
    """The token in `state_dir`, creating it (0600) on first use; a token file or state dir an
    older version left wider is narrowed to 0600/0700 first."""
    path = Path(state_dir) / TOKEN_FILE
    narrow_private(path.parent)
    narrow_private(path)
    try:
        token = path.read_text().strip()
        if token:
            return token
    except FileNotFoundError:
        pass
    private_dir(path.parent)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.chmod(path, 0o600)
    return token


def read_token(state_dir: Path) -> str | None:
    try:
        return (Path(state_dir) / TOKEN_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def write_url(state_dir: Path, url: str) -> None:
    write_private(Path(state_dir) / URL_FILE, url + "\n")


def read_url(state_dir: Path) -> str | None:
    try:
        return (Path(state_dir) / URL_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None
