"""The node cache: one download per GOP per machine, shared by ranks and processes, verified, bounded, plan-evicted."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_vstream import EngineOptions, StorageConfig, StreamVideoDataModule
from lightning_vstream.storage.cache import NodeCache, planned_priority
from lightning_vstream.storage.client import Storage
from lightning_vstream.storage.fetcher import Fetcher, Unit
from tests._s3 import S3TestServer
from tests.conftest import batch_stamp_errors

BUCKET = "remote-cache"
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def local_index(make_dataset: Callable[..., Path]) -> Path:
    return make_dataset(clips=6, cameras=2, frames=[12, 9, 10, 8, 11, 9], size=(64, 48), gop=4)


@pytest.fixture
def remote_url(s3: S3TestServer, local_index: Path) -> str:
    url = s3.upload(local_index.parent, BUCKET, "ds")
    s3.reset()
    return f"{url}/index.json"


def _dm(url: str, s3: S3TestServer, cache: Path, **kw: Any) -> StreamVideoDataModule:
    dm = StreamVideoDataModule(
        index_file=url,
        storage=StorageConfig(options=s3.storage_options(), cache_dir=str(cache)),
        batch_size=2,
        engine=EngineOptions(num_workers=0),
        seed=2,
        **kw,
    )
    dm.setup("fit")
    return dm


def _run(dm: StreamVideoDataModule) -> list[torch.Tensor]:
    frames = []
    for batch in dm.train_dataloader():
        assert not batch_stamp_errors(batch)
        frames.append(batch["frames"].clone())
    return frames


def _video_gets(s3: S3TestServer) -> list[Any]:
    return [r for r in s3.requests() if r.method == "GET" and r.path.endswith(".mp4")]


def test_the_cache_serves_every_gop_again_and_survives_a_restart(
    s3: S3TestServer, remote_url: str, tmp_path: Path
) -> None:
    first = _run(_dm(remote_url, s3, tmp_path / "cache"))
    downloaded = _video_gets(s3)
    assert downloaded
    s3.reset()
    again = _dm(remote_url, s3, tmp_path / "cache")  # a new DataModule: what a restarted job makes
    assert all(torch.equal(a, b) for a, b in zip(_run(again), first))
    assert _video_gets(s3) == []  # every GOP came from the cache: one download per GOP per machine
    stats = again.decode_stats("train").remote
    assert stats.cache_hits > 0


def test_a_corrupt_cached_gop_is_fetched_again(s3: S3TestServer, remote_url: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    expected = _run(_dm(remote_url, s3, cache))
    files = sorted((cache / "gops").rglob("*.gop"))
    victim = files[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    s3.reset()
    dm = _dm(remote_url, s3, cache)
    assert all(torch.equal(a, b) for a, b in zip(_run(dm), expected))
    assert len(_video_gets(s3)) == 1  # the damaged GOP, read again from the store
    assert victim.read_bytes() != bytes(data)  # and repaired in the cache


def test_eviction_keeps_what_the_plan_needs_soonest(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path, limit=3000)
    for name, next_use in (("a", 5), ("b", 50), ("c", None), ("d", 1)):
        cache.put(name * 40, b"x" * 1000, priority=None if next_use is None else planned_priority(next_use))
    # 4000 bytes > 3000: the unplanned GOP goes first, then the one needed furthest in the future (b).
    kept = {name for name in "abcd" if cache.contains(name * 40)}
    assert kept == {"a", "d"} and cache.size <= 3000
    lru = NodeCache(tmp_path / "lru", limit=3000, policy="lru")
    for name in "abcd":
        lru.put(name * 40, b"x" * 1000, priority=planned_priority(1))  # "lru" ignores the plan
    assert {name for name in "abcd" if lru.contains(name * 40)} == {"c", "d"}


def test_the_cache_stays_under_its_limit(s3: S3TestServer, remote_url: str, local_index: Path, tmp_path: Path) -> None:
    total = sum(p.stat().st_size for p in (local_index.parent / "videos").rglob("*.mp4"))
    limit = total // 3
    dm = StreamVideoDataModule(
        index_file=remote_url,
        storage=StorageConfig(options=s3.storage_options(), cache_dir=str(tmp_path / "cache"), cache_limit=limit),
        batch_size=2,
        engine=EngineOptions(num_workers=0),
        seed=2,
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    for epoch in range(3):
        loader.sampler.set_epoch(epoch)
        for batch in loader:
            assert not batch_stamp_errors(batch)
        assert NodeCache(tmp_path / "cache").size <= limit
    stats = dm.decode_stats("train").remote
    assert stats.cache_evictions > 0 and stats.cache_hits + stats.cache_misses > 0


def test_two_processes_download_a_gop_once(
    s3: S3TestServer, remote_url: str, local_index: Path, tmp_path: Path
) -> None:
    """Two processes missing the same GOP at once: one downloads it, the other waits for the cache file."""
    data = (local_index.parent / "videos" / "scene-0000" / "CAM_BACK.mp4").read_bytes()
    url = f"s3://{BUCKET}/ds/videos/scene-0000/CAM_BACK.mp4"
    unit = Unit(url, 0, len(data))
    config = StorageConfig(s3.storage_options())
    s3.faults(latency_ms=300)
    children = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            try:
                fetcher = Fetcher(Storage(config), NodeCache(tmp_path / "cache"), threads=0)
                ok = bytes(fetcher.get(unit)) == data
                os._exit(0 if ok else 1)
            except BaseException:
                os._exit(2)
        children.append(pid)
    assert [os.waitpid(pid, 0)[1] for pid in children] == [0, 0]
    assert len(_video_gets(s3)) == 1


def test_two_gloo_ranks_share_one_cache(s3: S3TestServer, remote_url: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "_remote_ranks.py"),
                remote_url,
                json.dumps(s3.storage_options()),
                str(cache),
                str(rank),
                "2",
                str(tmp_path / "init"),
                str(tmp_path / f"rank{rank}.json"),
            ],
            env=env,
        )
        for rank in range(2)
    ]
    try:
        assert [p.wait(timeout=240) for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(not r["errors"] for r in ranks)
    assert not set(ranks[0]["epochs"][0]["clips"]) & set(ranks[1]["epochs"][0]["clips"])  # disjoint shards
    # Every byte range of every file was downloaded once on this machine, whichever rank needed it first.
    ranges: dict[str, list[tuple[int, int]]] = {}
    for request in _video_gets(s3):
        assert request.range is not None
        ranges.setdefault(request.path, []).append(request.range)
    for spans in ranges.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans
    second = [r["epochs"][1]["stats"] for r in ranks]
    assert sum(s["cache_hits"] for s in second) > 0
