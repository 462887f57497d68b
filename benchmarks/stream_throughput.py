"""Streaming throughput against the FFmpeg ceiling and a naive seek-per-frame loader.

Everything is measured in one run on the same files: nuScenes-like clips (6 cameras, 1600x900
H.265, GOP 30, no B-frames, 12 fps).

- ceiling: plain sequential PyAV decoding of every file to RGB, one process per core, FFmpeg
  threading on, no loader.
- stream loader, workers: ``StreamVideoDataModule(engine=EngineOptions(kind="workers"))`` train loader, delivered
  camera-frames/sec over one epoch after the first batch, plus its decode amplification.
- stream loader, engine: the same with ``kind="threads"`` (decode threads in the training
  process), with 2 and 4 threads.
- ``--gil-ms N``: the loop that consumes the batches runs N ms of pure Python per batch, holding
  the GIL as a Python-heavy training step does (``--gil-mode python``: bytecode, which the
  interpreter interrupts every 5 ms to let other threads run; ``c``: one long C call that keeps the
  GIL throughout); frames/sec is then the pipeline's, step included.
- Each stream loader configuration runs in a fresh process, so its peak resident memory is its own:
  the main process's peak and the largest worker's (``getrusage``), both in the table and the JSON.
- naive loader: a map-style dataset whose every item opens the camera files, seeks to the frame
  and decodes forward (what most first loaders do), in a DataLoader with the same workers.
- resize (``--resize 450x800``): the stream loader with ``FrameTransform(resize=...)``, which CPU
  decoders do inside their YUV -> RGB conversion (uint8, swscale), and the same resize done the
  old way, in float32 on the decoded frames (a transform the decoder cannot take over). Reported
  as decode time added over the stream loader without resize, same workers and threads; then the
  same three for one decoder alone in this process (milliseconds per frame).

Usage::

    python benchmarks/stream_throughput.py                 # full run (generates data once)
    python benchmarks/stream_throughput.py --quick         # smaller data, fewer repeats
    python benchmarks/stream_throughput.py --clips 2 --frames 48 --engine-threads 2 4
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from lightning_vstream import DecodeOptions, EngineOptions, OutputOptions
from lightning_vstream.demos.synth import write_dataset
from lightning_vstream.indexing import load_index
from lightning_vstream.stream.engine_loader import CPU_DECODER_THREADS
from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule
from lightning_vstream.transforms import FrameTransform


def _ensure_data(data_dir: Path, clips: int, frames: int, size: tuple[int, int], preset: str) -> Path:
    tag = f"hevc_{size[0]}x{size[1]}_g30_c{clips}_f{frames}_{preset}"
    root = data_dir / tag
    index = root / "index.json"
    if not index.exists():
        print(f"generating {clips} clips x 6 cameras x {frames} frames of {size[0]}x{size[1]} HEVC in {root} ...")
        start = time.perf_counter()
        write_dataset(
            root,
            clips=clips,
            cameras=6,
            frames=frames,
            size=size,
            codec="hevc",
            gop=30,
            bframes=0,
            fps=12,
            preset=preset,
            jobs=os.cpu_count() or 1,
        )
        print(f"  done in {time.perf_counter() - start:.0f} s")
    return index


def _decode_files(paths: list[str]) -> int:
    import av

    count = 0
    for path in paths:
        with av.open(path) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for frame in container.decode(stream):
                frame.to_ndarray(format="rgb24")
                count += 1
    return count


def measure_ceiling(paths: list[str], processes: int) -> float:
    shards = [paths[i::processes] for i in range(processes)]
    with mp.get_context("fork").Pool(processes) as pool:
        pool.map(_decode_files, [[p] for p in paths[:processes]])  # warm-up: page cache, imports
        start = time.perf_counter()
        counts = pool.map(_decode_files, shards)
        elapsed = time.perf_counter() - start
    return sum(counts) / elapsed


class AfterDecodeResize:
    """A FrameTransform applied to decoded frames only (the decoder does not see it): float32 resize."""

    def __init__(self, transform: FrameTransform) -> None:
        self.transform = transform

    def __call__(self, frames: torch.Tensor) -> torch.Tensor:
        return self.transform(frames)


def measure_stream(
    index: Path,
    *,
    batch_size: int,
    num_workers: int,
    decoder_threads: int,
    transform: Any = None,
    engine: str = "workers",
    engine_threads: int | None = None,
    gil_ms: float = 0.0,
    gil_mode: str = "python",
) -> dict[str, float]:
    dm = StreamVideoDataModule(
        index_file=index,
        batch_size=batch_size,
        engine=EngineOptions(num_workers=num_workers, persistent_workers=False, kind=engine, threads=engine_threads),
        decode=DecodeOptions(decoder_threads=decoder_threads),
        output=OutputOptions(transform=transform),
        seed=0,
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    frames = 0
    start = None
    for batch in loader:
        if start is None:  # the first batch pays for worker start-up
            start = time.perf_counter()
            continue
        frames += batch["frames"].shape[0] * batch["frames"].shape[1]
        if gil_ms:
            _hold_the_gil(gil_ms, gil_mode)
    assert start is not None
    elapsed = time.perf_counter() - start
    return {"fps": frames / elapsed, "amplification": loader.stats.amplification, "frames": frames}


def _hold_the_gil(ms: float, mode: str = "python") -> None:
    """At least ``ms`` milliseconds of work that holds the GIL, as a Python-heavy training step does.

    ``"python"``: a bytecode loop (the interpreter hands the GIL to waiting threads every 5 ms);
    ``"c"``: ``sum(range(n))`` calls of about 20 ms each, which keep the GIL until they return.
    """
    end = time.perf_counter() + ms / 1000
    if mode == "python":
        while time.perf_counter() < end:
            pass
        return
    while time.perf_counter() < end:
        sum(range(2_000_000))  # about 20 ms of C that keeps the GIL, on this VM


def _peak_rss_mb() -> tuple[float, float]:
    """Peak resident memory (MB) of this process and of its largest child that has exited (Linux: KiB units)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return own, children


def measure_isolated(index: Path, **options: Any) -> dict[str, float]:
    """:func:`measure_stream` in a fresh process: its peak RSS and its largest worker's are its own."""
    result = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps({"index": str(index), **options})],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if result.returncode != 0:
        raise RuntimeError(f"measuring {options} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _child(spec: str) -> None:
    options = json.loads(spec)
    index = Path(options.pop("index"))
    measured = measure_stream(index, **options)
    main_mb, worker_mb = _peak_rss_mb()  # workers have exited (and been reaped) when the epoch ends
    print(json.dumps({**measured, "rss_main_mb": main_mb, "rss_worker_mb": worker_mb}))


class NaiveSeekDataset(Dataset):
    """Each item opens every camera file, seeks to the frame and decodes forward to it."""

    def __init__(self, index_path: Path, items: list[tuple[int, int]]) -> None:
        self.index = load_index(index_path)
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> torch.Tensor:
        import av

        clip_pos, frame_index = self.items[i]
        frames = []
        for camera in self.index.clips[clip_pos].cameras:
            with av.open(str(camera.path)) as container:
                stream = container.streams.video[0]
                stream.thread_type = "AUTO"
                rate = stream.average_rate
                target = int(frame_index / rate / stream.time_base)
                container.seek(target, stream=stream, backward=True)
                for frame in container.decode(stream):
                    if frame.pts >= target:
                        frames.append(torch.from_numpy(frame.to_ndarray(format="rgb24")).permute(2, 0, 1))
                        break
        return torch.stack(frames)


def measure_naive(index: Path, *, batch_size: int, num_workers: int, steps: int) -> float:
    dm = StreamVideoDataModule(index_file=index, batch_size=batch_size, engine=EngineOptions(num_workers=0), seed=0)
    dm.setup("fit")
    plan = dm.train_dataloader().sampler.schedule()  # type: ignore[attr-defined]
    items = [(r.clip, r.frame) for step in range(min(steps, plan.num_steps)) for r in plan.reads(step) if r]
    loader = DataLoader(NaiveSeekDataset(index, items), batch_size=batch_size, num_workers=num_workers)
    frames = 0
    start = None
    for batch in loader:
        if start is None:
            start = time.perf_counter()
            continue
        frames += batch.shape[0] * batch.shape[1]
    assert start is not None
    return frames / (time.perf_counter() - start)


def measure_decoder_resize(paths: list[str], size: tuple[int, int], repeats: int) -> dict[str, Any]:
    """Milliseconds per frame for one decoder in this process (1 FFmpeg thread), reading files in order.

    Without a loader around it, so it isolates what the conversion costs: no resize, resize in the
    conversion, and a float32 ``FrameTransform`` resize of each decoded frame. Alternates the three.
    """
    from lightning_vstream.decode.cpu.pyav import PyAVDecoder

    float_resize = FrameTransform(resize=size)
    configs = {"no resize": None, "resize in decoder (uint8 swscale)": size, "resize after decoding (float32)": None}
    times: dict[str, list[float]] = {name: [] for name in configs}
    frames = 0
    for _ in range(repeats):
        for name, out_size in configs.items():
            count = 0
            start = time.perf_counter()
            for path in paths:
                dec = PyAVDecoder(path, threads=1, size=out_size)
                for i in range(dec.info.frame_count):
                    frame = dec.get(i)
                    if name.endswith("(float32)"):
                        float_resize(frame[None])
                    count += 1
                dec.close()
            times[name].append((time.perf_counter() - start) / count * 1000)
            frames = count
    base = statistics.median(times["no resize"])
    print(f"\none decoder, 1 FFmpeg thread, {frames} frames per pass, {repeats} passes (median ms/frame):")
    result = {}
    for name, values in times.items():
        ms = statistics.median(values)
        result[name] = {"ms_per_frame": _summary(values), "added_time": ms / base - 1.0}
        print(f"{name:<40}{ms:>10.2f} ms{(ms / base - 1) * 100:>12.1f}%")
    return result


def measure_resize(index: Path, size: tuple[int, int], args: argparse.Namespace) -> dict[str, Any]:
    """Frames/sec without resize, with the resize in the decoder, and with a float32 resize after decoding.

    The three configurations alternate within each repeat, so background load falls on all alike.
    """
    configs = {
        "no resize": None,
        "resize in decoder (uint8 swscale)": FrameTransform(resize=size),
        "resize after decoding (float32)": AfterDecodeResize(FrameTransform(resize=size)),
    }
    threads = args.decoder_threads[0]
    runs: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(args.repeats):
        for name, transform in configs.items():
            result = measure_stream(
                index,
                batch_size=args.batch_size,
                num_workers=args.workers,
                decoder_threads=threads,
                transform=transform,
            )
            runs[name].append(result["fps"])
    base = statistics.median(runs["no resize"])
    print(
        f"\nresize to {size[1]}x{size[0]} ({args.workers} workers, decoder_threads={threads}, "
        f"{args.repeats} repeats, median):"
    )
    print(f"{'configuration':<40}{'frames/s':>10}{'decode time added':>20}")
    table = {}
    for name, values in runs.items():
        fps = statistics.median(values)
        added = base / fps - 1.0
        table[name] = {"fps": _summary(values), "added_time": added}
        print(f"{name:<40}{fps:>10.1f}{added * 100:>19.1f}%")
    paths = [str(cam.path) for clip in load_index(index) for cam in clip.cameras]
    single = measure_decoder_resize(paths[:6], size, args.repeats)
    return {
        "size": list(size),
        "workers": args.workers,
        "decoder_threads": threads,
        "configs": table,
        "single_decoder": single,
    }


def _load() -> str:
    return "/".join(f"{v:.1f}" for v in os.getloadavg())


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=Path("benchmarks/data"))
    parser.add_argument("--clips", type=int, default=4)
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--size", default="1600x900")
    parser.add_argument("--preset", default="veryfast", help="x265 preset of the generated files")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--decoder-threads",
        type=int,
        nargs="+",
        default=[0, 1],
        help="FFmpeg threads per decoder to try in the stream loader (0 = FFmpeg's choice)",
    )
    parser.add_argument(
        "--engine-threads",
        type=int,
        nargs="+",
        default=[2, 4],
        help="decode threads of the thread engine rows (engine='threads')",
    )
    parser.add_argument(
        "--gil-ms",
        type=float,
        default=0.0,
        help="milliseconds of pure Python (holding the GIL) per batch in the consuming loop, as a training step",
    )
    parser.add_argument("--gil-mode", choices=["python", "c"], default="python", help="how --gil-ms holds the GIL")
    parser.add_argument("--naive-steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2 clips x 30 frames, 1 repeat")
    parser.add_argument("--resize", default=None, help="HEIGHTxWIDTH: also measure resizing, e.g. 450x800")
    parser.add_argument(
        "--resize-only",
        action="store_true",
        help="measure only the stream loader with and without --resize (no ceiling, no naive loader)",
    )
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/stream_throughput.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one isolated measurement (internal)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child)
        return {}
    if args.quick:
        args.clips, args.frames, args.repeats, args.naive_steps = 2, 30, 1, 6
    width, height = (int(v) for v in args.size.split("x"))
    index = _ensure_data(args.data_dir, args.clips, args.frames, (width, height), args.preset)
    paths = [str(cam.path) for clip in load_index(index) for cam in clip.cameras]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

    resize = None if args.resize is None else tuple(int(v) for v in args.resize.lower().split("x"))
    resize_result = None
    if resize is not None:
        resize_result = measure_resize(index, resize, args)  # type: ignore[arg-type]
        if args.resize_only:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"resize": resize_result}, indent=2) + "\n")
            print(f"wrote {args.json}")
            return {"resize": resize_result}

    # Every configuration once per repeat, in turn, so background load falls on all alike.
    configs: dict[str, dict[str, Any]] = {}
    for threads in args.decoder_threads:
        configs[f"workers, {args.workers} processes, decoder_threads={threads}"] = {
            "engine": "workers",
            "num_workers": args.workers,
            "decoder_threads": threads,
        }
    for engine_threads in args.engine_threads:
        # decoder_threads=0 means CPU_DECODER_THREADS to the engine on the CPU: name what runs, once.
        for threads in dict.fromkeys(t or CPU_DECODER_THREADS for t in args.decoder_threads):
            configs[f"engine, {engine_threads} threads, decoder_threads={threads}"] = {
                "engine": "threads",
                "engine_threads": engine_threads,
                "num_workers": 0,
                "decoder_threads": threads,
            }
    ceiling: list[float] = []
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
    for repeat in range(args.repeats):
        ceiling.append(measure_ceiling(paths, cores))
        for name, options in configs.items():
            runs[name].append(
                measure_isolated(
                    index, batch_size=args.batch_size, gil_ms=args.gil_ms, gil_mode=args.gil_mode, **options
                )
            )
            print(f"  repeat {repeat + 1}/{args.repeats}: {name}: {runs[name][-1]['fps']:.1f} frames/s", flush=True)
    naive = [
        measure_naive(index, batch_size=args.batch_size, num_workers=args.workers, steps=args.naive_steps)
        for _ in range(max(1, args.repeats - 1))
    ]

    ceiling_fps = statistics.median(ceiling)
    naive_fps = statistics.median(naive)
    table = {}
    for name, results in runs.items():
        fps = statistics.median(r["fps"] for r in results)
        table[name] = {
            **configs[name],
            "fps": _summary([r["fps"] for r in results]),
            "x_ceiling": fps / ceiling_fps,
            "amplification": statistics.median(r["amplification"] for r in results),
            "peak_rss_main_mb": max(r["rss_main_mb"] for r in results),
            "peak_rss_largest_worker_mb": max(r["rss_worker_mb"] for r in results)
            if configs[name]["num_workers"]
            else 0,
        }
    print(
        f"\n{len(paths)} files, {args.clips} clips x 6 cameras x {args.frames} frames, {width}x{height} HEVC GOP 30; "
        f"{cores} cores; batch_size={args.batch_size}; {args.repeats} repeats, median; load {_load()}"
        + (f"; a training step holding the GIL {args.gil_ms:g} ms per batch ({args.gil_mode})" if args.gil_ms else "")
    )
    header = f"{'configuration':<46}{'frames/s':>10}{'x ceiling':>11}{'decode amp':>12}  peak RSS"
    print(header)
    print(f"{'ceiling: PyAV -> RGB, 1 process per core':<46}{ceiling_fps:>10.1f}{1.0:>11.2f}")
    for name, row in table.items():
        rss = f"{row['peak_rss_main_mb']:.0f} MB main"
        if row["peak_rss_largest_worker_mb"]:
            rss += f" + {row['peak_rss_largest_worker_mb']:.0f} MB largest worker"
        else:
            rss += ", one process"
        fps = row["fps"]["median"]
        print(f"{name:<46}{fps:>10.1f}{row['x_ceiling']:>11.2f}{row['amplification']:>12.3f}  {rss}")
    print(
        f"{'naive seek-per-frame loader, ' + str(args.workers) + ' workers':<46}{naive_fps:>10.1f}"
        f"{naive_fps / ceiling_fps:>11.2f}"
    )
    best = max(table, key=lambda name: table[name]["fps"]["median"])
    best_fps = table[best]["fps"]["median"]
    print(f"\nbest: {best} = {best_fps / ceiling_fps:.2f} x ceiling, {best_fps / naive_fps:.1f} x naive")
    result = {
        "machine": {
            "cores": cores,
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average": os.getloadavg(),
        },
        "data": {
            "clips": args.clips,
            "cameras": 6,
            "frames": args.frames,
            "size": [width, height],
            "codec": "hevc",
            "gop": 30,
            "preset": args.preset,
        },
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "gil_ms_per_batch": args.gil_ms,
        "gil_mode": args.gil_mode,
        "ceiling_fps": _summary(ceiling),
        "loaders": table,
        "naive_fps": _summary(naive),
        "best": best,
        "ratio_to_ceiling": best_fps / ceiling_fps,
        "ratio_to_naive": best_fps / naive_fps,
        "resize": resize_result,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main()
