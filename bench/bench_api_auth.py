"""Benchmark: what authenticating one API request costs with users, over the single shared token.

Same process, same run, interleaved rounds (old, new, old, new, ...) so drift on a shared
machine hits both alike:

- ``single-token``: the check the API made before users (`tokens.bearer_matches`: parse the
  header, compare with the one token in constant time);
- ``users``: what the API does now (`Identity.authenticate`: parse, SHA-256 the token, look
  the hash up in the users table of a real SQLite store in WAL mode holding ``--users`` users,
  compare again in constant time, build the Principal). No cache: each request reads the store.

Also measured, for scale: one whole ``GET /v1/whoami`` through the real aiohttp app on a
loopback keep-alive connection (authentication, rate limit, role check, handler, JSON).

Usage::

    .venv/bin/python bench/bench_api_auth.py [--users 1000] [--calls 20000] [--rounds 5]
        [--requests 2000] [--json]

Prints a table; with ``--json`` the last line is one JSON object with every figure and the
ratio. Loopback only; no Ray.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.api.identity import Identity  # noqa: E402
from controlplane.api.jobs import JobService  # noqa: E402
from controlplane.api.routes import ApiServer  # noqa: E402
from controlplane.config import load_config  # noqa: E402
from controlplane.store import Store  # noqa: E402
from controlplane.tokens import bearer_matches, new_token, token_hash  # noqa: E402


def _per_call_us(fn: Any, header: str, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(header)
    return (time.perf_counter() - start) / calls * 1e6


def _request_us(url: str, token: str, requests: int) -> float:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    headers = {"Authorization": f"Bearer {token}"}
    samples = []
    try:
        for _ in range(requests):
            start = time.perf_counter()
            conn.request("GET", "/v1/whoami", headers=headers)
            resp = conn.getresponse()
            resp.read()
            samples.append(time.perf_counter() - start)
            if resp.status != 200:
                raise RuntimeError(f"/v1/whoami answered {resp.status}")
    finally:
        conn.close()
    return statistics.median(samples) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1000, help="users in the store")
    parser.add_argument("--calls", type=int, default=20000, help="auth checks per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2000, help="whole HTTP requests")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        cfg = load_config(None, [f"state_dir={state}", "api.rate_burst=100000"])
        store = Store(state / "controlplane.db")
        identity = Identity(store, lambda: list(cfg.jobs.queues))
        admin = new_token()
        identity.bootstrap(admin)
        tokens = [new_token() for _ in range(args.users)]
        for i, token in enumerate(tokens):
            store.add_user(f"user-{i:05d}", "researcher", ["default"], token_hash(token))
        header = f"Bearer {tokens[len(tokens) // 2]}"

        def single(h: str) -> bool:
            return bearer_matches(h, admin)

        old_us, new_us = [], []
        for _ in range(args.rounds):
            old_us.append(_per_call_us(single, header, args.calls))
            new_us.append(_per_call_us(identity.authenticate, header, args.calls))
        server = ApiServer(JobService(store, cfg), admin, "127.0.0.1", 0).start()
        try:
            request_us = _request_us(server.url, tokens[0], args.requests)
        finally:
            server.stop()
            store.close()

    old, new = statistics.median(old_us), statistics.median(new_us)
    result = {
        "users": args.users,
        "calls_per_round": args.calls,
        "rounds": args.rounds,
        "single_token_us": round(old, 3),
        "users_lookup_us": round(new, 3),
        "ratio_users_over_single": round(new / old, 1),
        "added_us_per_request": round(new - old, 3),
        "whoami_request_p50_us": round(request_us, 1),
        "auth_share_of_request_pct": round(100 * new / request_us, 1),
    }
    print(f"{'check':<16} {'us/call':>10}")
    print(f"{'single-token':<16} {old:>10.2f}")
    print(f"{'users lookup':<16} {new:>10.2f}   ({result['ratio_users_over_single']}x)")
    print(
        f"one GET /v1/whoami over loopback: p50 {request_us:.0f} us; the users lookup is "
        f"{result['auth_share_of_request_pct']}% of it ({args.users} users in the store)"
    )
    if args.json:
        print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
