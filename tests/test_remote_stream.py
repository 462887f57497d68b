"""Streaming from S3: the plan fetches ahead (exact requests), faults under load, skips, and resume through S3."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_vstream import EngineOptions, ErrorOptions, StorageConfig, StreamVideoDataModule
from lightning_vstream.errors import ChecksumError, RemoteStorageError
from lightning_vstream.storage import StorageStats
from lightning_vstream.storage.fetcher import fetcher_for
from tests._s3 import S3TestServer
from tests.conftest import batch_stamp_errors

BUCKET = "remote-stream"


@pytest.fixture(scope="module")
def local_index(make_dataset: Callable[..., Path]) -> Path:
    """Five clips, two cameras, GOP 4 with B-frames: several GOPs per file."""
    return make_dataset(clips=5, cameras=2, frames=[13, 9, 11, 8, 10], size=(64, 48), gop=4, bframes=1)


@pytest.fixture
def remote_url(s3: S3TestServer, local_index: Path) -> str:
    url = s3.upload(local_index.parent, BUCKET, "ds")
    s3.reset()
    return f"{url}/index.json"


def _dm(
    index: str | Path, *, engine: EngineOptions | None = None, errors: ErrorOptions | None = None, **kw: Any
) -> StreamVideoDataModule:
    """A set-up DataModule: no worker processes unless ``engine`` asks for some, reads time out after 60 s."""
    engine = engine or EngineOptions()
    engine = replace(engine, num_workers=0 if engine.num_workers is None else engine.num_workers)
    errors = replace(errors or ErrorOptions(), timeout=60)
    options: dict[str, Any] = {"batch_size": 2, "seed": 5, **kw}
    dm = StreamVideoDataModule(index_file=index, engine=engine, errors=errors, **options)
    dm.setup("fit")
    return dm


def _epoch(dm: StreamVideoDataModule) -> list[dict[str, Any]]:
    return [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in b.items()} for b in dm.train_dataloader()]


def _video_gets(s3: S3TestServer) -> list[Any]:
    return [r for r in s3.requests() if r.method == "GET" and r.path.endswith(".mp4") and r.fault is None]


def _files_read(batches: list[dict[str, Any]], cameras: int) -> set[tuple[str, int]]:
    return {
        (clip, cam)
        for b in batches
        for clip, ok in zip(b["clip_id"], b["valid"].tolist())
        if ok
        for cam in range(cameras)
    }


@pytest.mark.parametrize("mode", ["in-process", "workers", "engine"])
def test_the_plan_fetches_each_file_in_one_request(
    s3: S3TestServer, local_index: Path, remote_url: str, mode: str
) -> None:
    kw: dict[str, Any] = {
        "in-process": {"engine": EngineOptions(kind="workers")},
        "workers": {"engine": EngineOptions(kind="workers", num_workers=2)},
        "engine": {"engine": EngineOptions(kind="threads")},
    }[mode]
    expected = _epoch(_dm(local_index, **kw))
    options = s3.storage_options()
    # Counters are per process (every loader of a process together): this test's share is a difference.
    before = fetcher_for(StorageConfig(options)).stats
    dm = _dm(remote_url, storage=StorageConfig(options=options), **kw)
    setup = s3.requests()  # the index, and the tables' HEAD (and GET, the first time on this machine)
    got = _epoch(dm)
    assert [b["clip_id"] for b in got] == [b["clip_id"] for b in expected]
    for a, b in zip(got, expected):
        assert torch.equal(a["frames"], b["frames"]) and not batch_stamp_errors(a)
    gets = _video_gets(s3)
    # Every file the epoch reads is smaller than 8 MiB: the plan fetches the GOPs of each segment it reads
    # in one request (a clip the plan cuts between two slots: one request per part), no HEAD.
    segments = dm._loaders["train"].sampler.schedule(0).segments
    assert {(s.clip, cam) for s in segments for cam in range(2)} == {
        (int(c[-4:]), cam) for c, cam in _files_read(got, 2)
    }
    assert len(gets) == len(segments) * 2 and s3.counts()["HEAD"] == 1
    # Every request of every decoding process is counted (the training process's own setup too when it decodes).
    stats = dm.decode_stats("train").remote
    if mode != "workers":
        stats = StorageStats(**{k: v - getattr(before, k) for k, v in stats.as_dict().items()})
    counted = [r for r in s3.requests() if r.method == "GET" and (mode != "workers" or r not in setup)]
    assert stats.gets == len(counted) and stats.bytes_read == sum(r.bytes for r in counted)
    assert stats.heads == (0 if mode == "workers" else 1)
    assert dm.decode_stats("train").remote.prefetch_peak_bytes > 0  # a maximum: not a difference


def test_faults_under_load_deliver_the_same_frames(s3: S3TestServer, local_index: Path, remote_url: str) -> None:
    expected = _epoch(_dm(local_index))
    options = s3.storage_options(backoff_initial=0.01, backoff_max=0.05)
    before = fetcher_for(StorageConfig(options)).stats
    dm = _dm(remote_url, storage=StorageConfig(options=options))
    s3.faults(rates={"503": 0.15, "500": 0.1, "truncate": 0.1, "flip": 0.1}, seed=7)
    got = _epoch(dm)
    faults = [r.fault for r in s3.requests() if r.fault]
    assert {"503", "500", "truncate", "flip"} <= set(faults)
    for a, b in zip(got, expected):
        assert torch.equal(a["frames"], b["frames"])
    stats = dm.decode_stats("train").remote
    assert stats.retries - before.retries == sum(f != "flip" for f in faults)  # every event counted
    assert stats.checksum_refetches - before.checksum_refetches == faults.count("flip")
    assert stats.checksum_failures == before.checksum_failures


@pytest.mark.parametrize("engine", ["workers", "threads"])
def test_a_failing_store_raises_also_under_skip(s3: S3TestServer, remote_url: str, engine: str) -> None:
    options = s3.storage_options(max_retries=1, backoff_initial=0.01)
    dm = _dm(
        remote_url,
        storage=StorageConfig(options=options),
        errors=ErrorOptions(on_error="skip"),
        engine=EngineOptions(kind=engine),
    )
    s3.faults(rules=[{"kind": "503", "times": 1000, "method": "GET", "match": "scene-0002/CAM_BACK.mp4"}])
    with pytest.raises(RemoteStorageError, match=r"GET s3://remote-stream/ds/videos/scene-0002/CAM_BACK\.mp4 bytes"):
        _epoch(dm)


def test_a_corrupt_object_is_skipped_and_counted(s3: S3TestServer, local_index: Path, remote_url: str) -> None:
    data = bytearray((local_index.parent / "videos" / "scene-0003" / "CAM_BACK.mp4").read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside a packet: same size, no ETag recorded (built locally), bad CRC
    s3.put_bytes(BUCKET, "ds/videos/scene-0003/CAM_BACK.mp4", bytes(data))
    dm = _dm(remote_url, storage=StorageConfig(options=s3.storage_options()), errors=ErrorOptions(on_error="raise"))
    with pytest.raises(ChecksumError, match=r"scene-0003/CAM_BACK\.mp4' \(clip 'scene-0003', camera 'CAM_BACK'\)"):
        _epoch(dm)
    before = fetcher_for(StorageConfig(s3.storage_options())).stats
    dm = _dm(remote_url, storage=StorageConfig(options=s3.storage_options()), errors=ErrorOptions(on_error="skip"))
    got = _epoch(dm)
    stats = dm.decode_stats("train")
    assert stats.bad_files == 1 and stats.skipped_clips == 1
    assert stats.remote.checksum_failures - before.checksum_failures == 1
    assert all(not batch_stamp_errors(b) for b in got)


def test_resume_through_s3_equals_an_uninterrupted_run(s3: S3TestServer, remote_url: str) -> None:
    options = s3.storage_options()
    whole = _epoch(_dm(remote_url, storage=StorageConfig(options=options)))
    first = _dm(remote_url, storage=StorageConfig(options=options))
    loader = first.train_dataloader()
    head = []
    for batch in loader:
        head.append(batch["frames"].clone())
        if len(head) == 3:
            break
    state = loader.state_dict()
    resumed = _dm(remote_url, storage=StorageConfig(options=options))
    again = resumed.train_dataloader()
    again.load_state_dict(state)
    tail = [b["frames"].clone() for b in again]
    assert len(head) + len(tail) == len(whole)
    assert all(torch.equal(a, b["frames"]) for a, b in zip(head + tail, whole))


def test_a_lightning_fit_from_s3_logs_the_remote_counters(s3: S3TestServer, remote_url: str, tmp_path: Path) -> None:
    import lightning.pytorch as pl

    from lightning_vstream.callbacks import StreamThroughputMonitor, TemporalStateReset
    from lightning_vstream.demos.models import TinyStreamPETR

    dm = StreamVideoDataModule(
        index_file=remote_url,
        storage=StorageConfig(options=s3.storage_options(), cache_dir=str(tmp_path)),
        batch_size=2,
        engine=EngineOptions(num_workers=0),
    )
    monitor = StreamThroughputMonitor(window=2, log_every_n_steps=2)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=4,
        callbacks=[monitor, TemporalStateReset()],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
        log_every_n_steps=2,
    )
    trainer.fit(TinyStreamPETR(), datamodule=dm)
    metrics = trainer.callback_metrics
    assert metrics["train/remote_requests"] > 0 and metrics["train/remote_bytes"] > 0
    assert metrics["train/cache_misses"] > 0 and "train/remote_retries" in metrics and "train/cache_hits" in metrics


def test_the_plan_spec_pickles_small_and_rebuilds_the_plan(s3: S3TestServer, remote_url: str) -> None:
    import pickle

    from lightning_vstream import load_index
    from lightning_vstream.stream.sampler import StreamSampler
    from lightning_vstream.stream.schedule import PlanSpec

    index = load_index(remote_url, storage_options=s3.storage_options())
    sampler = StreamSampler(index.frame_counts.tolist(), num_cameras=2, batch_size=2, seed=3)
    spec = PlanSpec.of(sampler, index)
    assert spec.clip_lengths is None and len(pickle.dumps(spec)) < 1024  # taken from the index's arrays
    assert spec.schedule(0, index).num_steps == sampler.schedule().num_steps
    other = StreamSampler([5] * len(index), num_cameras=2, batch_size=2)
    assert PlanSpec.of(other, index).clip_lengths == (5,) * len(index)
