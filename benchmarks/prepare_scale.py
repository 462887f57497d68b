"""Index probing with 1 and 2 local processes and with Ray over 2 CPUs; JSON on stdout.

Run: ``python benchmarks/prepare_scale.py [--clips 24 --size 640x480 --frames 60 --data DIR]``. The
dataset is synthetic H.264 (two cameras a clip), written once into ``--data`` when given. The
driver's overhead per task is measured apart from Ray's start: a no-op mapped over many items,
one item per task, on a runtime that is already up. Encoding on Ray is not measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from lightning_vstream.demos.synth import write_dataset
from lightning_vstream.executors import map_ordered, start_local_ray
from lightning_vstream.indexing import build_index


def _noop(x: int) -> int:
    return x


def _timed(fn: object, *args: object, **kwargs: object) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clips", type=int, default=24)
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--size", default="640x480")
    parser.add_argument("--data", type=Path, default=None, help="dataset folder, written once and reused")
    parser.add_argument("--tasks", type=int, default=400, help="no-op tasks for the overhead measure")
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
                    "load_avg_1min": os.getloadavg()[0],
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
