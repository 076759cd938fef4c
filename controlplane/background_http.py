"""Serving an aiohttp application from a daemon thread with its own event loop
(`BackgroundHttpServer`: the controller's API and, in tests, the Kubernetes actuator
service). Port 0 binds a free port, which `url` then names.

Must not: hold routes or request handling (those are the applications' own).
"""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web

__all__ = ["BackgroundHttpServer"]


class BackgroundHttpServer:
    """Serves `app` on host:port from a daemon thread named `thread_name`."""

    def __init__(self, app: web.Application, host: str, port: int, thread_name: str) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.thread_name = thread_name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _start(self, timeout_s: float) -> None:
        """Start serving; RuntimeError naming the address if it does not listen in time."""
        self._thread = threading.Thread(target=self._serve, name=self.thread_name, daemon=True)
        self._thread.start()
        if not self._started.wait(timeout_s):
            raise RuntimeError(
                f"{self.thread_name} did not start on {self.url} within {timeout_s:.0f}s"
            )
        if self._error is not None:
            raise RuntimeError(f"{self.thread_name} cannot listen on {self.url}: {self._error}")

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        runner = web.AppRunner(self.app, access_log=None)
        try:
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
            loop.run_until_complete(site.start())
            if self.port == 0:
                server = site._server
                assert server is not None
                self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        except BaseException as exc:
            self._error = exc
            self._started.set()
            return
        self._started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    def stop(self) -> None:
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
