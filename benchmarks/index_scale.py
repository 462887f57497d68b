"""Index scale benchmark: frame tables for 100k clips x 6 cameras x 240 frames, binary versus JSON.

Synthetic tables are generated directly (no videos): every file has 240 frames, a keyframe every
``--gop`` frames, packet CRCs and a file identity, as ``vstream index`` records them. Each
measurement runs in a fresh process (so one run's pages and imports do not flatter the next):

- ``open``: :class:`~lightning_vstream.index.FrameTables` on ``index.tables.bin`` (memory-mapped).
- ``rows``: the binary search of every file key, as ``load_index`` does for the whole index.
- ``records``: the :class:`Clip` / :class:`CameraStream` records of the whole index pointing at
  their rows (what a rank holds; no folder is scanned here, the videos do not exist).
- ``first lookup``: building the first file's :class:`VideoInfo` (what a decoder needs on open).
- the private (anonymous) memory and RSS of the rank after all of that, and the extra private
  memory of each of two spawn DataLoader-style workers that receive the pickled index and build
  1,000 random files' frame tables, against a spawn worker that received nothing. RSS also counts
  pages of the mapped table file, which the page cache shares between all processes.

Baseline, measured in the same run: the JSON sidecar ``index.meta.json`` for ``--json-files``
files (parsed with ``json.loads`` and turned into :class:`VideoInfo` objects, as ``load_index``
does with it), extrapolated linearly to the full size. The binary file is also measured at that
same small size, so the ratio compares like with like.

Usage::

    python benchmarks/index_scale.py                        # 100k clips x 6 cameras
    python benchmarks/index_scale.py --clips 10000          # a scaled run
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pickle
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

FRAMES = 240
CAMERAS = ("CAM_BACK", "CAM_BACK_LEFT", "CAM_BACK_RIGHT", "CAM_FRONT", "CAM_FRONT_LEFT", "CAM_FRONT_RIGHT")


def _keys(clips: int) -> list[str]:
    return sorted(f"videos/scene-{c:06d}/{cam}.mp4" for c in range(clips) for cam in CAMERAS)


def _write_binary(path: Path, clips: int, gop: int) -> float:
    """Generate the tables as arrays and write them; returns seconds."""
    from lightning_vstream.index.table_file import write_table_arrays

    start = time.perf_counter()
    keys = [k.encode() for k in _keys(clips)]
    n = len(keys)
    rng = np.random.default_rng(0)
    per_frame = np.arange(FRAMES, dtype=np.int64) * 3000  # 30 fps in a 90 kHz time base
    key_frames = np.arange(0, FRAMES, gop, dtype=np.int64)
    arrays = {
        "codec": np.zeros(n, np.int32),
        "width": np.full(n, 1600),
        "height": np.full(n, 900),
        "tb_num": np.ones(n, np.int64),
        "tb_den": np.full(n, 90000),
        "fps": np.full(n, 30.0),
        "has_crc": np.ones(n, np.uint8),
        "config_crc32": rng.integers(0, 2**32, n),
        "size": rng.integers(10**6, 10**7, n),
        "mtime_ns": np.full(n, 1_700_000_000 * 10**9),
        "head_crc32": rng.integers(0, 2**32, n),
        "tail_crc32": rng.integers(0, 2**32, n),
        "pts": np.tile(per_frame, n),
        "crc32": rng.integers(0, 2**32, n * FRAMES, dtype=np.uint32),
        "key_indices": np.tile(key_frames, n),
        "key_seek": np.tile(key_frames * 3000, n),
        "frame_offsets": np.arange(n + 1, dtype=np.int64) * FRAMES,
        "key_offsets": np.arange(n + 1, dtype=np.int64) * len(key_frames),
    }
    write_table_arrays(path, keys, ["h264"], arrays)
    del arrays
    return time.perf_counter() - start


def _write_json(path: Path, clips: int, gop: int) -> float:
    start = time.perf_counter()
    rng = random.Random(0)
    files = {}
    for key in _keys(clips):
        files[key] = {
            "size": 5_000_000,
            "identity": {"size": 5_000_000, "mtime_ns": 1_700_000_000 * 10**9, "head_crc32": 1, "tail_crc32": 2},
            "info": {
                "version": 1,
                "codec": "h264",
                "width": 1600,
                "height": 900,
                "time_base": [1, 90000],
                "average_fps": 30.0,
                "pts": [i * 3000 for i in range(FRAMES)],
                "key_indices": list(range(0, FRAMES, gop)),
                "key_seek": [i * 3000 for i in range(0, FRAMES, gop)],
                "crc32": [rng.getrandbits(32) for _ in range(FRAMES)],
                "config_crc32": 7,
            },
        }
    path.write_text(
        json.dumps({"format": "lightning_vstream.meta", "version": 1, "files": files}, separators=(",", ":"))
    )
    return time.perf_counter() - start


def _memory() -> tuple[float, float]:
    """(RSS, anonymous RSS) of this process in MB.

    Anonymous memory is what the process owns (Python objects, arrays it built). RSS also counts
    pages of the memory-mapped table file, which live in the page cache and are shared by every
    process that maps the file (the kernel maps up to 64 KiB around each page touched).
    """
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon"):
                fields[name] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["RssAnon"]


def _records(tables: Any, clips: int) -> Any:
    """The index records of ``clips`` clips pointing at their rows, built as load_index builds them.

    The same string handling and one vectorised key search as ``load_index`` with binary tables;
    only the folder scan (``os.scandir`` of every clip folder) is left out: the videos do not exist.
    """
    from lightning_vstream.index.records import CameraStream, Clip, VideoIndex

    video_dir = Path("/data/videos")
    video_dir_str, prefix = str(video_dir), "videos/"
    pending = []
    for c in range(clips):
        clip_id = f"scene-{c:06d}"
        folder = f"{video_dir_str}{os.sep}{clip_id}"
        files = [f"{cam}.mp4" for cam in CAMERAS]
        pending.append((clip_id, [f"{folder}{os.sep}{f}" for f in files], [f"{prefix}{clip_id}/{f}" for f in files]))
    rows = tables.rows([k for *_, keys in pending for k in keys]).tolist()
    assert min(rows) >= 0
    out = []
    at = 0
    for clip_id, paths, _ in pending:
        mine = rows[at : at + len(CAMERAS)]
        streams = tuple(CameraStream(n, p, tables=tables, row=r) for n, p, r in zip(CAMERAS, paths, mine))
        at += len(CAMERAS)
        out.append(Clip(clip_id, video_dir, FRAMES, streams))
    return VideoIndex(Path("/data/index.json"), tuple(out), CAMERAS)


def _worker(payload: bytes | None, lookups: int, queue: Any) -> None:
    import lightning_vstream.index  # noqa: F401 - the imports every worker pays

    before = _memory()
    start = time.perf_counter()
    if payload is not None:
        index = pickle.loads(payload)
        rng = random.Random(1)
        for _ in range(lookups):
            clip = index.clips[rng.randrange(len(index.clips))]
            info = clip.cameras[rng.randrange(len(CAMERAS))].info
            assert info is not None and info.frame_count == FRAMES
    queue.put((before, _memory(), time.perf_counter() - start))


def _measure_binary(path: str, clips: int, workers: int, repeats: int, queue: Any) -> None:
    from lightning_vstream.index.table_file import FrameTables

    base_rss, base_uss = _memory()
    timings: list[dict[str, float]] = []
    memory: dict[str, float] = {}
    index: Any = None
    for repeat in range(repeats):
        index = None
        t0 = time.perf_counter()
        tables = FrameTables(path)
        t_open = time.perf_counter() - t0
        t0 = time.perf_counter()
        first = tables.info(tables.row(f"videos/scene-{clips // 2:06d}/CAM_FRONT.mp4"))
        t_first = time.perf_counter() - t0
        assert first.frame_count == FRAMES and first.crc32 is not None
        rss, uss = _memory()
        if repeat == 0:
            memory.update(tables_rss_mb=rss - base_rss, tables_anon_mb=uss - base_uss)
        t0 = time.perf_counter()
        index = _records(tables, clips)
        t_records = time.perf_counter() - t0
        rng = random.Random(0)
        t0 = time.perf_counter()
        for _ in range(1000):
            info = index.clips[rng.randrange(len(index.clips))].cameras[rng.randrange(6)].info
            assert info is not None
        t_lookup = (time.perf_counter() - t0) / 1000
        if repeat == 0:
            rss, uss = _memory()
            memory.update(rank_rss_mb=rss - base_rss, rank_anon_mb=uss - base_uss)
        timings.append({"open_s": t_open, "first_lookup_s": t_first, "records_s": t_records, "lookup_s": t_lookup})
    tables_payload = pickle.dumps(FrameTables(path), protocol=pickle.HIGHEST_PROTOCOL)
    payload = pickle.dumps(index, protocol=pickle.HIGHEST_PROTOCOL)
    result: dict[str, Any] = {
        **memory,
        "timings": timings,
        "pickled_tables_bytes": len(tables_payload),
        "pickled_index_mb": len(payload) / 2**20,
    }
    if workers:
        ctx = mp.get_context("spawn")
        wq = ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(sent, 1000, wq)) for sent in [None] + [payload] * workers]
        for p in procs:  # one at a time: each worker's figures are its own
            p.start()
            got = wq.get()
            p.join()
            result.setdefault("workers", []).append(got)
        idle = result["workers"][0][1]
        busy = [after for _, after, _ in result["workers"][1:]]
        result.update(
            worker_extra_rss_mb=[b[0] - idle[0] for b in busy],
            worker_extra_anon_mb=[b[1] - idle[1] for b in busy],
            worker_unpickle_and_lookups_s=[s for _, _, s in result["workers"][1:]],
        )
    queue.put(result)


def _measure_json(path: str, queue: Any) -> None:
    from lightning_vstream.index.tables import cached_info, load_metadata

    base_rss, base_anon = _memory()
    t0 = time.perf_counter()
    meta = load_metadata(Path(path).with_name("index.json"))
    infos = [cached_info(meta, key) for key in meta]
    elapsed = time.perf_counter() - t0
    assert all(i is not None for i in infos)
    rss, anon = _memory()
    del meta
    payload = pickle.dumps(infos, protocol=pickle.HIGHEST_PROTOCOL)
    queue.put(
        {
            "load_s": elapsed,
            "rss_mb": rss - base_rss,
            "anon_mb": anon - base_anon,
            "pickled_tables_mb": len(payload) / 2**20,
        }
    )


def _in_fresh_process(target: Any, *args: Any) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clips", type=int, default=100_000)
    parser.add_argument("--json-files-clips", type=int, default=1_000, help="clips in the JSON baseline (x6 files)")
    parser.add_argument("--gop", type=int, default=12)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the binary measurement (median)")
    parser.add_argument("--out", type=Path, default=Path("index_scale.json"))
    args = parser.parse_args()

    results: dict[str, Any] = {
        "clips": args.clips,
        "cameras": len(CAMERAS),
        "frames": FRAMES,
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    with tempfile.TemporaryDirectory(prefix="index_scale_") as tmp:
        tmpdir = Path(tmp)
        small = args.json_files_clips
        json_path = tmpdir / "small" / "index.meta.json"
        json_path.parent.mkdir()
        results["json_write_s"] = _write_json(json_path, small, args.gop)
        results["json_bytes"] = json_path.stat().st_size
        results["json"] = _in_fresh_process(_measure_json, str(json_path))
        small_bin = tmpdir / "small" / "index.tables.bin"
        _write_binary(small_bin, small, args.gop)
        results["binary_small"] = _in_fresh_process(_measure_binary, str(small_bin), small, 0, args.repeats)
        big = tmpdir / "big" / "index.tables.bin"
        big.parent.mkdir()
        results["binary_write_s"] = _write_binary(big, args.clips, args.gop)
        results["binary_bytes"] = big.stat().st_size
        results["binary"] = _in_fresh_process(_measure_binary, str(big), args.clips, args.workers, args.repeats)
    scale = args.clips / small
    js, bs, bb = results["json"], results["binary_small"], results["binary"]

    def med(run: dict[str, Any], key: str) -> float:
        return statistics.median(t[key] for t in run["timings"])

    def spread(run: dict[str, Any], key: str, unit: float = 1.0, fmt: str = ".2f") -> str:
        values = [t[key] * unit for t in run["timings"]]
        return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"

    files = args.clips * len(CAMERAS)
    rows = [
        ("files", f"{small * 6:,}", f"{small * 6:,}", f"{files:,}", f"{files:,} (x{scale:g})"),
        (
            "table file",
            f"{results['json_bytes'] / 2**20:.0f} MB",
            "-",
            f"{results['binary_bytes'] / 2**20:,.0f} MB",
            f"{results['json_bytes'] * scale / 2**30:.1f} GB",
        ),
        (
            "load tables to first lookup, s",
            f"{js['load_s']:.2f}",
            spread(bs, "open_s", 1, ".4f"),
            f"{med(bb, 'open_s') + med(bb, 'first_lookup_s'):.4f}",
            f"{js['load_s'] * scale:.0f}",
        ),
        (
            "memory for tables: private (RSS), MB",
            f"{js['anon_mb']:.0f} ({js['rss_mb']:.0f})",
            f"{bs['tables_anon_mb']:.1f} ({bs['tables_rss_mb']:.1f})",
            f"{bb['tables_anon_mb']:.1f} ({bb['tables_rss_mb']:.1f})",
            f"{js['anon_mb'] * scale:,.0f}",
        ),
        (
            "index records (Clip, CameraStream), s",
            "(not built)",
            spread(bs, "records_s", 1, ".3f"),
            spread(bb, "records_s"),
            "-",
        ),
        (
            "rank after records + 1000 lookups: private (RSS), MB",
            "-",
            f"{bs['rank_anon_mb']:.0f} ({bs['rank_rss_mb']:.0f})",
            f"{bb['rank_anon_mb']:.0f} ({bb['rank_rss_mb']:.0f})",
            "-",
        ),
        (
            "VideoInfo lookup (random file), us",
            "-",
            f"{med(bs, 'lookup_s') * 1e6:.0f}",
            f"{med(bb, 'lookup_s') * 1e6:.0f}",
            "-",
        ),
        (
            "pickled tables per spawn worker",
            f"{js['pickled_tables_mb']:.0f} MB",
            f"{bs['pickled_tables_bytes']} B",
            f"{bb['pickled_tables_bytes']} B",
            f"{js['pickled_tables_mb'] * scale / 1024:.1f} GB",
        ),
        (
            "pickled index records per worker, MB",
            "-",
            f"{bs['pickled_index_mb']:.1f}",
            f"{bb['pickled_index_mb']:.0f}",
            "-",
        ),
        (
            "extra private memory per spawn worker, MB",
            "-",
            "-",
            ", ".join(f"{v:.0f}" for v in bb.get("worker_extra_anon_mb", [])),
            "-",
        ),
        (
            "  its unpickling + 1000 lookups, s",
            "-",
            "-",
            ", ".join(f"{v:.1f}" for v in bb.get("worker_unpickle_and_lookups_s", [])),
            "-",
        ),
    ]
    header = ("", "JSON (baseline)", "binary, same size", "binary, full size", "JSON extrapolated")
    widths = [max(len(str(r[i])) for r in (*rows, header)) for i in range(5)]
    print(
        f"frame tables: {args.clips:,} clips x {len(CAMERAS)} cameras x {FRAMES} frames; GOP {args.gop}; "
        f"each size in a fresh process, median of {args.repeats} [min-max]; {os.cpu_count()} CPUs"
    )
    for r in (header, *rows):
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    load = med(bb, "open_s") + med(bb, "first_lookup_s")
    ratio = js["load_s"] * scale / load
    print(
        f"tables: binary loads {ratio:,.0f}x faster than JSON would at full size and holds "
        f"{js['anon_mb'] * scale / max(bb['tables_anon_mb'], 0.1):,.0f}x less private memory"
    )
    results["summary"] = {
        "binary_load_s": load,
        "json_extrapolated_load_s": js["load_s"] * scale,
        "json_extrapolated_anon_mb": js["anon_mb"] * scale,
        "load_ratio": ratio,
    }
    args.out.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
