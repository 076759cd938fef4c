"""The sample model served by default: a small torch MLP classifier that answers JSON.

Owns: the model itself and its input contract. It is what `rcp up` serves when no model is
declared, and the model the serving tests and benchmark drive. Weights come from a fixed
seed, so every replica in every pool gives the same answer for the same input.

Request body: ``{"inputs": [[x_0, ..., x_{n-1}], ...]}`` with 1..`max_batch` rows of
`num_features` numbers. Response: ``{"outputs": [[p_0, ..., p_{k-1}], ...], "labels": [...]}``
(class probabilities per row and the most likely class).

A slow backend, for latency tests: ``init_kwargs: {extra_latency_ms: 200}`` makes every valid
request take that much longer (a sleep after the answer is computed; a bad request is refused
at once). ``user_config: {extra_latency_ms: 200}`` sets the same on running replicas
(`reconfigure`, no restart): how a test slows the backend down and speeds it up again.

Must not: touch Ray or Serve; it is a plain class the backend deployment wraps.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

__all__ = ["SampleModel"]


class SampleModel:
    """A 3-layer MLP with fixed seeded weights. ``predict`` raises ValueError on bad input."""

    def __init__(
        self,
        num_features: int = 16,
        hidden: int = 128,
        num_classes: int = 4,
        max_batch: int = 64,
        seed: int = 0,
        torch_threads: int = 1,
        extra_latency_ms: float = 0.0,
    ) -> None:
        self.extra_latency_s = _latency_s("init_kwargs.extra_latency_ms", extra_latency_ms)
        torch.set_num_threads(max(1, int(torch_threads)))
        gen = torch.Generator().manual_seed(seed)
        self.num_features = num_features
        self.max_batch = max_batch
        layers: list[torch.nn.Module] = [
            torch.nn.Linear(num_features, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, num_classes),
        ]
        self.net = torch.nn.Sequential(*layers).eval()
        with torch.no_grad():
            for p in self.net.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * (1.0 / math.sqrt(p.shape[-1])))

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Apply ``user_config`` (only ``extra_latency_ms``; {} changes nothing)."""
        unknown = sorted(set(user_config) - {"extra_latency_ms"})
        if unknown:
            raise ValueError(f"user_config.{unknown[0]}: unknown key (known: extra_latency_ms)")
        if "extra_latency_ms" in user_config:
            value = user_config["extra_latency_ms"]
            self.extra_latency_s = _latency_s("user_config.extra_latency_ms", value)

    def _tensor(self, payload: dict[str, Any]) -> torch.Tensor:
        rows = payload.get("inputs")
        if not isinstance(rows, list) or not rows:
            raise ValueError('"inputs" must be a non-empty list of rows of numbers')
        if len(rows) > self.max_batch:
            raise ValueError(f'"inputs" has {len(rows)} rows; at most {self.max_batch} allowed')
        for i, row in enumerate(rows):
            if not isinstance(row, list) or len(row) != self.num_features:
                raise ValueError(f'"inputs"[{i}] must be a list of {self.num_features} numbers')
            for x in row:
                if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
                    raise ValueError(f'"inputs"[{i}] holds a value that is not a finite number')
        return torch.tensor(rows, dtype=torch.float32)

    def predict(self, payload: dict[str, Any]) -> dict[str, Any]:
        x = self._tensor(payload)
        with torch.inference_mode():
            probs = torch.softmax(self.net(x), dim=-1)
        if self.extra_latency_s:
            time.sleep(self.extra_latency_s)  # the slow backend (module doc)
        return {
            "outputs": [[round(float(p), 6) for p in row] for row in probs],
            "labels": [int(i) for i in probs.argmax(dim=-1)],
        }


def _latency_s(key: str, value: object) -> float:
    """`value` ms as seconds; ValueError naming `key` unless a finite number in 0..60000."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 <= value <= 60_000
    ):
        raise ValueError(f"{key}: must be a number between 0 and 60000, got {value!r}")
    return float(value) / 1000.0
