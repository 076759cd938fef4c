"""A real S3-protocol server (moto) on loopback for unit tests that talk to object storage.

Owns: starting and stopping the server and creating buckets. Tests use `moto_s3` in a fixture
of their own scope; nothing here reaches beyond 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

REGION = "us-east-1"


def client(url: str) -> Any:
    """A boto3 S3 client of the server at `url` (moto accepts any key pair)."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=url,
        region_name=REGION,
        aws_access_key_id="k",
        aws_secret_access_key="s",
    )


@contextmanager
def moto_s3(buckets: Iterable[str] = ()) -> Iterator[str]:
    """The server's URL while the block runs, with `buckets` created."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        url = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
        s3 = client(url)
        for bucket in buckets:
            s3.create_bucket(Bucket=bucket)
        yield url
    finally:
        server.stop()
