"""The API's token and URL files under the state dir, and what a token is.

Owns: ``<state_dir>/api-token`` (the first admin's token, created once, 0600, never logged;
`admin_token` reads ``api.admin_token_file`` instead where that is set) and
``<state_dir>/api-url``, which the SDK and CLI read; making a token (`new_token`) and the hash
the store keeps instead of it (`token_hash`); `bearer_matches`, the single-token check the
users lookup replaced (kept for `bench/bench_api_auth.py`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path

from controlplane.config import Config
from controlplane.statefiles import narrow_private, write_private

TOKEN_FILE = "api-token"
URL_FILE = "api-url"


def ensure_token(state_dir: Path, name: str = TOKEN_FILE) -> str:
    """The token in ``<state_dir>/<name>``, creating it (0600, `write_private`) on first use or
    when the file is empty; a token file or state dir an older version left wider is narrowed
    to 0600/0700 first."""
    path = Path(state_dir) / name
    narrow_private(path.parent)
    narrow_private(path)
    try:
        token = path.read_text().strip()
        if token:
            return token
    except FileNotFoundError:
        pass
    token = new_token()
    write_private(path, token + "\n")
    return token


def new_token() -> str:
    """A fresh token: 32 random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def token_hash(token: str | bytes) -> str:
    """What the store keeps of a token: its SHA-256, hex. A token from a header is hashed as
    the bytes received (aiohttp hands invalid UTF-8 over as surrogate escapes)."""
    raw = token if isinstance(token, bytes) else token.encode("utf-8", "surrogateescape")
    return hashlib.sha256(raw).hexdigest()


MIN_TOKEN_CHARS = 32
"""A token given in a file (`read_token_file`) shorter than this is refused: guessable."""


class TokenFileError(Exception):
    """A configured token file that is missing, unreadable, empty or too short; the message
    names the file and the fix, never the token."""


def read_token_file(path: str | Path) -> str:
    """The token in `path` (e.g. a mounted Secret), stripped; `TokenFileError` when it cannot
    be read or is shorter than `MIN_TOKEN_CHARS`."""
    try:
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenFileError(
            f"api.admin_token_file: cannot read {path} ({type(exc).__name__}); mount the "
            f"Secret that holds the admin's token there (docs/operations.md)"
        ) from None
    if len(token) < MIN_TOKEN_CHARS:
        raise TokenFileError(
            f"api.admin_token_file: {path} holds {len(token)} characters, fewer than "
            f"{MIN_TOKEN_CHARS}; put a random token there (e.g. openssl rand -hex 32)"
        )
    return token


def admin_token(cfg: Config) -> str:
    """The first admin's API token: from ``api.admin_token_file`` when set (KubeRay: a mounted
    Secret, `read_token_file`), else ``<state_dir>/api-token``, created on first use."""
    if cfg.api.admin_token_file:
        return read_token_file(cfg.api.admin_token_file)
    return ensure_token(cfg.state_path)


def bearer_matches(header: str | None, expected: str) -> bool:
    """Whether `header` (an ``Authorization`` value) is ``Bearer <expected>``, compared in
    constant time. Header bytes that are not UTF-8 reach here as surrogate escapes (aiohttp) and
    go back to those bytes: never equal to a token read as UTF-8, so False, not an error."""
    scheme, _, given = (header or "").partition(" ")
    try:
        sent = given.strip().encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that is no escaped byte
        return False
    return scheme.lower() == "bearer" and hmac.compare_digest(sent, expected.encode("utf-8"))


def write_url(state_dir: Path, url: str) -> None:
    write_private(Path(state_dir) / URL_FILE, url + "\n")
