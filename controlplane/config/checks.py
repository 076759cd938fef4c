"""Checks of one value, and the upper bounds they hold values to.

Owns: the limits (`MAX_WAIT_S` and the rest: past them a wait overflows, a loop hangs or a
field overflows), `waits`, the ``Annotated`` checks of one value (`Port`, `ExporterPort`,
`DnsLabel`, `TaintKey`, `ActuatorUrl`, `NonEmpty`), and `is_loopback`.

Must not: know which section a key is in (the sections declare their fields' checks).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator

from policies.validation import at_most

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
    "ActuatorUrl",
    "DnsLabel",
    "ExporterPort",
    "NonEmpty",
    "Port",
    "TaintKey",
    "is_loopback",
    "waits",
]


MAX_WAIT_S = 3600.0
"""Upper bound of the intervals and timeouts the control plane waits on (`waits`)."""
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


def waits(maximum: float = MAX_WAIT_S) -> AfterValidator:
    """An upper bound for a value that becomes a wait (`Thread.join`, `Event.wait`, a socket
    timeout): past ``threading.TIMEOUT_MAX`` those raise OverflowError, and long before that
    the loop would just hang."""
    return at_most(maximum, "it is how long the control plane waits or sleeps")


def _port(value: int) -> int:
    if not 1 <= value <= 65535:
        raise ValueError(f"must be a TCP port in 1..65535, got {value!r}")
    return value


Port = Annotated[int, AfterValidator(_port)]
ExporterPort = Annotated[int, AfterValidator(lambda v: v if v == 0 else _port(v))]
"""A TCP port, or 0: a free port picked per listener."""


def _non_empty(value: str) -> str:
    if not value:
        raise ValueError("must not be empty, got ''")
    return value


NonEmpty = Annotated[str, AfterValidator(_non_empty)]


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


def _dns_label(value: str) -> str:
    if len(value) > 63 or not DNS_LABEL.fullmatch(value):
        raise ValueError(
            "must be a DNS-1123 label (lower-case letters, digits and '-', at most 63 "
            f"characters, starting and ending with a letter or digit), got {value!r}"
        )
    return value


def _taint_key(value: str) -> str:
    prefix, slash, name = value.rpartition("/")
    bad_prefix = bool(slash) and (
        not prefix or len(prefix) > 253 or not DNS_SUBDOMAIN.fullmatch(prefix)
    )
    if bad_prefix or len(name) > 56 or not QUALIFIED_NAME.fullmatch(name):
        raise ValueError(
            "must be a Kubernetes qualified name ([prefix/]name: an optional DNS subdomain "
            "prefix, then a name of at most 56 letters, digits, '-', '_', '.'; 56 because the "
            f"actuator's annotations append '-reason'), got {value!r}"
        )
    return value


def _actuator_url(value: Any) -> Any:
    """``http(s)://host[:port]``, nothing else: no credentials, path, query or fragment."""
    if value is None:
        return value
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"not a URL ({exc}), got {value!r}") from None
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
        raise ValueError(
            "must be http(s)://host[:port] with no path, query or credentials "
            f"(e.g. http://rcp-kube-actuator.rcp.svc:8080), got {value!r}"
        )
    return value


DnsLabel = Annotated[str, AfterValidator(_dns_label)]
TaintKey = Annotated[str, AfterValidator(_taint_key)]
ActuatorUrl = Annotated[str | None, AfterValidator(_actuator_url)]
