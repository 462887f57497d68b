"""Shared fixtures: small stamped datasets generated once per session."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from lightning_vstream.demos.synth import write_dataset

if TYPE_CHECKING:
    from tests._s3 import S3TestServer


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip `cuda` tests without a GPU; VSTREAM_REQUIRE_CUDA=1 turns that skip into a failure."""
    if "cuda" not in item.keywords or _cuda_available():
        return
    if os.environ.get("VSTREAM_REQUIRE_CUDA", "") not in ("", "0"):
        pytest.fail("VSTREAM_REQUIRE_CUDA=1 is set but CUDA is not available", pytrace=False)
    pytest.skip("needs CUDA and PyNvVideoCodec")


@pytest.fixture(scope="session")
def make_dataset(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory writing a stamped dataset (cached per parameter set); returns the index path."""
    cache: dict[tuple[Any, ...], Path] = {}

    def make(**kwargs: Any) -> Path:
        key = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in kwargs.items()))
        if key not in cache:
            root = tmp_path_factory.mktemp("dataset")
            cache[key] = write_dataset(root, **kwargs)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def small_index(make_dataset: Callable[..., Path]) -> Path:
    """Three clips of uneven length, two cameras, 64x48 H.264, GOP 6."""
    return make_dataset(clips=3, cameras=2, frames=[20, 13, 27], size=(64, 48), gop=6)


def batch_stamp_errors(batch: dict[str, Any]) -> list[str]:
    """Every (slot, camera) of a streaming batch whose stamp disagrees with its labels."""
    from lightning_vstream.demos.synth import clip_number, read_stamp

    errors = []
    frames = batch["frames"]
    for slot in range(frames.shape[0]):
        if "valid" in batch and not bool(batch["valid"][slot]):
            continue
        expected = (clip_number(batch["clip_id"][slot]), int(batch["frame_index"][slot]))
        for camera in range(frames.shape[1]):
            stamp = read_stamp(frames[slot, camera])
            if (stamp.clip, stamp.frame) != expected or stamp.camera != camera:
                errors.append(f"slot {slot} camera {camera}: expected clip/frame {expected}, read {stamp}")
    return errors


@pytest.fixture
def assert_stamps() -> Callable[[dict[str, Any]], None]:
    """Asserts that every frame of a streaming batch carries the stamp its labels promise."""

    def check(batch: dict[str, Any]) -> None:
        errors = batch_stamp_errors(batch)
        assert not errors, "\n".join(errors[:10])

    return check


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3TestServer]:
    """moto's S3 server in a subprocess behind the fault-injecting proxy, for the whole session."""
    pytest.importorskip("moto.server", reason="remote-storage tests need moto[server] (the test extra)")
    from tests._s3 import S3TestServer

    server = S3TestServer(tmp_path_factory.mktemp("s3-server")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3(s3_server: S3TestServer) -> Iterator[S3TestServer]:
    """The session's S3 server with an empty request log and no faults, reset again afterwards."""
    s3_server.reset()
    try:
        yield s3_server
    finally:
        s3_server.reset()
