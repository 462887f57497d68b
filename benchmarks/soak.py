"""Soak test: stream for many steps and watch resident memory for growth.

Streams a dataset of many short clips (so slots change clips, and decoders open and close,
every few steps) with ``StreamVideoDataModule`` for ``--steps`` steps, looping over epochs as
Lightning does (``loader.sampler.set_epoch(e)``, then iterate). Every ``--sample-every`` steps it
records the resident memory of the main process plus all its child processes (psutil RSS,
summed) and, where the platform reports it, the unique set size (USS: memory no other process
shares, so forked workers are not double-counted).

After a warm-up (``--warmup``, a fraction of the steps) a least-squares line is fitted to the
samples; its slope in MB per 1000 steps is the headline figure, next to the max - min spread.
A healthy loader stays under 1 MB per 1000 steps. The baseline, measured in the same run, is
plain PyAV decoding the same files frame by frame (no loader), so FFmpeg's own drift is visible
next to the loader's.

Every configuration runs in a fresh subprocess, so one run's heap does not carry into the next.

Reading the numbers: with ``--decoder-threads 0`` (the DataModule's default) every decoder that
opens starts an FFmpeg thread pool, and glibc gives threads their own malloc arenas, which
fragment as clips come and go. That growth slows down over time and is native heap: Python's own
live allocations stay flat (tracemalloc). ``--decoder-threads 1`` or ``MALLOC_ARENA_MAX=2``
removes most of it and shows the loader's own footprint.

Usage::

    python benchmarks/soak.py                      # 5000 steps; generates data once
    python benchmarks/soak.py --steps 1000         # shorter
    python benchmarks/soak.py --data-dir /data/x   # reuse (or create) the dataset there
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from lightning_vstream import DecodeOptions, EngineOptions, PlanOptions

CONFIGS: dict[str, dict[str, Any]] = {
    "pyav_baseline": {"mode": "pyav", "num_workers": 0, "persistent_workers": False},
    "workers_0": {"mode": "stream", "num_workers": 0, "persistent_workers": False},
    "workers_2_persistent": {"mode": "stream", "num_workers": 2, "persistent_workers": True},
    "workers_2": {"mode": "stream", "num_workers": 2, "persistent_workers": False},
}
THRESHOLD_MB_PER_1000 = 1.0


def _ensure_data(data_dir: Path, *, clips: int, frames: list[int], size: tuple[int, int], gop: int) -> Path:
    from lightning_vstream.demos.synth import write_dataset

    tag = f"soak_h264_{size[0]}x{size[1]}_c{clips}_f{'-'.join(map(str, frames))}_g{gop}"
    root = data_dir / tag
    index = root / "index.json"
    if not index.exists():
        print(f"generating {clips} clips x 2 cameras x {frames} frames of {size[0]}x{size[1]} H.264 in {root} ...")
        start = time.perf_counter()
        write_dataset(
            root, clips=clips, cameras=2, frames=frames, size=size, codec="h264", gop=gop, jobs=os.cpu_count() or 1
        )
        print(f"  done in {time.perf_counter() - start:.0f} s")
    return index


# -- measuring (child process) ----------------------------------------------------------------
def _memory() -> dict[str, Any]:
    """RSS and USS in MB of this process plus every descendant (workers)."""
    procs = [psutil.Process()]
    procs += procs[0].children(recursive=True)
    rss = uss = 0.0
    have_uss = True
    per_process: list[float] = []
    for proc in procs:
        try:
            if have_uss:
                try:
                    full = proc.memory_full_info()
                    rss += full.rss
                    uss += full.uss
                    per_process.append(full.rss / 2**20)
                    continue
                except (psutil.AccessDenied, AttributeError):
                    have_uss = False
            per_process.append(proc.memory_info().rss / 2**20)
            rss += per_process[-1] * 2**20
        except psutil.NoSuchProcess:  # a worker exiting at an epoch end
            continue
    return {
        "rss_mb": rss / 2**20,
        "uss_mb": uss / 2**20 if have_uss else float("nan"),
        "children": len(per_process) - 1,
        "rss_per_process_mb": per_process,
    }


def _stream_batches(
    index: Path, cfg: dict[str, Any], steps: int, batch_size: int, threads: int, summary: dict[str, Any]
) -> Iterator[Any]:
    """Batches' frames from the DataModule's train loader, epoch after epoch; fills ``summary`` at the end."""
    from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule

    dm = StreamVideoDataModule(
        index_file=index,
        batch_size=batch_size,
        engine=EngineOptions(num_workers=cfg["num_workers"], persistent_workers=cfg["persistent_workers"]),
        decode=DecodeOptions(decoder_threads=threads),
        plan=PlanOptions(shuffle=True),
        seed=0,
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    done = 0
    epoch = 0
    try:
        while done < steps:
            loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined] # what Lightning does every epoch
            for batch in loader:
                yield batch["frames"]
                done += 1
                if done >= steps:
                    break
            epoch += 1
    finally:
        stats = loader.stats
        summary.update(
            epochs_started=epoch,
            files_opened=stats.files_opened,
            frames_delivered=stats.frames_delivered,
            amplification=stats.amplification,
            # Decoders the main process holds (num_workers=0): one per camera stream at most.
            open_decoders_in_main_process=len(loader.dataset.decoders),  # type: ignore[attr-defined]
        )
        dm.teardown("fit")


def _pyav_batches(index: Path, steps: int, batch_size: int, threads: int, summary: dict[str, Any]) -> Iterator[Any]:
    """Baseline: plain PyAV decoding of the same files, one 'step' per batch's worth of frames."""
    import av

    from lightning_vstream.indexing import load_index

    paths = [str(cam.path) for clip in load_index(index) for cam in clip.cameras]
    per_step = batch_size * 2
    done = 0
    pending: list[Any] = []
    summary["files_opened"] = 0
    while done < steps:
        for path in paths:
            with av.open(path) as container:
                stream = container.streams.video[0]
                stream.thread_type = "AUTO"
                stream.codec_context.thread_count = threads
                summary["files_opened"] += 1
                for frame in container.decode(stream):
                    pending.append(frame.to_ndarray(format="rgb24"))
                    if len(pending) == per_step:
                        yield pending
                        pending = []
                        done += 1
                        if done >= steps:
                            return


def run_one(index: Path, name: str, *, steps: int, every: int, batch_size: int, threads: int) -> dict[str, Any]:
    cfg = CONFIGS[name]
    summary: dict[str, Any] = {}
    if cfg["mode"] == "pyav":
        source = _pyav_batches(index, steps, batch_size, threads, summary)
    else:
        source = _stream_batches(index, cfg, steps, batch_size, threads, summary)
    samples: list[dict[str, Any]] = []
    start = time.perf_counter()
    for step, frames in enumerate(source, start=1):
        del frames  # a training step would use the batch here; holding none keeps the baseline fair
        if step % every == 0:
            samples.append({"step": step, "seconds": time.perf_counter() - start, **_memory()})
    elapsed = time.perf_counter() - start
    return {"name": name, **cfg, "steps": steps, "seconds": elapsed, "samples": samples, "summary": summary}


# -- analysis (parent process) ----------------------------------------------------------------
def _fit(samples: list[dict[str, float]], key: str, warmup_step: float) -> dict[str, float]:
    import numpy as np

    points = [(s["step"], s[key]) for s in samples if s["step"] > warmup_step and s[key] == s[key]]
    if len(points) < 3:
        return {
            "slope_mb_per_1000": float("nan"),
            "spread_mb": float("nan"),
            "first_mb": float("nan"),
            "last_mb": float("nan"),
            "samples": len(points),
        }
    x = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    slope = float(np.polyfit(x, y, 1)[0]) * 1000
    return {
        "slope_mb_per_1000": slope,
        "spread_mb": float(y.max() - y.min()),
        "first_mb": float(y[0]),
        "last_mb": float(y[-1]),
        "samples": len(points),
    }


def _run_child(args: argparse.Namespace, index: Path, name: str) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        name,
        "--index",
        str(index),
        "--steps",
        str(args.steps),
        "--sample-every",
        str(args.sample_every),
        "--batch-size",
        str(args.batch_size),
        "--decoder-threads",
        str(args.decoder_threads),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"soak run {name!r} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--sample-every", type=int, default=None, help="steps between samples (default steps/100)")
    parser.add_argument("--warmup", type=float, default=0.2, help="fraction of the steps left out of the fit")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--decoder-threads", type=int, default=0)
    parser.add_argument("--clips", type=int, default=40)
    parser.add_argument("--frames", default="24,36,48,60", help="frames per clip, cycled over the clips")
    parser.add_argument("--size", default="64x48")
    parser.add_argument("--gop", type=int, default=12)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--data-dir", type=Path, default=Path("benchmarks/data"))
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/soak.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sample_every is None:
        args.sample_every = max(1, args.steps // 100)

    if args.child:
        result = run_one(
            args.index,
            args.child,
            steps=args.steps,
            every=args.sample_every,
            batch_size=args.batch_size,
            threads=args.decoder_threads,
        )
        print(json.dumps(result))
        return result

    width, height = (int(v) for v in args.size.split("x"))
    frames = [int(v) for v in args.frames.split(",")]
    index = _ensure_data(args.data_dir, clips=args.clips, frames=frames, size=(width, height), gop=args.gop)
    warmup_step = args.steps * args.warmup
    runs: dict[str, Any] = {}
    for name in args.configs:
        print(f"running {name} for {args.steps} steps ...", flush=True)
        run = _run_child(args, index, name)
        run["fit_rss"] = _fit(run["samples"], "rss_mb", warmup_step)
        run["fit_uss"] = _fit(run["samples"], "uss_mb", warmup_step)
        runs[name] = run

    print(
        f"\n{args.clips} clips x 2 cameras x {frames} frames, {width}x{height} H.264 GOP {args.gop}; "
        f"batch_size={args.batch_size}; {args.steps} steps, sampled every {args.sample_every}, "
        f"fit after step {warmup_step:.0f}; {os.cpu_count()} cores"
    )
    header = (
        f"{'configuration':<24}{'steps/s':>8}{'RSS MB':>9}{'RSS slope':>11}{'RSS spread':>12}"
        f"{'USS MB':>9}{'USS slope':>11}{'USS spread':>12}{'files':>7}"
    )
    print(header)
    print(f"{'':<24}{'':>8}{'(last)':>9}{'MB/1k st':>11}{'MB':>12}{'(last)':>9}{'MB/1k st':>11}{'MB':>12}{'opened':>7}")
    for name, run in runs.items():
        r, u = run["fit_rss"], run["fit_uss"]
        print(
            f"{name:<24}{run['steps'] / run['seconds']:>8.0f}{r['last_mb']:>9.1f}{r['slope_mb_per_1000']:>11.3f}"
            f"{r['spread_mb']:>12.2f}{u['last_mb']:>9.1f}{u['slope_mb_per_1000']:>11.3f}{u['spread_mb']:>12.2f}"
            f"{run['summary'].get('files_opened', 0):>7}"
        )
    over = [
        n
        for n, run in runs.items()
        if run["mode"] == "stream" and run["fit_rss"]["slope_mb_per_1000"] > THRESHOLD_MB_PER_1000
    ]
    verdict = "all under" if not over else f"OVER in {over}"
    print(f"\nthreshold {THRESHOLD_MB_PER_1000} MB per 1000 steps (RSS slope): {verdict}")
    result = {
        "machine": {"cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "data": {
            "clips": args.clips,
            "cameras": 2,
            "frames": frames,
            "size": [width, height],
            "codec": "h264",
            "gop": args.gop,
        },
        "batch_size": args.batch_size,
        "decoder_threads": args.decoder_threads,
        "steps": args.steps,
        "sample_every": args.sample_every,
        "warmup_steps": warmup_step,
        "threshold_mb_per_1000_steps": THRESHOLD_MB_PER_1000,
        "over_threshold": over,
        "runs": runs,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main()
