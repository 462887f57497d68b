"""URLs everywhere a path is accepted: load_index, VideoClipDataset and both DataModules on the moto S3 server."""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_vstream import (
    ClipVideoDataModule,
    DecodeOptions,
    EngineOptions,
    ErrorOptions,
    SamplingOptions,
    StorageConfig,
    StreamVideoDataModule,
    VideoClipDataset,
    at_indices,
    load_index,
)
from lightning_vstream.demos.synth import clip_number, read_stamp
from lightning_vstream.errors import ConfigurationError, FileChangedError, IndexValidationError, MissingFileError
from tests._s3 import S3TestServer

BUCKET = "remote-index"


@pytest.fixture(scope="module")
def local_index(make_dataset: Callable[..., Path]) -> Path:
    """Three clips, two cameras, B-frames: uploaded as it is (index and tables built locally)."""
    return make_dataset(clips=3, cameras=2, frames=[14, 10, 12], size=(64, 48), gop=5, bframes=1)


@pytest.fixture
def remote_url(s3: S3TestServer, local_index: Path) -> str:
    url = s3.upload(local_index.parent, BUCKET, "ds")
    s3.reset()
    return f"{url}/index.json"


def _stamps_match(frames: torch.Tensor, clip_id: str, frame_index: list[int], cameras: int) -> None:
    for t, frame in enumerate(frame_index):
        for camera in range(cameras):
            stamp = read_stamp(frames[t, camera])
            assert (stamp.clip, stamp.camera, stamp.frame) == (clip_number(clip_id), camera, frame)


def test_load_index_from_a_url(s3: S3TestServer, local_index: Path, remote_url: str, tmp_path: Path) -> None:
    local = load_index(local_index)
    options = s3.storage_options()
    index = load_index(remote_url, storage_options=options, cache_dir=str(tmp_path / "cache"))
    assert index.source == remote_url and isinstance(index.source, str)
    assert [c.clip_id for c in index] == [c.clip_id for c in local] and index.camera_names == local.camera_names
    cam = index.clips[1].cameras[0]
    assert cam.path == f"s3://{BUCKET}/ds/videos/scene-0001/CAM_BACK.mp4"
    assert cam.info == local.clips[1].cameras[0].info and cam.info.layout is not None  # type: ignore[union-attr]
    assert [(r.method, r.path.rsplit("/", 1)[1]) for r in s3.requests()] == [
        ("GET", "index.json"),
        ("HEAD", "index.tables.bin"),
        ("GET", "index.tables.bin"),
    ]
    s3.reset()
    # The tables are this machine's now: a second load reads the index and asks for the tables' ETag only.
    load_index(remote_url, storage_options=options, cache_dir=str(tmp_path / "cache"))
    assert [r.method for r in s3.requests()] == ["GET", "HEAD"]
    assert len(list((tmp_path / "cache" / "tables").iterdir())) == 1


def test_thorough_check_compares_sizes_with_one_head_per_file(s3: S3TestServer, remote_url: str) -> None:
    index = load_index(remote_url, storage_options=s3.storage_options(), check="thorough")
    files = sum(len(c.cameras) for c in index)
    assert s3.counts()["HEAD"] == files + 1
    s3.put_bytes(BUCKET, "ds/videos/scene-0002/CAM_BACK_LEFT.mp4", b"not a video any more")
    with pytest.raises(
        FileChangedError,
        match=r"scene-0002/CAM_BACK_LEFT\.mp4' \(camera 'CAM_BACK_LEFT'\) changed .*size \d+ -> 20 bytes",
    ):
        load_index(remote_url, storage_options=s3.storage_options(), check="thorough")


def test_tables_without_byte_ranges_are_refused_for_a_url(s3: S3TestServer, local_index: Path, tmp_path: Path) -> None:
    from tests.test_packet_tables import write_tables_without_byte_ranges

    old = tmp_path / "old"
    shutil.copytree(local_index.parent, old)
    write_tables_without_byte_ranges(old / "index.tables.bin", version=1)
    url = s3.upload(old, BUCKET, "old-tables") + "/index.json"
    with pytest.raises(
        IndexValidationError,
        match=r"index\.tables\.bin' \(format version 1\) does not record the packets' byte ranges.*"
        r"Rebuild it with `vstream index --tables s3://remote-index/old-tables/index\.json`",
    ):
        load_index(url, storage_options=s3.storage_options(), cache_dir=str(tmp_path / "cache"))


def test_missing_index_and_bad_options(s3: S3TestServer, remote_url: str) -> None:
    with pytest.raises(MissingFileError, match=r"index file 's3://remote-index/ds/nope\.json' does not exist"):
        load_index(f"s3://{BUCKET}/ds/nope.json", storage_options=s3.storage_options())
    with pytest.raises(ConfigurationError, match="unknown key"):
        load_index(remote_url, storage_options={"endpoint_url": s3.endpoint})


def test_an_index_without_tables_lists_its_folders_and_reads_through_containers(
    s3: S3TestServer, local_index: Path
) -> None:
    s3.bucket(BUCKET)
    for path in sorted((local_index.parent / "videos").rglob("*.mp4")):
        s3.client().upload_file(str(path), BUCKET, f"bare/videos/{path.parent.name}/{path.name}")
    s3.client().upload_file(str(local_index), BUCKET, "bare/index.json")
    s3.reset()
    with pytest.warns(UserWarning, match="integrity checks are off"):
        index = load_index(f"s3://{BUCKET}/bare/index.json", storage_options=s3.storage_options())
    # The index, the tables (HEAD, absent), the JSON sidecar (absent) and one listing of the video folder.
    assert [(r.method, r.status, "list-type" in r.query) for r in s3.requests()] == [
        ("GET", 200, False),
        ("HEAD", 404, False),
        ("GET", 404, False),
        ("GET", 200, True),
    ]
    dataset = VideoClipDataset(index=index, requests=[at_indices("scene-0001", [0, 7])])
    sample = dataset[0]
    _stamps_match(sample["frames"], "scene-0001", [0, 7], 2)


def test_video_clip_dataset_takes_a_url(s3: S3TestServer, local_index: Path, remote_url: str) -> None:
    requests = [at_indices("scene-0000", [1, 6, 11]), at_indices("scene-0002", [3, 4])]
    dataset = VideoClipDataset(index=remote_url, requests=requests, storage=StorageConfig(options=s3.storage_options()))
    local = VideoClipDataset(index=local_index, requests=requests)
    s3.reset()
    for i, request in enumerate(requests):
        sample = dataset[i]
        assert torch.equal(sample["frames"], local[i]["frames"])
        _stamps_match(sample["frames"], request.clip_id, list(request.frames), 2)
    assert set(s3.counts()) == {"GET"}  # no HEAD per open: the tables hold each file's size


def test_stream_datamodule_from_s3_equals_local(s3: S3TestServer, local_index: Path, remote_url: str) -> None:
    common: dict[str, Any] = {"batch_size": 2, "engine": EngineOptions(num_workers=0), "seed": 3}
    secret = s3.storage_options(secret_access_key="kept-in-memory-only")
    remote = StreamVideoDataModule(index_file=remote_url, storage=StorageConfig(options=secret), **common)
    local = StreamVideoDataModule(index_file=str(local_index), **common)
    for dm in (remote, local):
        dm.setup("fit")
    got = list(remote.train_dataloader())
    expected = list(local.train_dataloader())
    assert len(got) == len(expected) > 0
    for a, b in zip(got, expected):
        assert torch.equal(a["frames"], b["frames"]) and a["clip_id"] == b["clip_id"]
    # URLs stay strings and secrets stay out of what checkpoints and loggers see.
    assert remote.hparams["index_file"] == remote_url
    assert remote.hparams["storage"]["options"]["secret_access_key"] is None
    assert "storage" not in remote.hparams_initial
    assert secret["secret_access_key"] not in repr(dict(remote.hparams))


def test_clip_datamodule_from_s3(s3: S3TestServer, remote_url: str) -> None:
    dm = ClipVideoDataModule(
        index_file=remote_url,
        storage=StorageConfig(options=s3.storage_options()),
        batch_size=2,
        engine=EngineOptions(num_workers=0),
        sampling=SamplingOptions(clip_frames=3),
    )
    dm.setup("fit")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = next(iter(dm.train_dataloader()))
    for b in range(batch["frames"].shape[0]):
        _stamps_match(batch["frames"][b], batch["clip_id"][b], batch["frame_index"][b].tolist(), 2)
    assert dm.hparams["index_file"] == remote_url and dm.hparams["storage"]["options"]["access_key_id"] == "testing"


@pytest.mark.parametrize("context", ["fork", "forkserver", "spawn"])
def test_workers_read_from_s3_under_every_start_method(
    s3: S3TestServer, local_index: Path, remote_url: str, context: str
) -> None:
    common: dict[str, Any] = {"batch_size": 2, "seed": 1}
    remote = StreamVideoDataModule(
        index_file=remote_url,
        storage=StorageConfig(options=s3.storage_options()),
        engine=EngineOptions(kind="workers", num_workers=2, multiprocessing_context=context),
        errors=ErrorOptions(timeout=60),
        **common,
    )
    local = StreamVideoDataModule(index_file=str(local_index), engine=EngineOptions(num_workers=0), **common)
    for dm in (remote, local):
        dm.setup("fit")
    got = list(remote.train_dataloader())
    expected = list(local.train_dataloader())
    assert [b["clip_id"] for b in got] == [b["clip_id"] for b in expected]
    assert all(torch.equal(a["frames"], b["frames"]) for a, b in zip(got, expected))
    files = sum(len(c.cameras) for c in local.index())
    gets = s3.counts()["GET"]
    assert files <= gets and "HEAD" in s3.counts()  # the tables' HEAD at setup; no HEAD per open
    # The index's clips are arrays: a spawn or forkserver worker re-reads the index (one GET each) through
    # the storage options it was loaded with; a forked one has it already.
    index_gets = [r for r in s3.requests() if r.method == "GET" and r.path.endswith("/index.json")]
    assert len(index_gets) == (1 if context == "fork" else 3)


def test_random_access_fetches_the_next_batch_ahead(s3: S3TestServer, remote_url: str, tmp_path: Path) -> None:
    from lightning_vstream.storage import StorageConfig
    from lightning_vstream.storage.fetcher import fetcher_for

    options = s3.storage_options()
    dm = ClipVideoDataModule(
        index_file=remote_url,
        storage=StorageConfig(options=options, cache_dir=str(tmp_path)),
        batch_size=2,
        engine=EngineOptions(num_workers=0),
        sampling=SamplingOptions(clip_frames=2),
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    # Each item names the request its process reads one batch later (no workers: the next batch).
    sampler = loader.sampler
    assert sampler.lookahead == 2  # type: ignore[attr-defined]
    items = list(sampler)
    assert [item.ahead for item in items] == [item.request for item in items[2:]] + [None, None]
    config = StorageConfig(options, cache_dir=str(tmp_path))
    before = fetcher_for(config).stats
    s3.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batches = list(loader)
    assert len(batches) > 2
    after = fetcher_for(config).stats
    # Batches after the first find their GOPs fetched ahead (or on their way); with the cache, none twice.
    assert after.prefetch_hits - before.prefetch_hits > 0
    # The loader counts this process's remote reading (as of its last batch).
    counted = dm.decode_stats().remote
    assert 0 < counted.gets <= after.gets and 0 < counted.prefetch_hits <= after.prefetch_hits
    requested = [(r.path, r.range) for r in s3.requests() if r.path.endswith(".mp4")]
    assert len(requested) == len(set(requested))


def test_lightning_cli_configures_remote_storage(
    s3: S3TestServer, remote_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import sys

    from lightning_vstream import VStreamCLI
    from lightning_vstream.demos.models import TinyStreamPETR

    monkeypatch.setattr(sys, "argv", ["train"])  # LightningCLI(args=...) warns about pytest's own argv
    options = s3.storage_options()
    cli = VStreamCLI(
        TinyStreamPETR,
        StreamVideoDataModule,
        run=False,
        save_config_kwargs={"overwrite": True},
        args=[
            "--seed_everything=0",
            f"--data.index_file={remote_url}",
            f"--data.storage.options={json.dumps(options)}",
            f"--data.storage.cache_dir={tmp_path / 'cache'}",
            "--data.storage.cache_limit=20GB",
            "--data.engine.num_workers=0",
            "--trainer.logger=false",
            f"--trainer.default_root_dir={tmp_path}",
        ],
    )
    dm = cli.datamodule
    assert dm.index_files["train"] == remote_url and dm.storage.cache_limit == 20 * 10**9
    dm.setup("fit")
    assert len(dm.index("train")) == 3 and dm.index("train").storage is not None


def test_decoding_a_remote_index_on_the_gpu_is_refused_clearly(s3: S3TestServer, remote_url: str) -> None:
    from lightning_vstream.decode import make_decoder
    from lightning_vstream.stream.engine_loader import build_engine_loader
    from lightning_vstream.stream.sampler import StreamSampler

    index = load_index(remote_url, storage_options=s3.storage_options())
    s3.reset()
    with pytest.raises(ConfigurationError, match=r"is remote: decoding remote files on 'cuda' is not supported yet"):
        VideoClipDataset(index=index, requests=[at_indices("scene-0000", [0])], decode=DecodeOptions(device="cuda"))
    sampler = StreamSampler(list(index.frame_counts), num_cameras=2, batch_size=2)
    with pytest.raises(ConfigurationError, match=r"is remote: decoding remote files on the GPU is not supported yet"):
        build_engine_loader(index, sampler, "cuda:0")
    cam = index.clips[0].cameras[0]
    with pytest.raises(ConfigurationError, match=r"decoding remote files on 'cuda:0' is not supported yet"):
        make_decoder(cam.path, info=cam.info, device="cuda:0", storage=index.storage)
    assert s3.requests() == []  # refused before any request


def test_clip_datamodule_workers_read_from_s3_and_count(s3: S3TestServer, remote_url: str, local_index: Path) -> None:
    common: dict[str, Any] = {
        "batch_size": 2,
        "sampling": SamplingOptions(clip_frames=3),
        "seed": 2,
        "errors": ErrorOptions(timeout=120),
    }
    remote = ClipVideoDataModule(
        index_file=remote_url,
        storage=StorageConfig(options=s3.storage_options()),
        engine=EngineOptions(num_workers=2, multiprocessing_context="spawn"),
        **common,
    )
    local = ClipVideoDataModule(index_file=str(local_index), engine=EngineOptions(num_workers=0), **common)
    for dm in (remote, local):
        dm.setup("fit")
    loader = remote.train_dataloader()
    assert loader.sampler.lookahead == 4  # type: ignore[attr-defined]  # two workers take batches in turn
    s3.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = list(loader)
        expected = list(local.train_dataloader())
    assert [b["clip_id"] for b in got] == [b["clip_id"] for b in expected]
    assert all(torch.equal(a["frames"], b["frames"]) for a, b in zip(got, expected))
    video_gets = [r for r in s3.requests() if r.method == "GET" and r.path.endswith(".mp4")]
    counted = remote.decode_stats().remote  # the workers' own counters, through the loader's shared memory
    index_gets = [r for r in s3.requests() if r.method == "GET" and r.path.endswith("/index.json")]
    assert len(index_gets) == 2  # one per spawn worker
    assert counted.gets == len(video_gets) + len(index_gets) and counted.bytes_read > 0
    remote.teardown()
