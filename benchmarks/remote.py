"""Training from an object store: GOP reads against a local disk and against the naive way, in one run.

Everything runs on the same files, served by moto's S3 server behind the test suite's fault-injecting,
request-counting proxy (``tests/_s3.py``), all on this machine:

- **local**: ``StreamVideoDataModule`` on the files on disk (PyAV opens each file); and the same files
  through a ``file://`` URL, read GOP by GOP with ``pread`` (the path for shared file systems).
- **naive**: PyAV over an fsspec (s3fs) file object, with s3fs's default 50 MiB blocks and with 1 MiB
  blocks: random frames, and whole files streamed in order.
- **ours**: ``StreamVideoDataModule`` / ``VideoClipDataset`` on ``s3://`` with 0, 30 and 50 ms added
  per request (the proxy holds every request that long): GOP reads fetched ahead by the plan.

Reported per configuration: camera-frames/s of the loader alone (median and spread over repeats),
data-wait fraction with a simulated training step, GETs per camera-GOP (random access) and per file
and per MiB (streaming), HEADs, bytes read / bytes needed (the packets of the GOPs decoded), and the
prefetch memory peak. Then a fault mix (5% 503, 2% 500, 2% truncated bodies, 0.1% flipped bytes):
frames compared with the local run, events counted, a mid-epoch resume compared with the
uninterrupted run; and the node cache at 25% of the data over several epochs of one plan, evicting
by the plan and by LRU.

Every peer gets its best settings: the same streaming loader (``--engine``: DataLoader workers,
``--workers`` of them, forked, by default; or the thread engine, one decode thread per core), FFmpeg
threads chosen by FFmpeg, s3fs's own read-ahead cache; ours with its defaults (8 I/O threads, 256 MB
prefetch budget).

Usage::

    python benchmarks/remote.py                # writes benchmarks/remote.json next to the table
    python benchmarks/remote.py --quick        # smaller data, one repeat
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lightning_vstream import EngineOptions, ErrorOptions, StorageConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from lightning_vstream import StreamVideoDataModule, VideoClipDataset, at_indices, load_index
from lightning_vstream.decode.ranged.gop_reads import gop_runs
from lightning_vstream.demos.synth import clip_number, read_stamp, write_dataset
from lightning_vstream.storage.fetcher import fetcher_for
from tests._s3 import S3TestServer

BUCKET = "bench"


def _data(root: Path, args: argparse.Namespace) -> Path:
    width, height = args.size
    tag = f"{args.codec}_{width}x{height}_g{args.gop}_c{args.clips}x{args.cameras}_f{args.frames}"
    index = root / tag / "index.json"
    if not index.exists():
        print(f"generating {args.clips} clips x {args.cameras} cameras x {args.frames} frames ({tag}) ...", flush=True)
        write_dataset(
            index.parent,
            clips=args.clips,
            cameras=args.cameras,
            frames=args.frames,
            size=(width, height),
            codec=args.codec,
            gop=args.gop,
            bframes=2,
            jobs=os.cpu_count() or 1,
        )
    return index


def _video_requests(s3: S3TestServer) -> list[Any]:
    return [r for r in s3.requests() if r.path.endswith(".mp4")]


def _traffic(s3: S3TestServer) -> dict[str, int]:
    requests = _video_requests(s3)
    return {
        "gets": sum(r.method == "GET" for r in requests),
        "heads": sum(r.method == "HEAD" for r in requests),
        "bytes": sum(r.bytes for r in requests if r.method == "GET"),
    }


def _median(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "spread": (max(values) - min(values)) / statistics.median(values) if statistics.median(values) else 0.0,
    }


# -- random access -----------------------------------------------------------------------------
def _random_reads(index_path: Path, count: int, seed: int) -> list[tuple[str, str, int]]:
    """``(clip id, camera, frame)`` reads, one frame each from a random GOP of a random file."""
    index = load_index(index_path)
    rng = random.Random(seed)
    reads = []
    for _ in range(count):
        clip = rng.choice(index.clips)
        camera = rng.choice(clip.cameras)
        reads.append((clip.clip_id, camera.name, rng.randrange(clip.frame_count)))
    return reads


def _needed_bytes(index_path: Path, reads: list[tuple[str, str, int]]) -> int:
    index = load_index(index_path)
    total = 0
    for clip_id, camera, frame in reads:
        cam = next(c for c in index[clip_id].cameras if c.name == camera)
        info = cam.info
        assert info is not None and info.layout is not None
        runs = gop_runs(str(cam.path), info)
        total += sum(u.size for u in runs.units_for(info, [frame]))
    return total


def _naive_random(
    s3: S3TestServer, local: Path, reads: list[tuple[str, str, int]], block: int | None
) -> dict[str, Any]:
    import av
    import s3fs

    fs = s3fs.S3FileSystem(
        key="testing",
        secret="testing",
        client_kwargs={"endpoint_url": s3.endpoint, "region_name": "us-east-1"},
        **({"default_block_size": block} if block else {}),
        skip_instance_cache=True,
    )
    index = load_index(local)
    s3.reset()
    start = time.perf_counter()
    for clip_id, camera, frame in reads:
        cam = next(c for c in index[clip_id].cameras if c.name == camera)
        info = cam.info
        assert info is not None
        key = f"{BUCKET}/ds/videos/{clip_id}/{camera}.mp4"
        with fs.open(key, "rb", **({"block_size": block} if block else {})) as f, av.open(f) as container:
            stream = container.streams.video[0]
            container.seek(info.key_seek[info.gop_of(frame)], stream=stream, backward=True)
            for decoded in container.decode(stream):
                if decoded.pts == info.pts[frame]:
                    image = torch.from_numpy(decoded.to_ndarray(format="rgb24")).permute(2, 0, 1)
                    assert read_stamp(image).frame == frame
                    break
    seconds = time.perf_counter() - start
    return {"seconds": seconds, **_traffic(s3)}


# -- streaming ---------------------------------------------------------------------------------
def _stream(index: str, args: argparse.Namespace, *, storage: dict[str, Any] | None, step_ms: float) -> dict[str, Any]:
    """One epoch of the streaming loader: delivered camera-frames/s after the first batch, and data wait."""
    dm = StreamVideoDataModule(
        index_file=index,
        storage=StorageConfig(options=storage),
        batch_size=args.batch,
        engine=EngineOptions(
            kind=args.engine,
            num_workers=args.workers,
            multiprocessing_context="fork" if args.engine == "workers" else None,
        ),
        seed=0,
        errors=ErrorOptions(timeout=600),
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    frames = 0
    wait = busy = 0.0
    errors = 0
    it = iter(loader)
    first = next(it)  # workers started, first GOPs in: not counted
    cams = first["frames"].shape[1]
    start = time.perf_counter()
    mark = start
    for batch in it:
        now = time.perf_counter()
        wait += now - mark
        frames += int(batch["valid"].sum()) * cams
        for slot in range(batch["frames"].shape[0]):
            stamp = read_stamp(batch["frames"][slot, 0])
            errors += (stamp.clip, stamp.frame) != (
                clip_number(batch["clip_id"][slot]),
                int(batch["frame_index"][slot]),
            )
        if step_ms:
            time.sleep(step_ms / 1000)  # the training step the loader runs beside
        busy_end = time.perf_counter()
        busy += busy_end - now
        mark = busy_end
    elapsed = time.perf_counter() - start
    stats = dm.decode_stats("train")
    dm.teardown()
    return {
        "frames_per_sec": frames / elapsed if elapsed else 0.0,
        "data_wait_fraction": wait / elapsed if elapsed else 0.0,
        "stamp_errors": errors,
        "prefetch_peak_bytes": stats.remote.prefetch_peak_bytes,
        "remote": stats.remote.as_dict(),
    }


def _naive_stream(s3: S3TestServer, local: Path, block: int | None) -> dict[str, Any]:
    """Every file decoded in order through PyAV over an s3fs file object."""
    import av
    import s3fs

    fs = s3fs.S3FileSystem(
        key="testing",
        secret="testing",
        client_kwargs={"endpoint_url": s3.endpoint, "region_name": "us-east-1"},
        **({"default_block_size": block} if block else {}),
        skip_instance_cache=True,
    )
    index = load_index(local)
    s3.reset()
    start = time.perf_counter()
    frames = 0
    files = 0
    for clip in index:
        for cam in clip.cameras:
            key = f"{BUCKET}/ds/videos/{clip.clip_id}/{cam.name}.mp4"
            with fs.open(key, "rb", **({"block_size": block} if block else {})) as f, av.open(f) as container:
                for decoded in container.decode(video=0):
                    decoded.to_ndarray(format="rgb24")
                    frames += 1
            files += 1
    return {
        "seconds": time.perf_counter() - start,
        "frames_per_sec": frames / (time.perf_counter() - start),
        "files": files,
    }


# -- faults, resume, cache -----------------------------------------------------------------------
def _epoch_frames(dm: StreamVideoDataModule) -> list[torch.Tensor]:
    return [b["frames"].clone() for b in dm.train_dataloader()]


def _faults(s3: S3TestServer, url: str, local: Path, args: argparse.Namespace) -> dict[str, Any]:
    options = s3.storage_options(backoff_initial=0.01, backoff_max=0.2)
    common: dict[str, Any] = {
        "batch_size": args.batch,
        "engine": EngineOptions(kind=args.engine, num_workers=args.workers),
        "seed": 4,
        "errors": ErrorOptions(timeout=600),
    }
    reference = StreamVideoDataModule(index_file=str(local), **common)
    reference.setup("fit")
    expected = _epoch_frames(reference)
    dm = StreamVideoDataModule(index_file=url, storage=StorageConfig(options=options), **common)
    dm.setup("fit")
    # Random access too (one request per GOP): every GOP of every file, several passes, in this process.
    index = load_index(local)
    samples = [
        at_indices(clip.clip_id, [min(k + 1, clip.frame_count - 1)])
        for clip in index
        for k in (index[clip.clip_id].cameras[0].info.key_indices if index[clip.clip_id].cameras[0].info else [0])
    ]
    remote_clips = VideoClipDataset(index=url, requests=samples, storage=StorageConfig(options=options))
    local_clips = VideoClipDataset(index=local, requests=samples)
    main_before = fetcher_for(StorageConfig(options)).stats
    s3.reset()
    s3.faults(rates={"503": 0.05, "500": 0.02, "truncate": 0.02, "flip": 0.001}, seed=1)
    got = _epoch_frames(dm)
    wrong_samples = 0
    for _ in range(args.fault_passes):
        for i in range(len(samples)):
            wrong_samples += not torch.equal(remote_clips[i]["frames"], local_clips[i]["frames"])
            remote_clips.close()  # each read fetches its GOP again
    injected = [r.fault for r in s3.requests() if r.fault]
    main_after = fetcher_for(StorageConfig(options)).stats
    stats = dm.decode_stats("train").remote
    retries = stats.retries + main_after.retries - main_before.retries
    refetches = stats.checksum_refetches + main_after.checksum_refetches - main_before.checksum_refetches
    wrong = sum(not torch.equal(a, b) for a, b in zip(got, expected)) + abs(len(got) - len(expected))
    # Resume: stop after half the epoch, restore the loader state in a new DataModule, compare.
    half = len(expected) // 2
    first = StreamVideoDataModule(index_file=url, storage=StorageConfig(options=options), **common)
    first.setup("fit")
    loader = first.train_dataloader()
    head = []
    for batch in loader:
        head.append(batch["frames"].clone())
        if len(head) == half:
            break
    state = loader.state_dict()
    first.teardown()
    resumed = StreamVideoDataModule(index_file=url, storage=StorageConfig(options=options), **common)
    resumed.setup("fit")
    again = resumed.train_dataloader()
    again.load_state_dict(state)
    tail = [b["frames"].clone() for b in again]
    s3.reset()
    return {
        "batches": len(got),
        "wrong_batches": wrong,
        "random_reads": len(samples) * args.fault_passes,
        "wrong_samples": wrong_samples,
        "injected": {k: injected.count(k) for k in sorted(set(injected))},
        "retries": retries,
        "checksum_refetches": refetches,
        "every_event_counted": retries == sum(f != "flip" for f in injected) and refetches == injected.count("flip"),
        "resume_identical": len(head) + len(tail) == len(expected)
        and all(torch.equal(a, b) for a, b in zip(head + tail, expected)),
    }


def _cache(s3: S3TestServer, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Many small GOPs (hit rates need many of them): the same plan read with the cache evicting by plan and by LRU."""
    small = argparse.Namespace(**{**vars(args), "size": (320, 180), "clips": 24, "cameras": 2, "frames": 60, "gop": 6})
    local = _data(root, small)
    url = s3.upload(local.parent, BUCKET, "cache-ds") + "/index.json"
    data_bytes = sum(p.stat().st_size for p in (local.parent / "videos").rglob("*.mp4"))
    limit = data_bytes // 4
    results: dict[str, Any] = {"data_bytes": data_bytes, "cache_limit": limit}
    for policy in ("plan", "lru"):
        cache = Path(tempfile.mkdtemp(prefix=f"vstream-bench-cache-{policy}-", dir=root))
        dm = StreamVideoDataModule(
            index_file=url,
            storage=StorageConfig(
                options=s3.storage_options(cache_policy=policy), cache_dir=str(cache), cache_limit=limit
            ),
            batch_size=args.batch,
            engine=EngineOptions(num_workers=0),
            seed=6,
        )
        dm.setup("fit")
        loader = dm.train_dataloader()
        hits = misses = 0
        for epoch in range(args.cache_epochs):
            loader.sampler.set_epoch(epoch)
            before = dm.decode_stats("train").remote if epoch else None
            for _ in loader:
                pass
            after = dm.decode_stats("train").remote
            if before is not None:  # the first epoch fills the cache
                hits += after.cache_hits - before.cache_hits
                misses += after.cache_misses - before.cache_misses
        results[policy] = {"hit_rate": hits / max(hits + misses, 1), "hits": hits, "misses": misses}
    results["plan_over_lru"] = results["plan"]["hit_rate"] / max(results["lru"]["hit_rate"], 1e-9)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "vstream-bench-remote")
    parser.add_argument("--size", type=lambda t: tuple(int(v) for v in t.split("x")), default=(640, 360))
    parser.add_argument("--codec", default="hevc")
    parser.add_argument("--clips", type=int, default=8)
    parser.add_argument("--cameras", type=int, default=3)
    parser.add_argument("--frames", type=int, default=48)
    parser.add_argument("--gop", type=int, default=12)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--engine", choices=["workers", "threads"], default="workers", help="the streaming loader")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (engine 'workers')")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--random-reads", type=int, default=40)
    parser.add_argument("--step-ms", type=float, default=15.0, help="simulated training step for the data-wait figure")
    parser.add_argument("--cache-epochs", type=int, default=5)
    parser.add_argument("--fault-passes", type=int, default=3, help="random-access passes over every GOP under faults")
    parser.add_argument("--latencies", default="0,30,50")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    args = parser.parse_args()
    if args.quick:
        args.clips, args.frames, args.repeats, args.random_reads, args.cache_epochs, args.fault_passes = (
            6,
            36,
            1,
            20,
            3,
            1,
        )
    args.data.mkdir(parents=True, exist_ok=True)
    local = _data(args.data, args)
    s3 = S3TestServer(args.data / "s3-server").start()
    report: dict[str, Any] = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load": os.getloadavg()},
        "data": {
            k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items() if k not in ("out", "data")
        },
    }
    try:
        base = s3.upload(local.parent, BUCKET, "ds")
        url = f"{base}/index.json"
        index = load_index(local)
        files = sum(len(c.cameras) for c in index)
        gops = sum(len(cam.info.key_indices) for c in index for cam in c.cameras if cam.info is not None)
        needed_stream = sum(
            sum(cam.info.layout.size) for c in index for cam in c.cameras if cam.info and cam.info.layout
        )
        report["files"], report["gops"] = files, gops

        # Random access: one frame of one GOP per read.
        reads = _random_reads(local, args.random_reads, seed=3)
        needed = _needed_bytes(local, reads)
        random_rows: dict[str, Any] = {}
        local_clips = VideoClipDataset(index=local, requests=[])
        start = time.perf_counter()
        for clip_id, camera, frame in reads:
            sample = local_clips[at_indices(clip_id, [frame], cameras=[camera])]
            assert read_stamp(sample["frames"][0, 0]).frame == frame
            local_clips.close()
        random_rows["local"] = {
            "seconds": time.perf_counter() - start,
            "gets": 0,
            "heads": 0,
            "bytes": 0,
            "gets_per_read": 0.0,
            "heads_per_read": 0.0,
            "bytes_over_needed": float("nan"),
        }
        for name, block in (("naive_default_blocks", None), ("naive_1MiB_blocks", 1 << 20)):
            row = _naive_random(s3, local, reads, block)
            random_rows[name] = {
                **row,
                "gets_per_read": row["gets"] / len(reads),
                "heads_per_read": row["heads"] / len(reads),
                "bytes_over_needed": row["bytes"] / needed,
            }
        for latency in [float(v) for v in args.latencies.split(",")]:
            dataset = VideoClipDataset(index=url, requests=[], storage=StorageConfig(options=s3.storage_options()))
            s3.reset()
            s3.faults(latency_ms=latency)
            start = time.perf_counter()
            for clip_id, camera, frame in reads:
                sample = dataset[at_indices(clip_id, [frame], cameras=[camera])]
                assert read_stamp(sample["frames"][0, 0]).frame == frame
                dataset.close()  # each read opens its file afresh, as a random sampler over many files does
            seconds = time.perf_counter() - start
            traffic = _traffic(s3)
            s3.reset()
            random_rows[f"ours_{latency:g}ms"] = {
                "seconds": seconds,
                **traffic,
                "gets_per_read": traffic["gets"] / len(reads),
                "heads_per_read": traffic["heads"] / len(reads),
                "bytes_over_needed": traffic["bytes"] / needed,
            }
        report["random_access"] = {"reads": len(reads), "bytes_needed": needed, **random_rows}

        # Streaming: one epoch per repeat.
        stream: dict[str, Any] = {}
        for name, block in (("naive_default_blocks", None), ("naive_1MiB_blocks", 1 << 20)):
            row = _naive_stream(s3, local, block)
            traffic = _traffic(s3)
            stream[name] = {
                **row,
                **traffic,
                "gets_per_file": traffic["gets"] / files,
                "bytes_over_needed": traffic["bytes"] / needed_stream,
            }
        configs: list[tuple[str, str, dict[str, Any] | None, float]] = [
            ("local", str(local), None, 0.0),
            ("local_gop_reads_file_url", f"file://{local}", {}, 0.0),  # the same files, read GOP by GOP with pread
        ]
        configs += [(f"ours_{float(v):g}ms", url, s3.storage_options(), float(v)) for v in args.latencies.split(",")]
        # Repeats interleave the configurations, so a change of machine load touches all of them alike.
        speeds: dict[str, list[float]] = {name: [] for name, *_ in configs}
        waits: dict[str, list[float]] = {name: [] for name, *_ in configs}
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name, *_ in configs}
        traffic: dict[str, dict[str, int]] = {}
        for _ in range(args.repeats):
            for name, index_file, options, latency in configs:
                s3.reset()
                s3.faults(latency_ms=latency)
                rows[name].append(_stream(index_file, args, storage=options, step_ms=0.0))
                speeds[name].append(rows[name][-1]["frames_per_sec"])
                traffic[name] = _traffic(s3)  # one epoch's requests
                waits[name].append(
                    _stream(index_file, args, storage=options, step_ms=args.step_ms)["data_wait_fraction"]
                )
            s3.reset()
        for name, _, options, _ in configs:
            stream[name] = {
                "frames_per_sec": _median(speeds[name]),
                "data_wait_fraction": _median(waits[name]),
                "stamp_errors": sum(r["stamp_errors"] for r in rows[name]),
                "prefetch_peak_bytes": max(r["prefetch_peak_bytes"] for r in rows[name]),
            }
            if options:  # remote: the requests of one epoch
                t = traffic[name]
                stream[name].update(
                    gets=t["gets"],
                    heads=t["heads"],
                    gets_per_file=t["gets"] / files,
                    gets_per_gop=t["gets"] / gops,
                    mib_per_get=t["bytes"] / max(t["gets"], 1) / 2**20,
                    bytes_over_needed=t["bytes"] / needed_stream,
                )
        local_speed = stream["local"]["frames_per_sec"]["median"]
        for name, row in stream.items():
            if name != "local" and isinstance(row["frames_per_sec"], dict):
                row["speed_over_local"] = row["frames_per_sec"]["median"] / local_speed
        report["streaming"] = stream
        report["faults"] = _faults(s3, url, local, args)
        report["cache"] = _cache(s3, args, args.data)
    finally:
        s3.stop()
    args.out.write_text(json.dumps(report, indent=2, default=str))
    _print(report)


def _print(report: dict[str, Any]) -> None:
    print(f"\nload average {report['machine']['load']}, {report['files']} files, {report['gops']} camera-GOPs")
    ra = report["random_access"]
    print(f"\nrandom access: {ra['reads']} reads of one frame (one GOP) each; bytes needed {ra['bytes_needed']}")
    print(f"{'config':24} {'GETs/read':>10} {'HEADs/read':>11} {'read/needed':>12} {'s':>8}")
    for name, row in ra.items():
        if isinstance(row, dict):
            print(
                f"{name:24} {row['gets_per_read']:10.2f} {row['heads_per_read']:11.2f} {row['bytes_over_needed']:12.3f} {row['seconds']:8.2f}"
            )
    print("\nstreaming (one epoch; camera-frames/s of the loader alone, data wait with a simulated step)")
    print(
        f"{'config':24} {'frames/s':>10} {'spread':>7} {'x local':>8} {'wait':>6} {'GETs/file':>10} {'MiB/GET':>8} {'read/needed':>12} {'prefetch MB':>12}"
    )
    for name, row in report["streaming"].items():
        if "frames_per_sec" in row and isinstance(row["frames_per_sec"], dict):
            speed = row["frames_per_sec"]
            print(
                f"{name:24} {speed['median']:10.1f} {speed['spread']:7.2f} {row.get('speed_over_local', 1.0):8.2f} "
                f"{row['data_wait_fraction']['median']:6.2f} {row.get('gets_per_file', float('nan')):10.2f} "
                f"{row.get('mib_per_get', float('nan')):8.2f} {row.get('bytes_over_needed', float('nan')):12.3f} "
                f"{row['prefetch_peak_bytes'] / 1e6:12.1f}"
            )
        else:
            print(
                f"{name:24} {row['frames_per_sec']:10.1f} {'':7} {'':8} {'':6} {row['gets_per_file']:10.2f} {'':8} {row['bytes_over_needed']:12.3f}"
            )
    f = report["faults"]
    print(
        f"\nfaults: injected {f['injected']}; retries {f['retries']}, checksum re-reads {f['checksum_refetches']} "
        f"(every event counted: {f['every_event_counted']}); wrong batches {f['wrong_batches']} of {f['batches']}, "
        f"wrong samples {f['wrong_samples']} of {f['random_reads']}; resume identical: {f['resume_identical']}"
    )
    c = report["cache"]
    print(
        f"cache at {c['cache_limit'] / c['data_bytes']:.0%} of the data: hit rate plan {c['plan']['hit_rate']:.3f}, "
        f"LRU {c['lru']['hit_rate']:.3f} ({c['plan_over_lru']:.2f}x)"
    )


if __name__ == "__main__":
    main()
