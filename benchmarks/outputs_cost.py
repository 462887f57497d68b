"""What a second (and third) output of the same decoded frames costs the streaming loader.

One run, same files, same settings (``StreamVideoDataModule``, batch 4 slots x 6 cameras, one
FFmpeg thread per decoder), for two loaders: the worker loader decoding in the training process
(``engine.num_workers=0``, so CPU time is measurable) and the thread engine (``engine.kind="threads"``, 2
threads). Configurations:

- 1 output: the frames as decoded (the baseline);
- 2 outputs: + ``outputs={"small": FrameTransform(resize=half)}``;
- 3 outputs: + a half-size float32 normalized copy;
- 1 output, resized in the decoder: ``transform=FrameTransform(resize=half)`` alone, which the CPU
  decoder does while converting to RGB (swscale);
- 2 outputs, resized + as decoded: that transform plus ``outputs={"full": FrameTransform()}``;
  the identity output needs the file's size, so the decoder converts every frame at that size and
  once more at half size for the default output (``PyAVDecoder.get_sizes``).

Each configuration streams one epoch ``--repeats`` times, interleaved; the table shows the median
wall-clock camera-frames/sec (a camera-frame counts once whatever the number of outputs), its
ratio to the baseline of the same loader, the spread, the CPU milliseconds per camera-frame, and
the decode amplification (frames decoded per frame delivered; 1.00 means each frame was decoded
once for all its outputs).

Usage::

    python benchmarks/outputs_cost.py            # about two minutes on 2 cores
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

from lightning_vstream import DecodeOptions
from lightning_vstream.demos.synth import write_dataset
from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule
from lightning_vstream.transforms import FrameTransform

LOADERS: dict[str, dict[str, Any]] = {
    "workers, in-process": {"engine": "workers", "num_workers": 0},
    "engine, 2 threads": {"engine": "threads", "engine_threads": 2},
}


def _ensure_data(data_dir: Path, clips: int, frames: int, size: tuple[int, int]) -> Path:
    root = data_dir / f"h264_{size[0]}x{size[1]}_c{clips}_f{frames}"
    index = root / "index.json"
    if not index.exists():
        print(f"generating {clips} clips x 6 cameras x {frames} frames of {size[0]}x{size[1]} H.264 ...")
        write_dataset(root, clips=clips, cameras=6, frames=frames, size=size, gop=12, jobs=os.cpu_count() or 1)
    return index


def configurations(size: tuple[int, int]) -> dict[str, dict[str, Any]]:
    """The DataModule options of every configuration, for ``size`` (width, height) files."""
    half = (size[1] // 2, size[0] // 2)
    small = FrameTransform(resize=half)
    normalized = FrameTransform(resize=half, dtype="float32", mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    return {
        "1 output (as decoded)": {},
        "2 outputs (+ half size)": {"outputs": {"small": small}},
        "3 outputs (+ half float32)": {"outputs": {"small": small, "normalized": normalized}},
        "1 output, resized in decoder": {"transform": small},
        "2 outputs, resized + as decoded": {"transform": small, "outputs": {"full": FrameTransform()}},
    }


def _epoch(index: Path, **options: Any) -> dict[str, float]:
    """Camera-frames/sec, CPU ms per camera-frame and decode amplification of one epoch after its first batch."""
    dm = StreamVideoDataModule(
        index_file=index, batch_size=4, decode=DecodeOptions(decoder_threads=1), seed=0, **options
    )
    dm.setup("fit")
    frames = 0
    start = cpu = 0.0
    for step, batch in enumerate(dm.train_dataloader()):
        if step == 0:  # file opening and the first batch are not throughput
            start, cpu = time.perf_counter(), time.process_time()
            continue
        frames += int(batch["valid"].sum()) * len(batch["camera_names"])
    wall, used = time.perf_counter() - start, time.process_time() - cpu
    stats = dm.decode_stats()
    dm.teardown()
    return {"fps": frames / wall, "cpu_ms": used / frames * 1e3, "amplification": stats.amplification}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path(".vstream_cache/bench"))
    parser.add_argument("--clips", type=int, default=4)
    parser.add_argument("--frames", type=int, default=48)
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--height", type=int, default=180)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/outputs_cost.json"))
    args = parser.parse_args(argv)
    size = (args.width, args.height)
    index = _ensure_data(args.data_dir, args.clips, args.frames, size)
    configs = configurations(size)
    torch.set_num_threads(1)
    for options in LOADERS.values():
        _epoch(index, **options)  # warm-up: page cache, imports, thread pools
    runs: dict[tuple[str, str], list[dict[str, float]]] = {(lo, c): [] for lo in LOADERS for c in configs}
    for _ in range(args.repeats):
        for loader, loader_options in LOADERS.items():
            for name, options in configs.items():
                runs[loader, name].append(_epoch(index, **loader_options, **options))
    rows = []
    for (loader, name), results in runs.items():
        fps = [r["fps"] for r in results]
        rows.append(
            {
                "loader": loader,
                "configuration": name,
                "frames_per_sec": statistics.median(fps),
                "fps_min": min(fps),
                "fps_max": max(fps),
                "cpu_ms_per_frame": statistics.median(r["cpu_ms"] for r in results),
                "amplification": max(r["amplification"] for r in results),
            }
        )
    base = {r["loader"]: r["frames_per_sec"] for r in rows if r["configuration"] == next(iter(configs))}
    for row in rows:
        row["x_baseline"] = row["frames_per_sec"] / base[row["loader"]]
    print(
        f"\n{size[0]}x{size[1]} H.264, {args.clips} clips x 6 cameras x {args.frames} frames, batch 4, "
        f"median of {args.repeats}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'loader':<21}{'configuration':<33}{'frames/s':>9}{'spread':>15}{'x 1 output':>11}{'CPU ms/fr':>10}{'ampl.':>7}"
    )
    for row in rows:
        spread = f"{row['fps_min']:.0f}-{row['fps_max']:.0f}"
        print(
            f"{row['loader']:<21}{row['configuration']:<33}{row['frames_per_sec']:>9.0f}{spread:>15}"
            f"{row['x_baseline']:>11.2f}{row['cpu_ms_per_frame']:>10.2f}{row['amplification']:>7.2f}"
        )
    result = {
        "size": list(size),
        "clips": args.clips,
        "frames": args.frames,
        "repeats": args.repeats,
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg()[0],
        "rows": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
