"""What annotations and geometry augmentation cost the streaming loader.

One run, same files, same loader settings (``StreamVideoDataModule``, decoding in the training
process so that CPU time is measurable, batch 4 slots x 6 cameras, one FFmpeg thread, one torch
thread), four configurations:

- frames: frames only (the baseline);
- + annotations: per-clip ``.npz`` annotation files (calibration, ego pose, boxes, tokens)
  looked up in the workers and batched next to the frames;
- + augment: also ``GeometryAugment`` (random scale, crop, flip) on every frame in the workers;
- + augment, rotation: also a random rotation (a ``grid_sample`` warp per frame).

Each configuration streams one epoch ``--repeats`` times, interleaved; the table shows the
median CPU milliseconds per delivered camera-frame (the cost, robust on a shared machine), its
ratio to the baseline, and the median wall-clock camera-frames/sec. Figures depend on the machine
and the frame size (the defaults are sized for a small shared one).

Usage::

    python benchmarks/annotations_overhead.py            # about a minute on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from lightning_vstream import DecodeOptions, EngineOptions
from lightning_vstream.annotations import GeometryAugment
from lightning_vstream.demos.synth import write_dataset
from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule


def _ensure_data(data_dir: Path, clips: int, frames: int, size: tuple[int, int]) -> Path:
    root = data_dir / f"h264_{size[0]}x{size[1]}_c{clips}_f{frames}_ann"
    index = root / "index.json"
    if not index.exists():
        print(f"generating {clips} clips x 6 cameras x {frames} frames of {size[0]}x{size[1]} H.264 ...")
        write_dataset(
            root, clips=clips, cameras=6, frames=frames, size=size, gop=12, jobs=os.cpu_count() or 1, annotations=True
        )
    return index


def _epoch(index: Path, **options: Any) -> tuple[float, float, int]:
    """(camera-frames/sec, CPU ms per camera-frame, camera-frames) of one epoch after its first batch."""
    dm = StreamVideoDataModule(
        index_file=index,
        batch_size=4,
        engine=EngineOptions(num_workers=0),
        decode=DecodeOptions(decoder_threads=1),
        seed=0,
        **options,
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    frames = 0
    start = cpu = 0.0
    for step, batch in enumerate(loader):
        if step == 0:  # file opening and the first batch are not throughput
            start, cpu = time.perf_counter(), time.process_time()
            continue
        images = batch["frames"]
        frames += images.shape[0] * images.shape[1]
    wall, used = time.perf_counter() - start, time.process_time() - cpu
    dm.teardown()
    return frames / wall, used / frames * 1e3, frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path(".vstream_cache/bench"))
    parser.add_argument("--clips", type=int, default=4)
    parser.add_argument("--frames", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/annotations_overhead.json"))
    args = parser.parse_args()
    size = (320, 180)
    index = _ensure_data(args.data_dir, args.clips, args.frames, size)
    annotations = index.parent / "annotations"
    augment = GeometryAugment(output_size=(160, 288), scale=(0.9, 1.1), flip=0.5)
    rotate = GeometryAugment(output_size=(160, 288), scale=(0.9, 1.1), flip=0.5, rotate=(-5.0, 5.0))
    configs: dict[str, dict[str, Any]] = {
        "frames": {},
        "+ annotations": {"annotations": annotations},
        "+ augment": {"annotations": annotations, "augment": augment},
        "+ augment, rotation": {"annotations": annotations, "augment": rotate},
    }
    torch.set_num_threads(1)
    _epoch(index)  # warm-up: page cache, imports
    runs: dict[str, list[tuple[float, float, int]]] = {name: [] for name in configs}
    for _ in range(args.repeats):
        for name, options in configs.items():
            runs[name].append(_epoch(index, **options))
    rows = {}
    for name, results in runs.items():
        cpu = [r[1] for r in results]
        rows[name] = {
            "cpu_ms_per_frame": statistics.median(cpu),
            "cpu_min": min(cpu),
            "cpu_max": max(cpu),
            "frames_per_sec": statistics.median(r[0] for r in results),
            "frames": results[0][2],
        }
    base = rows["frames"]["cpu_ms_per_frame"]
    print(
        f"\n{size[0]}x{size[1]} H.264, {args.clips} clips x 6 cameras x {args.frames} frames, batch 4, in-process; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    )
    print(f"{'configuration':<22}{'CPU ms/frame':>13}{'spread':>14}{'x baseline':>12}{'frames/s':>10}")
    for name, row in rows.items():
        print(
            f"{name:<22}{row['cpu_ms_per_frame']:>13.2f}{row['cpu_min']:>7.2f}-{row['cpu_max']:<6.2f}"
            f"{row['cpu_ms_per_frame'] / base:>12.2f}{row['frames_per_sec']:>10.0f}"
        )
    result = {
        "size": list(size),
        "clips": args.clips,
        "frames": args.frames,
        "repeats": args.repeats,
        "cpu_count": os.cpu_count(),
        "rows": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
