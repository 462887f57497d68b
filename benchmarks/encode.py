"""`vstream encode` speed and size against the JPEG image folders it reads.

Writes a small image-folder dataset (stamped, camera-like synthetic content: a gradient sky, a
road, moving boxes and sensor noise, JPEG quality 90, irregular ``timestamps.txt``), then measures:

(a) **baseline**: decoding the JPEG sources alone (Pillow, one thread), frames/sec: the reading
    every encode must do, and what a training loader pays per frame when it reads JPEGs;
(b) **encode**: ``encode_index`` end to end (JPEG decode, encode, probe of every written file,
    index build), frames/sec and output size over JPEG size, for each ``--config``;
(c) **read back**: sequential PyAV decoding of the encoded videos (1 thread, 3 passes per run),
    frames/sec, against (a).

Every figure is the median of ``--repeats`` runs (each encode into a fresh folder), with min and
max. A table goes to stdout and everything to ``--output`` (JSON).

Example::

    python benchmarks/encode.py --output encode.json
    python benchmarks/encode.py --size 1600x900 --frames 48 --config '{"codec": "hevc", "jobs": 2}'
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA = "lightning_vstream.bench.encode/1"
DEFAULT_CONFIGS = (
    '{"codec": "hevc"}',
    '{"codec": "h264"}',
    '{"codec": "hevc", "preset": "ultrafast"}',
    '{"codec": "hevc", "crf": 20}',
)


def summarize(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": list(values)}


def _texture(width: int, height: int, seed: int) -> np.ndarray:
    """Detail that moves with the camera (buildings, road surface): smooth blobs of several sizes."""
    rng = np.random.default_rng(seed)
    out = np.zeros((height, 2 * width, 3))
    for cell, weight in ((64, 0.5), (16, 0.3), (4, 0.2)):
        coarse = rng.uniform(-1, 1, size=(height // cell + 2, 2 * width // cell + 2, 3))
        out += weight * np.kron(coarse, np.ones((cell, cell, 1)))[:height, : 2 * width]
    return out


def _frame(width: int, height: int, index: int, rng: np.random.Generator, texture: np.ndarray) -> np.ndarray:
    y = np.linspace(0.0, 1.0, height)[:, None, None]
    sky = np.array([90, 140, 210]) * (1 - y) + np.array([200, 210, 225]) * y
    image = np.broadcast_to(sky, (height, width, 3)).copy()
    image[height // 2 :] = np.array([70, 70, 75]) + 20 * y[height // 2 :]
    for b in range(6):
        x0 = int((b * width / 6 + index * (3 + b)) % width)
        y0 = height // 2 + (b % 3) * height // 10
        image[y0 : y0 + height // 8, x0 : x0 + width // 10] = [40 + 30 * b, 200 - 25 * b, 60 + 20 * b]
    shift = (index * 5) % width
    image += 45 * texture[:, shift : shift + width]
    image += rng.normal(0, 2.0, size=image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def write_images(root: Path, clips: int, cameras: int, frames: int, size: tuple[int, int]) -> tuple[Path, int]:
    from PIL import Image

    from lightning_vstream.decode.images import write_timestamps
    from lightning_vstream.demos.synth import Stamp, draw_stamp
    from lightning_vstream.indexing import build_index

    width, height = size
    total = 0
    for c in range(clips):
        for k in range(cameras):
            folder = root / "images" / f"scene-{c:04d}" / f"CAM_{k}"
            folder.mkdir(parents=True)
            rng = np.random.default_rng(c * 100 + k)
            texture = _texture(width, height, c * 100 + k)
            times, t = [], 1_532_402_927.0 + c * 60
            for i in range(frames):
                image = _frame(width, height, i, rng, texture)
                draw_stamp(image, Stamp(c, k, i))
                path = folder / f"{i:06d}.jpg"
                Image.fromarray(image).save(path, quality=90)
                total += path.stat().st_size
                times.append(round(t, 6))
                t += 0.083_333 + float(rng.integers(-2000, 2000)) * 1e-6
            write_timestamps(folder, times)
    return build_index(root, output=root / "index.json", progress=False), total


def decode_jpegs(index_path: Path) -> tuple[int, float]:
    from PIL import Image

    from lightning_vstream.index.files import image_files
    from lightning_vstream.indexing import load_index

    start, count = time.perf_counter(), 0
    for clip in load_index(index_path):
        for cam in clip.cameras:
            for path in image_files(cam.path):
                with Image.open(path) as image:
                    np.asarray(image.convert("RGB"))
                count += 1
    return count, time.perf_counter() - start


def decode_videos(index_path: Path) -> tuple[int, float]:
    from lightning_vstream.decode.cpu.pyav import PyAVDecoder
    from lightning_vstream.indexing import load_index

    start, count = time.perf_counter(), 0
    for clip in load_index(index_path):
        for cam in clip.cameras:
            decoder = PyAVDecoder(cam.path, info=cam.info, threads=1)
            for _ in range(decoder.info.frame_count):
                decoder.read()
                count += 1
            decoder.close()
    return count, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clips", type=int, default=2)
    parser.add_argument("--cameras", type=int, default=3)
    parser.add_argument("--frames", type=int, default=24)
    parser.add_argument("--size", default="800x450", help="WIDTHxHEIGHT")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--config", action="append", default=None, help="JSON keyword arguments of encode_index")
    parser.add_argument("--output", type=Path, default=Path("encode.json"))
    args = parser.parse_args()
    from lightning_vstream.encode import encode_index

    width, height = (int(v) for v in args.size.lower().split("x"))
    configs = [json.loads(c) for c in (args.config or DEFAULT_CONFIGS)]
    work = Path(tempfile.mkdtemp(prefix="vstream_encode_bench_"))
    try:
        src, jpeg_bytes = write_images(work / "src", args.clips, args.cameras, args.frames, (width, height))
        decode_jpegs(src)  # warm-up: file cache and Pillow
        jpeg = [n / s for n, s in (decode_jpegs(src) for _ in range(max(args.repeats, 3)))]
        rows = []
        for config in configs:
            fps, ratios, read = [], [], []
            for r in range(args.repeats):
                out = work / f"out_{len(rows)}_{r}"
                summary = encode_index(src, out, progress=False, **config)
                fps.append(summary.frames_per_second)
                ratios.append(summary.size_ratio)
                for _ in range(3):  # reading is quick and noisier than encoding: more samples
                    n, s = decode_videos(summary.index)
                    read.append(n / s)
                shutil.rmtree(out)
            rows.append(
                {
                    "config": config,
                    "encode_fps": summarize(fps),
                    "size_ratio": statistics.median(ratios),
                    "read_fps": summarize(read),
                }
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    frames = args.clips * args.cameras * args.frames
    jpeg_fps = statistics.median(jpeg)
    print(
        f"{frames} frames ({args.clips} clips x {args.cameras} cameras x {args.frames}) at {width}x{height}, "
        f"JPEG q90 {jpeg_bytes / frames / 1024:.1f} KiB/frame; {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}; "
        f"JPEG decode baseline {jpeg_fps:.1f} frames/s (1 thread)"
    )
    print(f"{'config':<44} {'encode f/s':>16} {'size/JPEG':>10} {'read f/s':>9} {'read/JPEG':>10}")
    for row in rows:
        e, rd = row["encode_fps"], row["read_fps"]
        print(
            f"{json.dumps(row['config']):<44} {e['median']:>7.1f} ({e['min']:.0f}-{e['max']:.0f}) "
            f"{row['size_ratio']:>10.3f} {rd['median']:>9.1f} {rd['median'] / jpeg_fps:>9.2f}x"
        )
    result = {
        "schema": SCHEMA,
        "machine": {
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg()[0],
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "data": {
            "clips": args.clips,
            "cameras": args.cameras,
            "frames": args.frames,
            "size": [width, height],
            "jpeg_quality": 90,
            "jpeg_bytes": jpeg_bytes,
        },
        "jpeg_decode_fps": summarize(jpeg),
        "configs": rows,
    }
    args.output.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
