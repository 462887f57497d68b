"""Random-access benchmark: cost per clip sample versus video length, against peer loaders.

Every loader decodes the same requests: ``--frames`` frames ``--spacing`` seconds apart from
random places in 1280x720 60 fps H.264 videos of ``--lengths`` seconds (60 and 300 by default;
``--long`` adds 3000). Per loader and length it reports the median cost per sample (with the
10th/90th percentiles), frames per second, frames decoded per sample where it can count them,
the ratio longest/shortest length, and each peer's cost relative to lightning_vstream.

Loaders:

- ``vstream``: :class:`lightning_vstream.VideoClipDataset` over an index written by
  ``build_index`` (keyframes and timestamps from its metadata), requests given as times.
  Decoders stay open between requests (per-worker LRU), as in a DataLoader worker; its default
  FFmpeg threads (``decoder_threads=0``: one per decoder when GOPs decode at once, FFmpeg's choice
  when they decode in turn). Measured with ``gop_threads`` 1 (GOPs decoded in turn) and the default 2
  (a request's GOPs decoded on two decoders of the file at once), rows ``vstream[gop=N]``.
- ``naive_pyav``: a typical ``Dataset.__getitem__``: open the file with PyAV, and for every
  frame seek to its position (``index / fps``) and decode forward to it.
- ``opencv``: ``cv2.VideoCapture`` per sample, ``CAP_PROP_POS_FRAMES`` seek then ``read`` per
  frame (when OpenCV is installed).
- ``torchcodec``: its best CPU settings: one ``VideoDecoder(path, seek_mode="exact",
  num_ffmpeg_threads=0)`` per file, kept open across samples (FFmpeg chooses its threads), and
  the batched ``get_frames_at(indices)``. When it does not import here (the torchcodec 0.17 wheel
  is a CUDA build, which does not load next to CPU torch), it runs in an interpreter where it
  does (``--torchcodec-python``, ``VSTREAM_TORCHCODEC_PYTHON`` or ``/tmp/torchcodec-venv``; set up
  as ``benchmarks/stride.py`` says) at four settings, each in a process of its own that times its
  calls itself: ``seek_mode`` ``"exact"`` and ``"approximate"``, FFmpeg's thread count and one
  thread. When neither works, the table says so.

Every frame every loader returns is checked against its stamp, outside the timed region.
Wall time and process CPU time (all threads) are both reported.

Videos are written once into ``--data-dir`` (libx264 ``ultrafast``, keyframe every ``--gop``
frames) and reused by later runs. The 3000 s video is the 300 s encode repeated ten times by
stream copy (same GOP structure and bitrate; stamps repeat every 300 s and are checked modulo
that), which takes seconds instead of the better part of an hour of encoding.

Usage::

    python benchmarks/random_access.py                 # 60 s and 300 s videos
    python benchmarks/random_access.py --long          # also 3000 s
    python benchmarks/random_access.py --quick         # 10 s and 30 s videos, fewer samples
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from lightning_vstream.clips.dataset import VideoClipDataset
from lightning_vstream.clips.selection import at_times
from lightning_vstream.demos.synth import clip_name, read_stamp, write_stamped_video
from lightning_vstream.indexing import build_index, load_index

CAMERA = "CAM_FRONT"
TILE_BASE = 300  # seconds: longer videos are tiled from this encode


# -- data ------------------------------------------------------------------------------------
def _params(args: argparse.Namespace) -> dict[str, Any]:
    return {"size": list(args.size), "fps": args.fps, "gop": args.gop, "crf": args.crf, "preset": "ultrafast"}


def _tile(src: Path, dst: Path, repeat: int) -> None:
    """Write ``src`` ``repeat`` times back to back into ``dst`` by stream copy."""
    import av

    tmp = dst.with_suffix(".tmp.mp4")
    with av.open(str(src)) as inp, av.open(str(tmp), mode="w") as out:
        ist = inp.streams.video[0]
        ost = out.add_stream_from_template(ist)
        pts = [p.pts for p in inp.demux(ist) if p.pts is not None]
        span = max(pts) - min(pts) + (sorted(pts)[1] - sorted(pts)[0])
        for k in range(repeat):
            inp.seek(0, stream=ist)
            for packet in inp.demux(ist):
                if packet.dts is None:
                    continue
                packet.pts += k * span
                packet.dts += k * span
                packet.stream = ost
                out.mux(packet)
    tmp.replace(dst)


def prepare(args: argparse.Namespace, length: int) -> tuple[Path, int, int]:
    """Write (or reuse) the video of ``length`` seconds and its index.

    Returns the index path, the period after which frame stamps repeat, and the stamped clip number.
    """
    folder = args.data_dir / f"len-{length:05d}"
    video = folder / "videos" / clip_name(length) / f"{CAMERA}.mp4"
    index = folder / "index.json"
    params_file = folder / "params.json"
    params = {**_params(args), "length": length}
    period, stamped = length * round(args.fps), length
    if length > TILE_BASE and length % TILE_BASE == 0:
        params["tiled_from"] = TILE_BASE
        period, stamped = TILE_BASE * round(args.fps), TILE_BASE
    if params_file.is_file() and json.loads(params_file.read_text()) == params and index.is_file() and video.is_file():
        return index, period, stamped
    started = time.perf_counter()
    if "tiled_from" in params:
        base_index, _, _ = prepare(args, TILE_BASE)
        base = base_index.parent / "videos" / clip_name(TILE_BASE) / f"{CAMERA}.mp4"
        video.parent.mkdir(parents=True, exist_ok=True)
        print(f"  tiling {length} s video from the {TILE_BASE} s encode ...", flush=True)
        _tile(base, video, length // TILE_BASE)
    else:
        print(f"  encoding {length} s of {args.size[0]}x{args.size[1]} {args.fps:g} fps H.264 ...", flush=True)
        tmp = video.with_suffix(".tmp.mp4")
        write_stamped_video(
            tmp,
            clip=length,
            camera=0,
            frames=length * round(args.fps),
            size=tuple(args.size),
            gop=args.gop,
            fps=args.fps,
            preset="ultrafast",
            crf=args.crf,
        )
        tmp.replace(video)
    build_index(folder, output=index, video_dirs=["videos"], progress=False)
    params_file.write_text(json.dumps(params))
    print(
        f"  ready in {time.perf_counter() - started:.0f} s: {video} ({video.stat().st_size / 1e6:.0f} MB)", flush=True
    )
    return index, period, stamped


# -- loaders ---------------------------------------------------------------------------------
class Vstream:
    def __init__(self, index_path: Path, gop_threads: int) -> None:
        self.name = f"vstream[gop={gop_threads}]"
        self.dataset = VideoClipDataset(index=index_path, gop_threads=gop_threads)
        self.info = self.dataset.index.clips[0].cameras[0].info

    def __call__(self, path: Path, clip_id: str, indices: list[int]) -> list[Any]:
        times = [self.info.timestamp(i) for i in indices]
        sample = self.dataset[at_times(clip_id, times)]
        if sample["frame_index"].tolist() != indices:
            raise AssertionError(f"vstream returned frames {sample['frame_index'].tolist()}, expected {indices}")
        return list(sample["frames"][:, 0])

    def decoded(self) -> int:
        return self.dataset.decoders.frames_decoded


class NaivePyAV:
    name = "naive_pyav"

    def __init__(self, fps: float) -> None:
        self.fps = fps
        self._decoded = 0

    def __call__(self, path: Path, clip_id: str, indices: list[int]) -> list[Any]:
        import av

        frames = []
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"  # same FFmpeg threading as vstream's decoder
            for index in indices:
                target = round(Fraction(index) / Fraction(self.fps).limit_denominator(1001) / stream.time_base)
                container.seek(target, stream=stream, backward=True)
                for frame in container.decode(stream):
                    self._decoded += 1
                    if frame.pts is not None and frame.pts >= target:
                        frames.append(frame.to_ndarray(format="rgb24"))
                        break
        return frames

    def decoded(self) -> int:
        return self._decoded


class OpenCV:
    name = "opencv"

    def __init__(self) -> None:
        import cv2

        self.cv2 = cv2

    def __call__(self, path: Path, clip_id: str, indices: list[int]) -> list[Any]:
        cap = self.cv2.VideoCapture(str(path))
        frames = []
        try:
            for index in indices:
                cap.set(self.cv2.CAP_PROP_POS_FRAMES, index)
                ok, frame = cap.read()
                if not ok:
                    raise RuntimeError(f"OpenCV could not read frame {index} of {path}")
                frames.append(frame)  # BGR; stamps are black and white, so the order does not matter
        finally:
            cap.release()
        return frames

    def decoded(self) -> None:
        return None


class TorchCodec:
    name = "torchcodec"

    def __init__(self) -> None:
        try:
            from torchcodec.decoders import VideoDecoder
        except ModuleNotFoundError as err:
            raise RuntimeError("torchcodec is not installed (pip install torchcodec; it needs FFmpeg)") from err
        self.VideoDecoder = VideoDecoder
        self._decoders: dict[Path, Any] = {}  # kept open across samples, as vstream keeps its decoders

    def __call__(self, path: Path, clip_id: str, indices: list[int]) -> list[Any]:
        decoder = self._decoders.get(path)
        if decoder is None:
            decoder = self._decoders[path] = self.VideoDecoder(
                str(path), seek_mode="exact", device="cpu", num_ffmpeg_threads=0
            )
        return list(decoder.get_frames_at(indices).data)

    def decoded(self) -> None:
        return None


#: The torchcodec reader run by another interpreter (a venv where torchcodec imports): it imports only numpy,
#: torch and torchcodec, times each call itself (wall and process CPU time) and hands the frames back in a file.
_TORCHCODEC_CHILD = r"""
import json, sys, time
import numpy as np
from torchcodec.decoders import VideoDecoder
mode, threads = sys.argv[1], int(sys.argv[2])
import torchcodec
print(json.dumps({"version": torchcodec.__version__}), flush=True)
decoders = {}
for line in sys.stdin:
    message = json.loads(line)
    try:
        path = message["path"]
        started, started_cpu = time.perf_counter(), time.process_time()
        decoder = decoders.get(path)
        if decoder is None:
            decoder = decoders[path] = VideoDecoder(path, seek_mode=mode, device="cpu", num_ffmpeg_threads=threads)
        frames = decoder.get_frames_at(message["indices"]).data
        wall, cpu = time.perf_counter() - started, time.process_time() - started_cpu
        np.save(message["out"], frames.numpy())
        print(json.dumps({"wall": wall, "cpu": cpu}), flush=True)
    except Exception as err:
        print(json.dumps({"error": f"{type(err).__name__}: {err}"[:400]}), flush=True)
"""
TORCHCODEC_VENV = Path("/tmp/torchcodec-venv/bin/python")


class TorchCodecProcess:
    """torchcodec in an interpreter of its own (the 0.17 wheel is a CUDA build that imports only next to the CUDA
    build of torch; it then decodes on the CPU), at one seek mode and FFmpeg thread count, kept for the run.

    Its call's wall and CPU time are the child's own (``timing``); the frames come back through a file, untimed.
    """

    def __init__(self, python: str, mode: str, threads: int, scratch: Path) -> None:
        import subprocess

        label = "auto" if threads == 0 else str(threads)
        self.name = f"torchcodec[{mode}, ffmpeg threads {label}]"
        self.setting = (
            f"VideoDecoder(seek_mode={mode!r}, num_ffmpeg_threads={threads}) kept open per file, get_frames_at, "
            "in its own venv"
        )
        self._out = scratch / f"torchcodec-{mode}-{threads}.npy"
        self.process = subprocess.Popen(
            [python, "-c", _TORCHCODEC_CHILD, mode, str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        first = self._answer()
        if "version" not in first:
            self.close()
            raise RuntimeError(f"{python}: torchcodec does not import")
        self.version = first["version"]
        self.timing: tuple[float, float] | None = None

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name}: the reader's process ended (exit {self.process.wait(timeout=60)})")
        return dict(json.loads(line))

    def __call__(self, path: Path, clip_id: str, indices: list[int]) -> list[Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"path": str(path), "indices": indices, "out": str(self._out)}) + "\n")
        self.process.stdin.flush()
        answer = self._answer()
        if "error" in answer:
            raise RuntimeError(f"{self.name}: {answer['error']}")
        self.timing = (answer["wall"], answer["cpu"])
        return list(np.load(self._out))

    def decoded(self) -> None:
        return None

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.process.wait(timeout=60)


def torchcodec_processes(python: str | None, scratch: Path) -> list[TorchCodecProcess]:
    """torchcodec at its four settings (exact or approximate seeks, FFmpeg's thread count or one thread), each
    in a process of its own, when an interpreter where it imports is found."""
    import os

    given = python or os.environ.get("VSTREAM_TORCHCODEC_PYTHON")
    chosen = given or (str(TORCHCODEC_VENV) if TORCHCODEC_VENV.exists() else None)
    if chosen is None:
        raise RuntimeError("no interpreter where torchcodec imports (--torchcodec-python)")
    return [
        TorchCodecProcess(chosen, mode, threads, scratch) for mode in ("exact", "approximate") for threads in (0, 1)
    ]


def _try(factory: Callable[[], Any]) -> tuple[Any, str | None]:
    try:
        return factory(), None
    except Exception as err:
        causes = []
        cause: BaseException | None = err
        while cause is not None and len(causes) < 3:
            causes.append(f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}")
            cause = cause.__cause__
        return None, " <- ".join(causes)[:400]


def _check(frames: list[Any], indices: list[int], clip: int, period: int, who: str) -> None:
    if len(frames) != len(indices):
        raise AssertionError(f"{who} returned {len(frames)} frames for {len(indices)} requested")
    for frame, index in zip(frames, indices):
        array = frame.numpy() if hasattr(frame, "numpy") else np.asarray(frame)
        layout = "chw" if array.shape[0] == 3 else "hwc"
        stamp = read_stamp(array, layout=layout)
        if (stamp.clip, stamp.frame) != (clip, index % period):
            raise AssertionError(
                f"{who}: frame {index} carries stamp {stamp} (expected clip {clip}, frame {index % period})"
            )


# -- main ------------------------------------------------------------------------------------
def _rotate(items: list[Any], r: int) -> list[Any]:
    k = r % len(items)
    return items[k:] + items[:k]


def _stats(values: list[float]) -> dict[str, float]:
    q = np.percentile(values, [10, 50, 90])
    return {
        "median_s": float(q[1]),
        "p10_s": float(q[0]),
        "p90_s": float(q[2]),
        "min_s": min(values),
        "max_s": max(values),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import av
    import torch

    lengths = sorted(set(args.lengths + ([3000] if args.long else [])))
    span = (args.frames - 1) * args.spacing
    for length in lengths:
        if length <= span:
            raise SystemExit(f"--lengths: a {length} s video cannot hold {args.frames} frames {args.spacing} s apart.")
    print(f"preparing videos in {args.data_dir} ...", flush=True)
    data = {length: prepare(args, length) for length in lengths}
    if args.prepare_only:
        raise SystemExit(0)

    peers: dict[str, Any] = {}
    unavailable: dict[str, str] = {}
    scratch = Path(tempfile.mkdtemp(prefix="vstream-ra-"))  # frames handed back by readers in other processes
    for name, factory in (("naive_pyav", lambda: NaivePyAV(args.fps)), ("opencv", OpenCV), ("torchcodec", TorchCodec)):
        if name in args.skip:
            continue
        loader, reason = _try(factory)
        if loader is None and name == "torchcodec":  # the CUDA build, in a venv of its own
            children, why = _try(lambda: torchcodec_processes(args.torchcodec_python, scratch))
            if children is not None:
                peers.update((child.name, child) for child in children)
                continue
            reason = f"{reason}; {why}"
        if loader is None:
            unavailable[name] = reason or "unavailable"
            print(f"  {name}: not measured ({reason})", flush=True)
        else:
            peers[name] = loader

    rng = np.random.default_rng(args.seed)
    step = round(args.spacing * args.fps)
    total = args.warmup + args.samples
    cases = {}
    for length in lengths:
        index_path, period, stamped = data[length]
        clip = load_index(index_path).clips[0]
        starts = rng.integers(0, clip.frame_count - (args.frames - 1) * step, size=total)
        cases[length] = {
            "clip": clip,
            "period": period,
            "stamped": stamped,
            "requests": [[int(s) + k * step for k in range(args.frames)] for s in starts],
            "loaders": [*(Vstream(index_path, g) for g in args.gop_threads), *peers.values()],
        }
    names = [lo.name for lo in cases[lengths[0]]["loaders"]]
    wall = {(n, x): [] for n in names for x in lengths}
    cpu = {(n, x): [] for n in names for x in lengths}
    decoded = {(n, x): [] for n in names for x in lengths}
    first: dict[tuple[str, int], float] = {}
    print(
        f"{args.warmup} warm-up + {args.samples} timed rounds; each round runs every loader on one request per "
        "length (orders rotate, so background load falls on all alike)",
        flush=True,
    )
    for r in range(total):
        for length in _rotate(lengths, r):
            case = cases[length]
            clip, indices = case["clip"], case["requests"][r]
            for loader in _rotate(case["loaders"], r):
                before = loader.decoded()
                started, started_cpu = time.perf_counter(), time.process_time()
                frames = loader(clip.cameras[0].path, clip.clip_id, indices)
                elapsed, elapsed_cpu = time.perf_counter() - started, time.process_time() - started_cpu
                if getattr(loader, "timing", None) is not None:  # a reader in another process times itself
                    elapsed, elapsed_cpu = loader.timing
                after = loader.decoded()
                _check(frames, indices, case["stamped"], case["period"], loader.name)
                key = (loader.name, length)
                if r == 0:
                    first[key] = elapsed
                if r < args.warmup:
                    continue
                wall[key].append(elapsed)
                cpu[key].append(elapsed_cpu)
                if before is not None and after is not None:
                    decoded[key].append(after - before)
        print(f"  round {r + 1}/{total} done", flush=True)
    for loader in peers.values():
        getattr(loader, "close", lambda: None)()
    shutil.rmtree(scratch, ignore_errors=True)

    results: dict[str, dict[str, Any]] = {}
    for name in names:
        entry = results.setdefault(name, {})
        for length in lengths:
            key = (name, length)
            stats = _stats(wall[key])
            stats["cpu_median_s"] = float(statistics.median(cpu[key]))
            stats["frames_per_s"] = args.frames / stats["median_s"]
            stats["first_sample_s"] = first[key]
            if decoded[key]:
                stats["decoded_frames_per_sample"] = float(statistics.median(decoded[key]))
            entry[str(length)] = stats
        print(f"  {name:<11} " + "  ".join(f"{x} s: {entry[str(x)]['median_s']:.3f} s" for x in lengths), flush=True)

    longest, shortest = str(lengths[-1]), str(lengths[0])
    for entry in results.values():
        entry["ratio_longest_to_shortest"] = entry[longest]["median_s"] / entry[shortest]["median_s"]
        entry["cpu_ratio_longest_to_shortest"] = entry[longest]["cpu_median_s"] / entry[shortest]["cpu_median_s"]
    ours = [n for n in results if n.startswith("vstream")]
    best = {str(x): min(ours, key=lambda n: results[n][str(x)]["median_s"]) for x in lengths}
    versus = {
        name: {str(x): results[name][str(x)]["median_s"] / results[best[str(x)]][str(x)]["median_s"] for x in lengths}
        for name in results
    }
    import lightning_vstream

    return {
        "benchmark": "random_access",
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": __import__("os").cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "pyav": av.__version__,
            "ffmpeg_libavcodec": av.library_versions.get("libavcodec"),
            "opencv": getattr(peers.get("opencv"), "cv2", None) and peers["opencv"].cv2.__version__,
            "lightning_vstream": lightning_vstream.__version__,
        },
        "config": {
            **_params(args),
            "lengths_s": lengths,
            "frames_per_sample": args.frames,
            "spacing_s": args.spacing,
            "samples": args.samples,
            "warmup": args.warmup,
            "seed": args.seed,
            "tiled_lengths": [x for x in lengths if x > TILE_BASE and x % TILE_BASE == 0],
        },
        "peer_settings": {
            "vstream[gop=N]": "VideoClipDataset, decoders kept open, N GOPs at once, default FFmpeg threads (1 per "
            "decoder when N > 1)",
            "torchcodec": "VideoDecoder kept open per file, num_ffmpeg_threads=0 (automatic), seek_mode='exact', "
            "get_frames_at",
            **{name: loader.setting for name, loader in peers.items() if hasattr(loader, "setting")},
            "naive_pyav": "file opened per sample, seek per frame, FFmpeg threads automatic",
            "opencv": "VideoCapture per sample, CAP_PROP_POS_FRAMES seek per frame",
        },
        "results": results,
        "best_vstream": best,
        "peer_cost_over_vstream": versus,
        "unavailable": unavailable,
    }


def table(report: dict[str, Any]) -> str:
    cfg = report["config"]
    lengths = [str(x) for x in cfg["lengths_s"]]
    lines = [
        f"{cfg['frames_per_sample']} frames {cfg['spacing_s']:g} s apart per sample, {cfg['size'][0]}x{cfg['size'][1]} "
        f"{cfg['fps']:g} fps H.264 (GOP {cfg['gop']}), {cfg['samples']} timed samples per length; "
        f"{report['machine']['cpu_count']} CPU cores, PyAV {report['machine']['pyav']}",
        "",
        "| loader | settings | "
        + " | ".join(f"{x} s video: wall s/sample (p10-p90) | CPU s/sample" for x in lengths)
        + f" | {lengths[-1]} s / {lengths[0]} s (wall) | same, CPU time | decoded frames/sample ({lengths[0]} s) |",
        "|---|---|" + "---|---|" * len(lengths) + "---|---|---|",
    ]
    settings = report.get("peer_settings", {})
    for name, entry in report["results"].items():
        cells = [
            f"{entry[x]['median_s']:.3f} ({entry[x]['p10_s']:.3f}-{entry[x]['p90_s']:.3f}) | {entry[x]['cpu_median_s']:.3f}"
            for x in lengths
        ]
        dec = entry[lengths[0]].get("decoded_frames_per_sample")
        how = settings.get("vstream[gop=N]" if name.startswith("vstream") else name, "")
        lines.append(
            f"| {name} | {how} | "
            + " | ".join(cells)
            + f" | {entry['ratio_longest_to_shortest']:.2f} | "
            + f"{entry['cpu_ratio_longest_to_shortest']:.2f} | "
            + (f"{dec:.0f}" if dec is not None else "n/a")
            + " |"
        )
    for name, reason in report["unavailable"].items():
        lines.append(f"| {name} | not measured: {reason} |" + " |" * (2 * len(lengths) + 3))
    best = report.get("best_vstream", {})
    lines += [
        "",
        "| cost / fastest vstream's cost (wall) | "
        + " | ".join(f"{x} s ({best.get(x, 'vstream')})" for x in lengths)
        + " |",
        "|---|" + "---|" * len(lengths),
    ]
    for name, ratios in report["peer_cost_over_vstream"].items():
        lines.append(f"| {name} | " + " | ".join(f"{ratios[x]:.2f}x" for x in lengths) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path("benchmarks/results/random_access_data"),
        help="where generated videos are cached between runs",
    )
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/random_access.json"))
    parser.add_argument(
        "--lengths",
        type=lambda s: [int(v) for v in s.split(",")],
        default=None,
        help="video lengths in seconds, comma-separated (default 60,300)",
    )
    parser.add_argument("--long", action="store_true", help="also a 3000 s video")
    parser.add_argument("--quick", action="store_true", help="10 s and 30 s videos, 4 samples: a smoke run")
    parser.add_argument("--samples", type=int, default=None, help="timed samples per length (default 10)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--spacing", type=float, default=1.0, help="seconds between a sample's frames")
    parser.add_argument("--size", type=lambda s: [int(v) for v in s.lower().split("x")], default=[1280, 720])
    parser.add_argument("--fps", type=float, default=60.0)
    parser.add_argument("--gop", type=int, default=250, help="keyframe interval in frames (x264's default)")
    parser.add_argument("--crf", type=int, default=28)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prepare-only", action="store_true", help="write the videos and indexes, measure nothing")
    parser.add_argument("--skip", type=lambda s: s.split(","), default=[], help="peers to skip, e.g. opencv")
    parser.add_argument(
        "--torchcodec-python",
        default=None,
        help="interpreter of a venv where torchcodec imports (default: VSTREAM_TORCHCODEC_PYTHON, then "
        "/tmp/torchcodec-venv/bin/python), used when it does not import here",
    )
    parser.add_argument(
        "--gop-threads",
        type=lambda s: [int(v) for v in s.split(",")],
        default=[1, 2],
        help="VideoClipDataset gop_threads values to measure (default 1,2)",
    )
    args = parser.parse_args(argv)
    if args.lengths is None:
        args.lengths = [10, 30] if args.quick else [60, 300]
    if args.samples is None:
        args.samples = 4 if args.quick else 10
    if args.quick:
        args.frames = min(args.frames, 8)
    report = run(args)
    text = table(report)
    print()
    print(text)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({**report, "table": text}, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
