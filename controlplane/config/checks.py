"""Checks of one value, and the upper bounds they hold values to.

Owns: the limits (`MAX_WAIT_S` and the rest: past them a wait overflows, a loop hangs or a
field overflows) and the checks that return one message naming the key, or none: bounds
(`at_least`, `at_most`, `wait_at_most`), `tcp_port`, `is_loopback`, and the Kubernetes
name forms (`dns_label`, `taint_key`, `DNS_SUBDOMAIN`) and `actuator_url`.

Must not: know which section a key is in (`controlplane.config.validation` does).
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

__all__ = [
    "DNS_LABEL",
    "DNS_SUBDOMAIN",
    "MAX_BATCH",
    "MAX_BODY_BYTES",
    "MAX_DEADLINE_S",
    "MAX_REQUEST_TIMEOUT_S",
    "MAX_RETENTION_DAYS",
    "MAX_RETRIES",
    "MAX_SCRAPE_TIMEOUT_S",
    "MAX_SUBMIT_TIMEOUT_S",
    "MAX_WAIT_S",
    "MAX_WINDOW_S",
    "QUALIFIED_NAME",
    "actuator_url",
    "at_least",
    "at_most",
    "dns_label",
    "is_loopback",
    "taint_key",
    "tcp_port",
    "wait_at_most",
]


MAX_WAIT_S = 3600.0
"""Upper bound of the intervals and timeouts the control plane waits on (`wait_at_most`)."""
MAX_SUBMIT_TIMEOUT_S = 600.0
"""Upper bound of ``jobs.submit_timeout_s``: the tick waits this long on a submission."""
MAX_SCRAPE_TIMEOUT_S = 60.0
"""Upper bound of ``telemetry.dcgm_timeout_s`` (a socket timeout per scrape)."""
MAX_REQUEST_TIMEOUT_S = 300.0
"""Upper bound of ``kubernetes.request_timeout_s`` (a socket timeout per Kubernetes call, in
the tick)."""
MAX_DEADLINE_S = 7 * 86400.0
"""Upper bound of deadlines and grace periods (``health.drain_deadline_s`` becomes an int64
millisecond deadline in Ray's GCS; ``jobs.gang_start_timeout_s``; a pod's grace period)."""
MAX_WINDOW_S = 90 * 86400.0
"""Upper bound of the sliding windows counted over (health lemons, the breaker, the kube
service's rate cap)."""
MAX_RETENTION_DAYS = 36500.0
"""Upper bound of ``jobs.*retention_days`` (a cutoff time computed from it)."""
MAX_RETRIES = 100
"""Upper bound of retry counts (``kubernetes.conflict_retries``, ``jobs.max_start_attempts``):
each retry is another round trip in the tick."""
MAX_BATCH = 100_000
"""Upper bound of batch and history sizes (an SQL LIMIT, samples kept per node)."""
MAX_BODY_BYTES = 64 * 1024 * 1024
"""Upper bound of the request bodies a server reads into memory."""


def at_least(minimum: float, path: str, value: float, why: str = "") -> list[str]:
    if value < minimum:
        reason = f" ({why})" if why else ""
        return [f"{path}: must be >= {minimum:g}{reason}, got {value!r}"]
    return []


def not_below(path: str, value: float, floor_path: str, floor: float) -> list[str]:
    """`value` (at `path`) may not be below another field's value (`floor`, at `floor_path`)."""
    if value < floor:
        return [f"{path}: must be >= {floor_path} ({floor:g}), got {value!r}"]
    return []


def wait_at_most(maximum: float, path: str, value: float) -> list[str]:
    """An upper bound for a value that becomes a wait (`Thread.join`, `Event.wait`, a socket
    timeout): past ``threading.TIMEOUT_MAX`` those raise OverflowError, and long before that
    the loop would just hang."""
    if value > maximum:
        return [
            f"{path}: must be <= {maximum:g} (it is how long the control plane waits or "
            f"sleeps), got {value!r}"
        ]
    return []


def at_most(maximum: float, path: str, value: float, why: str) -> list[str]:
    """An upper bound for a count or size (retries, a batch, a body): past it the control
    plane would hang, run out of memory, or overflow a 64-bit field."""
    if value > maximum:
        return [f"{path}: must be <= {maximum:g} ({why}), got {value!r}"]
    return []


def tcp_port(path: str, value: int) -> list[str]:
    if not 1 <= value <= 65535:
        return [f"{path}: must be a TCP port in 1..65535, got {value!r}"]
    return []


def is_loopback(host: str) -> bool:
    """Whether `host` binds loopback only: 127.0.0.0/8, ::1 (or ::ffff:127.x) or localhost."""
    if host.strip().lower() == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(host.strip().strip("[]"))
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere
    mapped = getattr(addr, "ipv4_mapped", None)
    return bool((mapped or addr).is_loopback)


DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def dns_label(path: str, value: str) -> list[str]:
    if len(value) > 63 or not DNS_LABEL.fullmatch(value):
        return [
            f"{path}: must be a DNS-1123 label (lower-case letters, digits and '-', at most "
            f"63 characters, starting and ending with a letter or digit), got {value!r}"
        ]
    return []


def taint_key(path: str, value: str) -> list[str]:
    prefix, slash, name = value.rpartition("/")
    bad_prefix = bool(slash) and (
        not prefix or len(prefix) > 253 or not DNS_SUBDOMAIN.fullmatch(prefix)
    )
    if bad_prefix or len(name) > 56 or not QUALIFIED_NAME.fullmatch(name):
        return [
            f"{path}: must be a Kubernetes qualified name ([prefix/]name: an optional DNS "
            f"subdomain prefix, then a name of at most 56 letters, digits, '-', '_', '.'; 56 "
            f"because the actuator's annotations append '-reason'), got {value!r}"
        ]
    return []


def actuator_url(path: str, value: str) -> list[str]:
    """``http(s)://host[:port]``, nothing else: no credentials, path, query or fragment."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        return [f"{path}: not a URL ({exc}), got {value!r}"]
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.username is not None
        or parts.password is not None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or (port is not None and not 1 <= port <= 65535)
    ):
        return [
            f"{path}: must be http(s)://host[:port] with no path, query or credentials "
            f"(e.g. http://rcp-kube-actuator.rcp.svc:8080), got {value!r}"
        ]
    return []
