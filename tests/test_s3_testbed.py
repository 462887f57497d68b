"""The remote-storage test bed itself: moto behind our proxy counts requests and injects every fault kind."""

from __future__ import annotations

import http.client
import socket
from typing import Any

import pytest

from tests._s3 import S3TestServer


def _get(s3: S3TestServer, path: str, headers: dict[str, str] | None = None, timeout: float = 10) -> tuple[int, bytes]:
    """An unsigned GET through the proxy (moto does not check signatures)."""
    conn = http.client.HTTPConnection("127.0.0.1", s3.proxy_port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@pytest.fixture
def obj(s3: S3TestServer) -> tuple[str, bytes]:
    data = bytes(range(256)) * 64
    s3.bucket("testbed")
    s3.put_bytes("testbed", "blob.bin", data, public=True)
    s3.reset()
    return "/testbed/blob.bin", data


def test_requests_are_forwarded_and_counted(s3: S3TestServer, obj: tuple[str, bytes]) -> None:
    path, data = obj
    status, body = _get(s3, path, {"Range": "bytes=10-19"})
    assert (status, body) == (206, data[10:20])
    log = s3.requests()
    assert [(r.method, r.path, r.range, r.status, r.bytes) for r in log] == [("GET", path, (10, 20), 206, 10)]
    assert s3.counts() == {"GET": 1}


@pytest.mark.parametrize("kind,status", [("503", 503), ("500", 500)])
def test_status_faults_are_not_forwarded(s3: S3TestServer, obj: tuple[str, bytes], kind: str, status: int) -> None:
    path, data = obj
    s3.faults(rules=[{"kind": kind, "times": 1}])
    assert _get(s3, path)[0] == status
    assert _get(s3, path) == (200, data)  # the rule was consumed
    assert [r.fault for r in s3.requests()] == [kind, None]


def test_truncated_body_closes_the_connection_early(s3: S3TestServer, obj: tuple[str, bytes]) -> None:
    path, data = obj
    s3.faults(rules=[{"kind": "truncate", "match": "blob"}])
    with pytest.raises(http.client.IncompleteRead):
        _get(s3, path)
    assert s3.requests()[0].bytes == len(data) // 2


def test_flipped_byte(s3: S3TestServer, obj: tuple[str, bytes]) -> None:
    path, data = obj
    s3.faults(rules=[{"kind": "flip"}])
    status, body = _get(s3, path)
    assert status == 200 and len(body) == len(data) and body != data
    assert sum(a != b for a, b in zip(body, data)) == 1


def test_stall_outlasts_a_client_timeout(s3: S3TestServer, obj: tuple[str, bytes]) -> None:
    path, _ = obj
    s3.faults(rules=[{"kind": "stall"}], stall_s=1.0)
    with pytest.raises((socket.timeout, TimeoutError)):
        _get(s3, path, timeout=0.2)


def test_rates_are_seeded(s3: S3TestServer, obj: tuple[str, bytes]) -> None:
    path, _ = obj

    def run() -> list[Any]:
        s3.reset()
        s3.faults(rates={"503": 0.5}, seed=3)
        for _ in range(20):
            _get(s3, path)
        return [r.fault for r in s3.requests()]

    first = run()
    assert first == run() and 0 < first.count("503") < 20


def test_a_replaced_object_changes_its_etag(s3: S3TestServer, obj: tuple[str, bytes]) -> None:
    path, data = obj
    before = s3.client().head_object(Bucket="testbed", Key="blob.bin")["ETag"]
    s3.put_bytes("testbed", "blob.bin", data[::-1], public=True)
    after = s3.client().head_object(Bucket="testbed", Key="blob.bin")["ETag"]
    assert before != after
    assert _get(s3, path, {"If-Match": before})[0] == 412
