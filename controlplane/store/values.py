"""Key-value: the policy actor's desired state and policy state, as JSON values.

Owns: `Values`: `put`, `get_value`, `delete` and `keys`.

Must not: know what a key means (its writer does).
"""

from __future__ import annotations

import json
from typing import Any

from controlplane.store.database import Database
from controlplane.store.schema import dumps

__all__ = ["Values"]


class Values(Database):
    def put(self, key: str, value: Any) -> None:
        """Store a JSON-serialisable value under `key` (replacing any previous one)."""
        encoded = dumps(value, f"value for key {key!r}")
        with self._tx() as db:
            db.execute(
                "INSERT INTO kv (key, value_json, updated_s) VALUES (?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value_json = excluded.value_json, "
                "updated_s = excluded.updated_s",
                (key, encoded, self._clock()),
            )

    def get_value(self, key: str, default: Any = None) -> Any:
        rows = self._read("SELECT value_json FROM kv WHERE key = ?", (key,))
        return default if not rows else json.loads(rows[0]["value_json"])

    def delete(self, key: str) -> bool:
        with self._tx() as db:
            return db.execute("DELETE FROM kv WHERE key = ?", (key,)).rowcount > 0

    def keys(self, prefix: str = "") -> list[str]:
        rows = self._read("SELECT key FROM kv ORDER BY key")
        return [r["key"] for r in rows if str(r["key"]).startswith(prefix)]
