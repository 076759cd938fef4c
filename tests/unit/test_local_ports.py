"""The local cluster's port choices (controlplane.local.ports): the Serve proxy port the
node provider gives a node it starts."""

from __future__ import annotations

import pytest

from controlplane.local.ports import pick_proxy_port


@pytest.mark.parametrize(
    ("held", "listening", "port"),
    [
        (set(), None, 7001),
        ({7001}, None, 7002),
        ({7001, 7002}, {7001, 7002}, None),
        ({7001, 7002}, {7002}, 7001),
        ({7001, 7002}, None, None),
    ],
    ids=[
        "the first free",
        "skips a held one",
        "all held and answering: none",
        "a held port nothing listens on (its node died) is reused",
        "all held, nothing known about listeners: none",
    ],
)
def test_pick_proxy_port(held: set[int], listening: set[int] | None, port: int | None) -> None:
    assert pick_proxy_port([7001, 7002], held, listening) == port
