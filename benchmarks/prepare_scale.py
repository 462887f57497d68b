"""Index probing with 1 and 2 local processes and with Ray over 2 CPUs; JSON on stdout.

Run: ``python benchmarks/prepare_scale.py [--clips 24]``. The dataset is synthetic (64x48 H.264).
Encoding on Ray is not measured: ``vstream encode`` has no Ray executor yet.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from lightning_vstream.demos.synth import write_dataset
from lightning_vstream.executors import start_local_ray
from lightning_vstream.indexing import build_index


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clips", type=int, default=24)
    parser.add_argument("--frames", type=int, default=120)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        write_dataset(root, clips=args.clips, cameras=2, frames=args.frames, size=(64, 48), gop=6)
        files = args.clips * 2
        results: dict[str, float] = {}
        runs = [("local-1", "local", 1), ("local-2", "local", 2), ("ray-2cpu", "ray", 1)]
        for name, executor, workers in runs:
            if executor == "ray":
                start_local_ray(num_cpus=2)
            out = Path(tmp) / name / "index.json"
            start = time.perf_counter()
            build_index(root, output=out, video_dirs=["videos"], progress=False, executor=executor, workers=workers)
            results[name] = time.perf_counter() - start
        load = os.getloadavg()
        print(
            json.dumps(
                {
                    "files": files,
                    "frames_per_file": args.frames,
                    "seconds": results,
                    "speedup_local2": results["local-1"] / results["local-2"],
                    "speedup_ray": results["local-1"] / results["ray-2cpu"],
                    "per_file_s_local1": results["local-1"] / files,
                    "load_avg_1min": load[0],
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
