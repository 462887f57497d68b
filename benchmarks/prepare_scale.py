"""Index probing and encoding with 1 and 2 local processes and with Ray over 2 CPUs; JSON on stdout.

Run: ``python benchmarks/prepare_scale.py [--clips 24 --size 640x480 --frames 60 --data DIR]``. The
dataset is synthetic H.264 (two cameras a clip), written once into ``--data`` when given. The
driver's overhead per task is measured apart from Ray's start: a no-op mapped over many items,
one item per task, on a runtime that is already up.

Encoding (a second synthetic set of ``--encode-clips`` clips of the same size, to ``--codec``) is timed ``--repeats`` times per way,
median and spread: the baseline is a plain loop over the files in this process (``encode_file``,
no executor, no index), measured before and after the others because a shared machine's load
drifts; then ``encode_index`` with ``jobs=1`` (in this process), ``jobs=2`` (two processes, one
encoder thread each) and on Ray over 2 CPUs (one encoder thread a task). Those three include
writing the index at the end. Ray's start is timed apart.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from lightning_vstream.demos.synth import write_dataset
from lightning_vstream.encode import EncodeSettings, encode_index
from lightning_vstream.encode.writer import encode_file, plan_file
from lightning_vstream.executors import map_ordered, start_local_ray
from lightning_vstream.indexing import build_index, load_index


def _noop(x: int) -> int:
    return x


def _timed(fn: object, *args: object, **kwargs: object) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)  # type: ignore[operator]
    return time.perf_counter() - start


def _spread(values: list[float]) -> dict[str, float]:
    return {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values)}


def _encode_loop(src_index: Path, out: Path, settings: EncodeSettings) -> None:
    """The baseline: every camera file encoded in turn in this process (no executor, no index)."""
    from lightning_vstream.encode.settings import CameraSource

    for clip in load_index(src_index):
        for cam in clip.cameras:
            source = CameraSource(clip.clip_id, cam.name, Path(cam.path))
            encode_file(plan_file(source, out / clip.clip_id / f"{cam.name}.mp4"), settings)


def _encode_runs(src_index: Path, tmp: Path, *, codec: str, repeats: int) -> dict[str, Any]:
    """Seconds of each way of encoding, ``repeats`` times each (a fresh output folder every time)."""
    settings = EncodeSettings(codec=codec)  # type: ignore[arg-type]
    times: dict[str, list[float]] = {}
    frames = files = 0
    _encode_loop(src_index, tmp / "warm-up", settings)  # imports, encoder libraries and page cache warm
    ways = [
        ("loop-1", "loop", 1),
        ("encode-j1", "local", 1),
        ("encode-j2", "local", 2),
        ("encode-ray-2cpu", "ray", 1),
        ("loop-1b", "loop", 1),  # the baseline again: the shared machine's load drifts
    ]
    for name, executor, jobs in ways:
        for r in range(repeats):
            out = tmp / f"{name}-{r}"
            start = time.perf_counter()
            if executor == "loop":
                _encode_loop(src_index, out, settings)
            else:
                summary = encode_index(src_index, out, codec=codec, jobs=jobs, executor=executor, progress=False)  # type: ignore[arg-type]
                frames, files = summary.frames_encoded, summary.files_encoded
            times.setdefault(name, []).append(time.perf_counter() - start)
    base = min(statistics.median(times["loop-1"]), statistics.median(times["loop-1b"]))
    return {
        "codec": codec,
        "files": files,
        "frames": frames,
        "repeats": repeats,
        "seconds": {name: _spread(values) for name, values in times.items()},
        "frames_per_second": {name: frames / statistics.median(values) for name, values in times.items()},
        "speedup_vs_loop": {
            name: base / statistics.median(times[name]) for name in ("encode-j1", "encode-j2", "encode-ray-2cpu")
        },
        "encoder_threads": {"loop-1": "encoder's choice", "encode-j1": "encoder's choice", "encode-j2": 1, "ray": 1},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clips", type=int, default=24)
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--size", default="640x480")
    parser.add_argument("--data", type=Path, default=None, help="dataset folder, written once and reused")
    parser.add_argument("--tasks", type=int, default=400, help="no-op tasks for the overhead measure")
    parser.add_argument("--encode-clips", type=int, default=8, help="clips encoded (0: no encoding measure)")
    parser.add_argument("--codec", default="hevc", choices=("hevc", "h264"), help="codec of the encoding measure")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each way of encoding")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        root = args.data or Path(tmp) / "data"
        if not (root / "videos").exists():
            write_dataset(root, clips=args.clips, cameras=2, frames=args.frames, size=(width, height), gop=6)
        files = args.clips * 2
        seconds: dict[str, float] = {}
        runs = [
            ("local-1", "local", 1),
            ("local-2", "local", 2),
            ("local-1b", "local", 1),  # the baseline again: the shared machine's load drifts
            ("ray-2cpu", "ray", 1),
        ]
        for name, executor, workers in runs:
            if executor == "ray":
                seconds["ray-start"] = _timed(start_local_ray, num_cpus=2)
            out = Path(tmp) / name / "index.json"
            seconds[name] = _timed(
                build_index, root, output=out, video_dirs=["videos"], progress=False, executor=executor, workers=workers
            )
        items = list(range(args.tasks))
        overhead = {
            "ray_per_task_s": _timed(map_ordered, _noop, items, executor="ray") / args.tasks,
            "local2_per_task_s": _timed(map_ordered, _noop, items, executor="local", workers=2) / args.tasks,
        }
        encoding = None
        if args.encode_clips:
            src_index = write_dataset(
                Path(tmp) / "encode-src",
                clips=args.encode_clips,
                cameras=2,
                frames=args.frames,
                size=(width, height),
                gop=6,
            )
            encoding = _encode_runs(src_index, Path(tmp) / "encoded", codec=args.codec, repeats=args.repeats)
        import ray

        ray.shutdown()
        base = min(seconds["local-1"], seconds["local-1b"])
        print(
            json.dumps(
                {
                    "files": files,
                    "frames_per_file": args.frames,
                    "size": args.size,
                    "seconds": seconds,
                    "speedup_local2": base / seconds["local-2"],
                    "speedup_ray": base / seconds["ray-2cpu"],
                    "probe_per_file_s_local1": base / files,
                    "driver_overhead": overhead,
                    "encoding": encoding,
                    "load_avg_1min": os.getloadavg()[0],
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
