"""Index scale benchmark: 100k clips x 6 cameras x 240 frames: frame tables, then the index records.

Synthetic tables are generated directly (no videos): every file has 240 frames, a keyframe every
``--gop`` frames, packet CRCs and a file identity, as ``vstream index`` records them. Each
measurement runs in a fresh process (so one run's pages and imports do not flatter the next).

Frame tables, binary versus JSON:

- ``open``: :class:`~lightning_vstream.index.FrameTables` on ``index.tables.bin`` (memory-mapped).
- ``first lookup``: building the first file's :class:`VideoInfo` (what a decoder needs on open).
- Baseline, measured in the same run: the JSON sidecar ``index.meta.json`` for ``--json-files``
  files (parsed with ``json.loads`` and turned into :class:`VideoInfo` objects, as ``load_index``
  does with it), extrapolated linearly to the full size. The binary file is also measured at that
  same small size, so the ratio compares like with like.

Index records, records versus arrays (the goals: setup under 2 s, under 1 MB pickled per worker,
under 50 MB extra private memory per spawn worker):

- ``records`` (before): one :class:`Clip` / :class:`CameraStream` per clip and file pointing at
  its table row, built as ``load_index`` built them (the same string handling and one vectorised
  key search), held in a :class:`VideoIndex` as a tuple. ``load_index`` also listed every clip
  folder (``os.scandir``); that listing is timed separately over the generated clip folders.
- ``arrays`` (after): ``load_index`` itself on an ``index.json`` over the generated tables and a
  tree of clip folders (created here, empty but for the first clip's camera files: with frame
  tables the quick check lists the video folder once and takes every clip's camera files from
  the tables, see docs/index_format.md), returning
  :class:`~lightning_vstream.index.arrays.ClipArrays`.
- For each: setup time, the rank's private (anonymous) memory and RSS after setup and 1000
  random ``clips[i].cameras[j].info`` lookups, the ``index["clip_id"]`` lookup, the pickled size
  of the index, and the extra private memory of each of two spawn DataLoader-style workers that
  receive the pickled index and build 1,000 random files' frame tables, against a spawn worker
  that received nothing. RSS also counts pages of the mapped table file, which the page cache
  shares between all processes.

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
    from lightning_vstream.index.table_write import write_table_arrays

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


def _write_tree(root: Path, clips: int) -> float:
    """``index.json`` over the tables in ``root``, and the clip folders it lists; returns seconds.

    Every clip folder exists (the quick check lists the video folder); only the first clip's
    camera files are created (empty): with frame tables no other clip folder is read.
    """
    start = time.perf_counter()
    videos = root / "videos"
    videos.mkdir()
    ids = [f"scene-{c:06d}" for c in range(clips)]
    for clip_id in ids:
        os.mkdir(videos / clip_id)
    for cam in CAMERAS:
        (videos / ids[0] / f"{cam}.mp4").write_bytes(b"")
    (root / "index.json").write_text(json.dumps({"videos": {clip_id: FRAMES for clip_id in ids}}))
    return time.perf_counter() - start


def _rank_lookups(index: Any, count: int = 1000) -> float:
    """Seconds per ``clips[i].cameras[j].info`` of a random file."""
    rng = random.Random(0)
    t0 = time.perf_counter()
    for _ in range(count):
        info = index.clips[rng.randrange(len(index.clips))].cameras[rng.randrange(len(CAMERAS))].info
        assert info is not None
    return (time.perf_counter() - t0) / count


def _by_id(index: Any, clips: int, scan: bool) -> float:
    """Seconds per ``index["clip_id"]`` (``scan``: the linear scan it was before)."""
    rng = random.Random(2)
    wanted = [f"scene-{rng.randrange(clips):06d}" for _ in range(20 if scan else 1000)]
    t0 = time.perf_counter()
    for key in wanted:
        clip = next(c for c in index.clips if c.clip_id == key) if scan else index[key]
        assert clip.clip_id == key
    return (time.perf_counter() - t0) / len(wanted)


def _spawn_workers(payload: bytes, workers: int) -> dict[str, Any]:
    """Extra private memory and RSS of spawn workers given ``payload``, against one given nothing."""
    ctx = mp.get_context("spawn")
    wq = ctx.Queue()
    got = []
    for sent in [None] + [payload] * workers:  # one at a time: each worker's figures are its own
        proc = ctx.Process(target=_worker, args=(sent, 1000, wq))
        proc.start()
        got.append(wq.get())
        proc.join()
    idle = got[0][1]
    busy = [after for _, after, _ in got[1:]]
    return {
        "workers": got,
        "worker_extra_rss_mb": [b[0] - idle[0] for b in busy],
        "worker_extra_anon_mb": [b[1] - idle[1] for b in busy],
        "worker_unpickle_and_lookups_s": [t for _, _, t in got[1:]],
    }


def _measure_arrays(index_path: str, clips: int, workers: int, repeats: int, queue: Any) -> None:
    """``load_index`` of the generated tree: the index records as arrays."""
    import lightning_vstream.index  # noqa: F401 - imports are not setup
    from lightning_vstream.index.arrays import ClipArrays
    from lightning_vstream.indexing import load_index

    base_rss, base_anon = _memory()
    timings: list[dict[str, float]] = []
    memory: dict[str, float] = {}
    index: Any = None
    for repeat in range(repeats):
        index = None
        t0 = time.perf_counter()
        index = load_index(index_path)
        t_setup = time.perf_counter() - t0
        assert isinstance(index.clips, ClipArrays) and len(index) == clips
        t0 = time.perf_counter()
        first = index.clips[0].cameras[0].info
        t_first = time.perf_counter() - t0
        assert first is not None and first.frame_count == FRAMES
        if repeat == 0:
            rss, anon = _memory()
            memory.update(setup_rss_mb=rss - base_rss, setup_anon_mb=anon - base_anon)
        t_lookup = _rank_lookups(index)
        if repeat == 0:
            rss, anon = _memory()
            memory.update(rank_rss_mb=rss - base_rss, rank_anon_mb=anon - base_anon)
        timings.append(
            {
                "setup_s": t_setup,
                "first_lookup_s": t_first,
                "lookup_s": t_lookup,
                "by_id_s": _by_id(index, clips, False),
            }
        )
    payload = pickle.dumps(index, protocol=pickle.HIGHEST_PROTOCOL)
    # What the quick check did before with every index: list each clip folder.
    from lightning_vstream.index.files import scan_cameras

    videos = os.path.join(os.path.dirname(index_path), "videos")
    t0 = time.perf_counter()
    for c in range(clips):
        scan_cameras(f"{videos}{os.sep}scene-{c:06d}")
    result: dict[str, Any] = {
        **memory,
        "timings": timings,
        "pickled_index_bytes": len(payload),
        "folder_scan_s": time.perf_counter() - t0,
    }
    if workers:
        result.update(_spawn_workers(payload, workers))
    queue.put(result)


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
        if repeat == 0:
            rss, uss = _memory()
            memory.update(records_rss_mb=rss - base_rss, records_anon_mb=uss - base_uss)
        t_lookup = _rank_lookups(index)
        if repeat == 0:
            rss, uss = _memory()
            memory.update(rank_rss_mb=rss - base_rss, rank_anon_mb=uss - base_uss)
        timings.append(
            {
                "open_s": t_open,
                "first_lookup_s": t_first,
                "records_s": t_records,
                "lookup_s": t_lookup,
                "by_id_s": _by_id(index, clips, True),
            }
        )
    tables_payload = pickle.dumps(FrameTables(path), protocol=pickle.HIGHEST_PROTOCOL)
    payload = pickle.dumps(index, protocol=pickle.HIGHEST_PROTOCOL)
    result: dict[str, Any] = {
        **memory,
        "timings": timings,
        "pickled_tables_bytes": len(tables_payload),
        "pickled_index_mb": len(payload) / 2**20,
        "pickled_index_bytes": len(payload),
    }
    if workers:
        result.update(_spawn_workers(payload, workers))
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
        results["tree_write_s"] = _write_tree(big.parent, args.clips)
        results["binary"] = _in_fresh_process(_measure_binary, str(big), args.clips, args.workers, args.repeats)
        results["arrays"] = _in_fresh_process(
            _measure_arrays, str(big.parent / "index.json"), args.clips, args.workers, args.repeats
        )
    scale = args.clips / small
    js, bs, bb, ar = results["json"], results["binary_small"], results["binary"], results["arrays"]

    def med(run: dict[str, Any], key: str) -> float:
        return statistics.median(t[key] for t in run["timings"])

    def spread(run: dict[str, Any], key: str, unit: float = 1.0, fmt: str = ".2f") -> str:
        values = [t[key] * unit for t in run["timings"]]
        return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"

    def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
        widths = [max(len(str(r[i])) for r in (*rows, header)) for i in range(len(header))]
        for r in (header, *rows):
            print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))

    files = args.clips * len(CAMERAS)
    print(
        f"frame tables: {args.clips:,} clips x {len(CAMERAS)} cameras x {FRAMES} frames; GOP {args.gop}; "
        f"each size in a fresh process, median of {args.repeats} [min-max]; {os.cpu_count()} CPUs"
    )
    table(
        ("", "JSON (baseline)", "binary, same size", "binary, full size", "JSON extrapolated"),
        [
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
                "pickled tables per spawn worker",
                f"{js['pickled_tables_mb']:.0f} MB",
                f"{bs['pickled_tables_bytes']} B",
                f"{bb['pickled_tables_bytes']} B",
                f"{js['pickled_tables_mb'] * scale / 1024:.1f} GB",
            ),
        ],
    )
    load = med(bb, "open_s") + med(bb, "first_lookup_s")
    ratio = js["load_s"] * scale / load
    print(
        f"tables: binary loads {ratio:,.0f}x faster than JSON would at full size and holds "
        f"{js['anon_mb'] * scale / max(bb['tables_anon_mb'], 0.1):,.0f}x less private memory"
    )

    def size(n: float) -> str:
        return f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{n / 1024:.1f} KB"

    def listed(run: dict[str, Any], key: str, fmt: str) -> str:
        return ", ".join(f"{v:{fmt}}" for v in run.get(key, [])) or "-"

    print(
        f"\nindex records: {args.clips:,} clips x {len(CAMERAS)} cameras, in a fresh process, median of "
        f"{args.repeats} [min-max]; workers: spawn, each unpickles the index and reads 1000 random files' tables"
    )
    setup_goal, pickle_goal, worker_goal = 2.0, 2**20, 50.0
    after_setup = med(ar, "setup_s")
    worker_after = max(ar.get("worker_extra_anon_mb", [0.0]))
    table(
        ("", "records (before)", "arrays (after)", "goal", "met"),
        [
            (
                "setup: records, s (load_index for arrays)",
                spread(bb, "records_s"),
                spread(ar, "setup_s"),
                f"< {setup_goal:g} s",
                "yes" if after_setup < setup_goal else "NO",
            ),
            ("  + one scandir per clip folder (before), s", f"{ar['folder_scan_s']:.2f}", "(not done)", "", ""),
            (
                "pickled index per worker",
                size(bb["pickled_index_bytes"]),
                size(ar["pickled_index_bytes"]),
                f"< {size(pickle_goal)}",
                "yes" if ar["pickled_index_bytes"] < pickle_goal else "NO",
            ),
            (
                "extra private memory per spawn worker, MB",
                listed(bb, "worker_extra_anon_mb", ".0f"),
                listed(ar, "worker_extra_anon_mb", ".1f"),
                f"< {worker_goal:g}",
                "yes" if worker_after < worker_goal else "NO",
            ),
            (
                "  its unpickling + 1000 lookups, s",
                listed(bb, "worker_unpickle_and_lookups_s", ".2f"),
                listed(ar, "worker_unpickle_and_lookups_s", ".2f"),
                "",
                "",
            ),
            (
                "rank after setup: private (RSS), MB",
                f"{bb['records_anon_mb']:.0f} ({bb['records_rss_mb']:.0f})",
                f"{ar['setup_anon_mb']:.0f} ({ar['setup_rss_mb']:.0f})",
                "",
                "",
            ),
            (
                "  after 1000 lookups too",
                f"{bb['rank_anon_mb']:.0f} ({bb['rank_rss_mb']:.0f})",
                f"{ar['rank_anon_mb']:.0f} ({ar['rank_rss_mb']:.0f})",
                "",
                "",
            ),
            (
                "clips[i].cameras[j].info (random file), us",
                f"{med(bb, 'lookup_s') * 1e6:.0f}",
                f"{med(ar, 'lookup_s') * 1e6:.0f}",
                "",
                "",
            ),
            (
                'index["clip_id"], us',
                f"{med(bb, 'by_id_s') * 1e6:,.0f} (scan)",
                f"{med(ar, 'by_id_s') * 1e6:.1f}",
                "",
                "",
            ),
        ],
    )
    before_setup = med(bb, "records_s") + ar["folder_scan_s"]
    print(
        f"records: setup {before_setup / after_setup:.1f}x faster (records + folder scan {before_setup:.2f} s -> "
        f"{after_setup:.2f} s), {bb['pickled_index_bytes'] / ar['pickled_index_bytes']:,.0f}x less to pickle, "
        f"worker private memory {max(bb.get('worker_extra_anon_mb', [0.0])):.0f} -> {worker_after:.1f} MB"
    )
    results["summary"] = {
        "binary_load_s": load,
        "json_extrapolated_load_s": js["load_s"] * scale,
        "json_extrapolated_anon_mb": js["anon_mb"] * scale,
        "load_ratio": ratio,
        "records_setup_s": med(bb, "records_s"),
        "records_folder_scan_s": ar["folder_scan_s"],
        "arrays_setup_s": after_setup,
        "records_pickled_bytes": bb["pickled_index_bytes"],
        "arrays_pickled_bytes": ar["pickled_index_bytes"],
        "records_worker_extra_anon_mb": bb.get("worker_extra_anon_mb"),
        "arrays_worker_extra_anon_mb": ar.get("worker_extra_anon_mb"),
        "goals": {"setup_s": setup_goal, "pickled_bytes": pickle_goal, "worker_extra_anon_mb": worker_goal},
        "goals_met": {
            "setup": after_setup < setup_goal,
            "pickled": ar["pickled_index_bytes"] < pickle_goal,
            "worker_memory": worker_after < worker_goal,
        },
    }
    args.out.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
