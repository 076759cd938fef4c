"""Token buckets: how the API slows a client that floods it, while others keep being served.

Owns: `TokenBuckets`, one bucket per key (a user's name; a client address for requests that
fail authentication), each holding up to `burst` requests and refilled at `rate_per_s`.
`take(key)` spends one, or says how long to wait (the 429's ``Retry-After``). At most
`max_keys` buckets are kept: the least recently used goes first (a forgotten bucket comes back
full, which only ever lets a client through sooner).

Worked example: rate 50/s, burst 100 (the defaults). A client sends 150 requests at once:
100 pass, 50 get 429 with Retry-After 1 (the next token is 0.02 s away, rounded up to whole
seconds). Another user's bucket is untouched: their requests pass.

Must not: read the wall clock directly (the `clock` is injected) or know HTTP.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["TokenBuckets"]


class TokenBuckets:
    """Per-key token buckets; thread-safe."""

    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 10_000,
    ) -> None:
        if rate_per_s <= 0 or burst < 1 or max_keys < 1:
            raise ValueError("rate_per_s must be > 0, burst and max_keys >= 1")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        """key -> (tokens, when last refilled)."""
        self._lock = threading.Lock()

    def take(self, key: str) -> int | None:
        """Spend one token of `key`'s bucket: None when it had one, else the whole seconds
        (>= 1) until it will."""
        with self._lock:
            now = self._clock()
            tokens, at = self._buckets.pop(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + max(0.0, now - at) * self.rate_per_s)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                retry = None
            else:
                self._buckets[key] = (tokens, now)
                retry = max(1, math.ceil((1.0 - tokens) / self.rate_per_s))
            while len(self._buckets) > self._max_keys:
                self._buckets.popitem(last=False)
            return retry
