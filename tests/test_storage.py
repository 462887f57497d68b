"""Byte sources: URLs, storage_options, failure kinds, and requests against the moto S3 server (every fault kind)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lightning_vstream.errors import (
    ConfigurationError,
    FileChangedError,
    MissingFileError,
    RemoteAccessError,
    RemoteStorageError,
    RemoteTimeoutError,
)
from lightning_vstream.storage import Expect, StorageConfig, parse_size, storage_for
from lightning_vstream.storage.client import Storage
from lightning_vstream.storage.transport import classify_message
from lightning_vstream.storage.urls import basename, dirname, is_remote, is_url, join, local_path, parse, scheme_of
from tests._s3 import S3TestServer

DATA = bytes(range(256)) * 400  # 102400 bytes


# -- URLs ------------------------------------------------------------------------------------
def test_urls_stay_strings_and_join_like_paths() -> None:
    assert is_url("s3://b/k") and is_url("file:///tmp/x") and not is_url("/tmp/x") and not is_url("C://x")
    assert is_remote("gs://b/k") and not is_remote("file:///x") and not is_remote("relative/path")
    assert scheme_of("s3a://b/k") == "s3" and scheme_of("abfs://c@acct.dfs.core.windows.net/k") == "az"
    assert join("s3://b/ds", "videos/../videos/x.mp4") == "s3://b/ds/videos/x.mp4"
    assert join("s3://b/ds/", "x.mp4") == "s3://b/ds/x.mp4"
    assert join("s3://b", "x.mp4") == "s3://b/x.mp4"
    assert join("file:///data/ds", "videos/a.mp4") == "file:///data/ds/videos/a.mp4"
    assert dirname("s3://b/ds/index.json") == "s3://b/ds" and basename("s3://b/ds/index.json") == "index.json"
    assert parse("https://host:8080/a/b.mp4").container == "host:8080"
    assert local_path("file:///data/x.mp4") == Path("/data/x.mp4")
    with pytest.raises(ConfigurationError, match="climbs above the root"):
        join("s3://b/ds", "../../x")
    with pytest.raises(ConfigurationError, match="names no bucket"):
        parse("s3:///key")


# -- options ---------------------------------------------------------------------------------
def test_storage_options_are_checked_and_secrets_redacted() -> None:
    config = StorageConfig(
        {"endpoint": "http://x", "secret_access_key": "s3cr3t", "allow_http": True}, cache_dir="/c", cache_limit="2GB"
    )
    assert config.cache_limit == 2 * 10**9
    assert config.redacted() == {"endpoint": "http://x", "secret_access_key": None, "allow_http": True}
    assert "s3cr3t" not in repr(config)
    with pytest.raises(ConfigurationError, match=r"unknown key\(s\) \['secret'\]; accepted keys: \[.*'access_key_id'"):
        StorageConfig({"secret": "x"})
    with pytest.raises(ConfigurationError, match=r"storage_options\['allow_http'\]='yes' must be bool"):
        StorageConfig({"allow_http": "yes"})
    with pytest.raises(ConfigurationError, match=r"storage_options\['secret_access_key'\]=<redacted> must be str"):
        StorageConfig({"secret_access_key": 5})
    with pytest.raises(ConfigurationError, match="cache_limit='2GB' needs cache_dir"):
        StorageConfig({}, cache_limit="2GB")


def test_parse_size() -> None:
    assert parse_size("20GB") == 20 * 10**9 and parse_size("1.5 GiB") == int(1.5 * 2**30) and parse_size(7) == 7
    with pytest.raises(ConfigurationError, match="is not a size"):
        parse_size("lots")
    with pytest.raises(ConfigurationError, match="must be >= 0"):
        parse_size(-1)


@pytest.mark.parametrize(
    "error_type,message,kind",
    [
        ("GenericError", "Server returned non-2xx status code: 503 Service Unavailable", "transient"),
        ("GenericError", "Server returned non-2xx status code: 500 Internal Server Error", "transient"),
        ("GenericError", "Server returned non-2xx status code: 429 Too Many Requests", "transient"),
        ("GenericError", "error decoding response body: connection closed before message completed", "transient"),
        ("GenericError", "operation timed out", "timeout"),
        ("NotFoundError", "Object at location x not found", "not_found"),
        ("PreconditionError", "Request precondition failure", "precondition"),
        ("PermissionDeniedError", "denied", "access"),
        ("GenericError", "Server returned non-2xx status code: 416 Range Not Satisfiable", "invalid"),
    ],
)
def test_failures_are_sorted_into_kinds(error_type: str, message: str, kind: str) -> None:
    assert classify_message(error_type, message).kind == kind


# -- local files -----------------------------------------------------------------------------
def test_local_files_read_with_pread(tmp_path: Path) -> None:
    path = tmp_path / "blob.bin"
    path.write_bytes(DATA)
    storage = Storage(StorageConfig())
    for location in (str(path), f"file://{path}"):
        data, info = storage.read(location, 100, 200, expect=Expect(len(DATA)))
        assert bytes(data) == DATA[100:200] and info.size == len(DATA)
    with pytest.raises(FileChangedError, match=r"holds 102400 bytes where the index recorded 5"):
        storage.read(str(path), 0, 10, expect=Expect(5))
    with pytest.raises(MissingFileError, match="does not exist"):
        storage.read(str(tmp_path / "missing.bin"), 0, 10)
    assert storage.write(f"file://{tmp_path}/sub/new.bin", b"abc").size == 3
    assert [u for u, _ in storage.list(f"file://{tmp_path}")] == [
        f"file://{tmp_path}/blob.bin",
        f"file://{tmp_path}/sub/new.bin",
    ]


# -- S3 through the proxy ----------------------------------------------------------------------
@pytest.fixture
def blob(s3: S3TestServer) -> str:
    s3.bucket("storage")
    s3.put_bytes("storage", "dir/blob.bin", DATA)
    s3.reset()
    return "s3://storage/dir/blob.bin"


def _storage(s3: S3TestServer, **options: object) -> Storage:
    return Storage(StorageConfig(s3.storage_options(backoff_initial=0.01, backoff_max=0.05, **options)))


def test_a_ranged_read_is_one_get_with_if_match(s3: S3TestServer, blob: str) -> None:
    storage = _storage(s3)
    etag = s3.client().head_object(Bucket="storage", Key="dir/blob.bin")["ETag"]
    data, info = storage.read(blob, 1000, 5000, expect=Expect(len(DATA), etag))
    assert bytes(data) == DATA[1000:5000] and info.size == len(DATA) and info.etag == etag
    [request] = s3.requests()
    assert (request.method, request.range, request.if_match, request.bytes) == ("GET", (1000, 5000), etag, 4000)
    assert storage.stats.gets == 1 and storage.stats.heads == 0 and storage.stats.bytes_read == 4000


@pytest.mark.parametrize("kind", ["503", "500", "truncate"])
def test_transient_faults_are_retried_and_counted(s3: S3TestServer, blob: str, kind: str) -> None:
    storage = _storage(s3)
    s3.faults(rules=[{"kind": kind, "times": 2}])
    data, _ = storage.read(blob, 0, 50000, expect=Expect(len(DATA)))
    assert bytes(data) == DATA[:50000]
    assert [r.fault for r in s3.requests()] == [kind, kind, None]
    stats = storage.stats
    assert (stats.gets, stats.retries, stats.errors) == (3, 2, 2)


def test_retries_end_in_a_named_error(s3: S3TestServer, blob: str) -> None:
    storage = _storage(s3, max_retries=2)
    s3.faults(rules=[{"kind": "503", "times": 10}])
    with pytest.raises(RemoteStorageError, match=r"GET s3://storage/dir/blob\.bin bytes 0-99 failed after 3 attempt"):
        storage.read(blob, 0, 100)
    assert len(s3.requests()) == 3


def test_a_stalled_request_times_out(s3: S3TestServer, blob: str) -> None:
    storage = _storage(s3, timeout=0.3, max_retries=1)
    s3.faults(rules=[{"kind": "stall", "times": 2}], stall_s=1.0)
    with pytest.raises(RemoteTimeoutError, match=r"GET s3://storage/dir/blob\.bin bytes 0-99 timed out"):
        storage.read(blob, 0, 100)


def test_a_replaced_object_is_refused(s3: S3TestServer, blob: str) -> None:
    storage = _storage(s3)
    etag = s3.client().head_object(Bucket="storage", Key="dir/blob.bin")["ETag"]
    s3.put_bytes("storage", "dir/blob.bin", DATA[::-1])
    with pytest.raises(FileChangedError, match="its ETag differs from the one the index recorded"):
        storage.read(blob, 0, 100, expect=Expect(len(DATA), etag))
    s3.put_bytes("storage", "dir/blob.bin", DATA[:1000])
    with pytest.raises(FileChangedError, match="holds 1000 bytes where the index recorded 102400"):
        storage.read(blob, 0, 100, expect=Expect(len(DATA)))


def test_missing_objects_and_refused_credentials(s3: S3TestServer, blob: str) -> None:
    with pytest.raises(MissingFileError, match=r"GET s3://storage/dir/none\.bin: the object does not exist \(.*404"):
        _storage(s3).read("s3://storage/dir/none.bin")
    anonymous = Storage(
        StorageConfig({"endpoint": s3.endpoint, "allow_http": True, "anonymous": True, "region": "us-east-1"})
    )
    with pytest.raises(RemoteAccessError, match="access denied"):
        anonymous.read(blob, 0, 10)


def test_list_write_and_head(s3: S3TestServer, blob: str) -> None:
    storage = _storage(s3)
    storage.write("s3://storage/dir/sub/new.txt", b"hello")
    listed = storage.list("s3://storage/dir")
    assert [(u, i.size) for u, i in listed] == [(blob, len(DATA)), ("s3://storage/dir/sub/new.txt", 5)]
    assert storage.head(blob).size == len(DATA)
    assert s3.counts() == {"PUT": 1, "GET": 1, "HEAD": 1}, s3.requests()


def test_the_training_process_stays_fork_safe(s3: S3TestServer, blob: str) -> None:
    """Outside DataLoader workers, requests go through the helper process: obstore never runs here."""
    from lightning_vstream.storage import obstore_transport

    storage = _storage(s3)
    storage.read(blob, 0, 10)
    assert type(storage.transport(blob)[0]).__name__ == "HelperTransport"
    assert obstore_transport._RUNTIME_PID is None
    pid = os.fork()
    if pid == 0:  # a forked child reads too (its own helper), and exits
        try:
            data, _ = storage_for(StorageConfig(s3.storage_options())).read(blob, 0, 10)
            os._exit(0 if bytes(data) == DATA[:10] else 1)
        except BaseException:
            os._exit(2)
    assert os.waitpid(pid, 0)[1] == 0


def test_fsspec_serves_other_schemes() -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe_file("/bucket/obj.bin", DATA)
    storage = Storage(StorageConfig())
    data, info = storage.read("memory://bucket/obj.bin", 10, 20)
    assert bytes(data) == DATA[10:20] and info.size == -1
    data, info = storage.read("memory://bucket/obj.bin")
    assert bytes(data) == DATA and info.size == len(DATA)
    with pytest.raises(MissingFileError):
        storage.read("memory://bucket/none.bin", 0, 5)


def test_the_standard_environment_reaches_the_store(
    s3: S3TestServer, blob: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_vstream.storage.obstore_transport import close_helper

    for key, value in s3.environment().items():
        monkeypatch.setenv(key, value)
    close_helper()  # the training process's helper took its environment when it started
    try:
        data, _ = storage_for(StorageConfig({})).read(blob, start=0, end=8)
    finally:
        close_helper()
    assert len(bytes(data)) == 8 and [r.method for r in s3.requests()] == ["GET"]
