"""The SDK's connection to the control plane's API: where it is, and the HTTP calls.

Owns: finding the API's URL and token (the arguments; ``RCP_API_URL`` and ``RCP_API_TOKEN``;
the files ``api-url`` and ``api-token`` in the state dir, ``RCP_STATE_DIR`` or ``~/.rcp``),
one JSON request with the token (`Connection._once`) and its retries (`Connection._call`),
and turning a refusal into the typed error of `controlplane.sdk.errors`.

Must not: know the API's routes; show the token (not in `repr`, not in an error).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from controlplane.sdk.errors import ERROR_BY_STATUS, ApiError, NotConfigured

__all__ = ["ENV_STATE_DIR", "ENV_TOKEN", "ENV_URL", "Connection"]

ENV_URL = "RCP_API_URL"
ENV_TOKEN = "RCP_API_TOKEN"
ENV_STATE_DIR = "RCP_STATE_DIR"


def _state_dir() -> Path:
    return Path(os.environ.get(ENV_STATE_DIR, "~/.rcp")).expanduser()


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def _seconds(header: str | None) -> float | None:
    """A ``Retry-After`` of whole seconds (an HTTP date or anything odd: None)."""
    value = (header or "").strip()
    return float(value) if value.isascii() and value.isdigit() else None


class Connection:
    """The API's URL and token, and the HTTP calls to it (see the module doc for where it
    looks); `controlplane.sdk.client.Client` adds the routes."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        state_dir: str | Path | None = None,
        timeout_s: float = 30.0,
        retries: int = 5,
    ) -> None:
        sdir = Path(state_dir).expanduser() if state_dir is not None else _state_dir()
        found_url = url or os.environ.get(ENV_URL) or _read(sdir / "api-url")
        found_token = token or os.environ.get(ENV_TOKEN) or _read(sdir / "api-token")
        if not found_url:
            raise NotConfigured(
                0,
                f"no control-plane API URL: pass url=, set {ENV_URL}, or start one with "
                f"`rcp up` (looked in {sdir / 'api-url'})",
            )
        if not found_token:
            raise NotConfigured(
                0,
                f"no API token: pass token=, set {ENV_TOKEN}, or read it from "
                f"{sdir / 'api-token'} (written by `rcp up`)",
            )
        self.url = found_url.rstrip("/")
        self._token = found_token
        self.timeout_s = timeout_s
        self.retries = retries
        """Retries of a request that could not reach the server, only where repeating it is
        safe: reads, and submissions with an idempotency key."""

    def __repr__(self) -> str:  # never show the token
        return f"Client(url={self.url!r})"

    # -- plumbing ---------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        url = self.url + path
        if query:
            clean = {k: v for k, v in query.items() if v is not None}
            if clean:
                url += "?" + urllib.parse.urlencode(clean)
        data = None if body is None else json.dumps(body).encode()
        safe = method == "GET" or bool(headers and headers.get("Idempotency-Key"))
        for attempt in range(1 + self.retries):
            try:
                return self._once(method, url, data, headers)
            except ApiError as exc:
                # 429 (the user's rate limit, too many log reads at once) is refused before
                # anything happens, so any request may be sent again, after Retry-After; 0
                # (unreachable: the server may be restarting) only a request that is safe to.
                retry = exc.status == 429 or (exc.status == 0 and safe)
                if not retry or attempt == self.retries:
                    raise
                wait_s = exc.retry_after_s if exc.retry_after_s is not None else 0.25 * 2**attempt
                time.sleep(min(4.0, wait_s))
        raise AssertionError("unreachable")

    def _once(
        self, method: str, url: str, data: bytes | None, headers: Mapping[str, str] | None
    ) -> Any:
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self._token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                payload = json.loads(raw)
                message, fld = str(payload.get("error", raw)), payload.get("field")
            except (ValueError, AttributeError):
                message, fld = raw.decode(errors="replace") or str(exc), None
            error = ERROR_BY_STATUS.get(exc.code, ApiError)(exc.code, message, fld)
            error.retry_after_s = _seconds(exc.headers.get("Retry-After"))
            raise error from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ApiError(
                0, f"cannot reach the control plane at {self.url}: {reason}; is it up (`rcp up`)?"
            ) from exc

    def healthy(self) -> bool:
        """One quick look at /healthz (no retries)."""
        try:
            return bool(self._once("GET", self.url + "/healthz", None, None).get("ok"))
        except ApiError:
            return False
