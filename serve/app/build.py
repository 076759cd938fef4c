"""Application builders that Serve's declarative config points at.

Owns: ``serve.app.build:build_ingress`` and ``serve.app.build:build_backend``, the import paths written
into each application config by `serve.spec`. Serve calls them with the app's ``args``.

Must not: hold state or decide anything; options come from the application config.
"""

from __future__ import annotations

from ray.serve import Application

from serve.app.backend import Backend
from serve.app.ingress import Ingress
from serve.spec import BackendArgs, IngressArgs

__all__ = ["build_backend", "build_ingress"]


def build_ingress(args: IngressArgs) -> Application:
    """The ingress application; its route table arrives through ``user_config``."""
    return Ingress.bind()


def build_backend(args: BackendArgs) -> Application:
    """One backend of a model in a pool: ``args`` = name, import_path, init_kwargs, pool."""
    return Backend.bind(
        args["name"], args["import_path"], dict(args.get("init_kwargs") or {}), args["pool"]
    )
