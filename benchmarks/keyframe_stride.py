"""What the stride layout (``vstream encode --keyframe-stride N``) costs and saves, against the usual encode.

Writes ``--cameras`` camera streams of ``--frames`` frames of camera-like synthetic content (sky,
road, moving boxes, moving multi-scale texture, sensor noise; the same generator as
``benchmarks/encode.py``) as a lossless source, then encodes each with :func:`encode_sources` in
every ``--config`` (default: the usual IPPP layout of ``vstream encode``, H.265 GOP 12, as the
baseline; the stride layout at 6; the same for H.264) and measures, per encode:

- **size**: bytes over the baseline's;
- **stride N** (1, 2, 3, 6): CPU time per delivered frame reading every N-th frame of each file
  from frame 0, feeding the decoder every packet up to the last wanted one (``all``: what the
  readers fed before they left pictures out) and what :func:`~lightning_vstream.decode.gops.plan_feed`
  plans from the frame tables' reference codes (``planned``: wanted pictures and their references
  only, what every reader of the package now feeds), with decoded / delivered;
- **random access**: ``--samples`` single frames at random places, each decoded from its GOP's
  keyframe with a fresh decoder, all packets and planned: CPU time and frames decoded per frame.

Decoding is a bare PyAV codec context fed packets from memory in decode order (as the GOP
readers feed it), one thread, frames converted to nothing (``thread_count=1``, CPU time of the
process). Every figure is the median of ``--repeats`` runs, after one warm-up, with min and max;
each run goes through every read of every encode in turn, so a change of machine load spreads
over all of them. The headline figures are ratios to the baseline measured in the same run. Every delivered frame
is compared with the full decode of its file before anything is timed. A table goes to stdout,
everything to ``--output`` (JSON).

Example::

    python benchmarks/keyframe_stride.py --output keyframe_stride.json
    python benchmarks/keyframe_stride.py --size 1600x900 --frames 96 --cameras 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA = "lightning_vstream.bench.keyframe_stride/1"
DEFAULT_CONFIGS = (
    '{"codec": "hevc"}',
    '{"codec": "hevc", "keyframe_stride": 6}',
    '{"codec": "h264"}',
    '{"codec": "h264", "keyframe_stride": 6}',
)
STRIDES = (1, 2, 3, 6)


def summarize(values: Sequence[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": list(values)}


def write_sources(root: Path, cameras: int, frames: int, size: tuple[int, int], *, seed: int = 0) -> list[Path]:
    """Lossless camera videos (x264 qp 0) of the camera-like content ``benchmarks/encode.py`` draws.

    Camera ``k`` draws from seed ``seed + k``, so clips written with seeds ``cameras`` apart differ.
    """
    import av
    from encode import _frame, _texture  # benchmarks/encode.py, beside this script

    width, height = size
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(cameras):
        path = root / f"CAM_{k}.mkv"
        rng = np.random.default_rng(seed + k)
        texture = _texture(width, height, seed + k)
        with av.open(str(path), mode="w") as out:
            stream = out.add_stream("libx264", rate=12, options={"qp": "0", "preset": "ultrafast"})
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv444p"
            for i in range(frames):
                frame = av.VideoFrame.from_ndarray(_frame(width, height, i, rng, texture), format="rgb24")
                frame.pts = i
                for packet in stream.encode(frame):
                    out.mux(packet)
            for packet in stream.encode():
                out.mux(packet)
        paths.append(path)
    return paths


class Stream:
    """One encoded file's packets in memory (decode order) and its frame table."""

    def __init__(self, path: Path) -> None:
        import av

        from lightning_vstream.decode.cpu.probe import probe_video

        self.info = probe_video(path)
        with av.open(str(path)) as container:
            video = container.streams.video[0]
            self.packets = {self.info.index_of_pts(p.pts): (bytes(p), p.pts) for p in container.demux(video) if p.size}
        layout = self.info.layout
        assert layout is not None
        self.order = sorted(range(self.info.frame_count), key=layout.pos.__getitem__)
        self.rank = {f: r for r, f in enumerate(self.order)}
        self.start = [self.rank[k] for k in self.info.key_indices]

    def feed(self, wanted: Sequence[int], *, planned: bool, gop: int = 0) -> tuple[int, ...]:
        from lightning_vstream.decode.gops import plan_feed

        references = self.info.references if planned else None
        return plan_feed(order=self.order[self.start[gop] :], wanted=wanted, references=references)

    def decode(self, feed: Sequence[int], keep: bool = False) -> dict[int, bytes]:
        import av

        ctx = av.CodecContext.create(self.info.codec, "r")
        layout = self.info.layout
        assert layout is not None
        ctx.extradata = layout.extradata
        ctx.thread_count = 1
        base = Fraction(*self.info.time_base)
        out: dict[int, bytes] = {}
        for f in [*feed, None]:
            if f is None:
                frames = ctx.decode(None)
            else:
                packet = av.Packet(self.packets[f][0])
                packet.pts, packet.time_base = self.packets[f][1], base
                frames = ctx.decode(packet)
            for frame in frames:
                if keep:
                    out[self.info.index_of_pts(frame.pts)] = frame.to_ndarray().tobytes()  # type: ignore[index]
        return out


def _cpu(run: Any) -> float:
    start = time.process_time()
    run()
    return time.process_time() - start


def reads(streams: list[Stream], samples: list[list[tuple[int, int]]]) -> dict[str, tuple[list[Any], int]]:
    """Every read measured, ``name -> ([(stream, packets to feed)], frames delivered)``: each stride from frame 0
    and the random single frames, every packet fed (``all``) and as planned."""
    out: dict[str, tuple[list[Any], int]] = {}
    for planned in (False, True):
        how = "planned" if planned else "all"
        for stride in STRIDES:
            feeds = [(s, s.feed(range(0, s.info.frame_count, stride), planned=planned)) for s in streams]
            out[f"stride {stride}/{how}"] = (feeds, sum(len(range(0, s.info.frame_count, stride)) for s in streams))
        feeds = [(s, s.feed([f], planned=planned, gop=g)) for s, picks in zip(streams, samples) for g, f in picks]
        out[f"random/{how}"] = (feeds, len(feeds))
    return out


def measure(rows: list[dict[str, Any]], repeats: int) -> None:
    """CPU ms per delivered frame of every read of every row, the rows and reads interleaved in each repeat
    (so a change of machine load spreads over all of them), after one warm-up pass."""
    times: dict[tuple[int, str], list[float]] = {}
    for repeat in range(repeats + 1):
        for n, row in enumerate(rows):
            for name, (feeds, delivered) in row["reads"].items():
                seconds = _cpu(lambda feeds=feeds: [s.decode(f) for s, f in feeds])
                if repeat:
                    times.setdefault((n, name), []).append(1000 * seconds / delivered)
    for n, row in enumerate(rows):
        row["measured"] = {
            name: {
                "cpu_ms_per_frame": summarize(times[(n, name)]),
                "decoded_per_delivered": sum(len(f) for _, f in feeds) / delivered,
            }
            for name, (feeds, delivered) in row.pop("reads").items()
        }


def check(streams: list[Stream], samples: list[list[tuple[int, int]]]) -> None:
    """Every frame a planned read delivers equals the full decode of its file (untimed)."""
    for s, picks in zip(streams, samples):
        full = s.decode(s.order, keep=True)
        for stride in STRIDES:
            wanted = range(0, s.info.frame_count, stride)
            got = s.decode(s.feed(wanted, planned=True), keep=True)
            assert all(got[f] == full[f] for f in wanted), f"stride {stride}: a frame differs from the full decode"
        for gop, frame in picks:
            assert s.decode(s.feed([frame], planned=True, gop=gop), keep=True)[frame] == full[frame]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cameras", type=int, default=2)
    parser.add_argument("--frames", type=int, default=72)
    parser.add_argument("--size", default="800x450", help="WIDTHxHEIGHT")
    parser.add_argument("--samples", type=int, default=24, help="random single frames per camera")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--config", action="append", default=None, help="JSON keyword arguments of EncodeSettings")
    parser.add_argument("--output", type=Path, default=Path("keyframe_stride.json"))
    args = parser.parse_args()
    from lightning_vstream.encode import CameraSource, EncodeSettings, encode_sources

    width, height = (int(v) for v in args.size.lower().split("x"))
    configs = [json.loads(c) for c in (args.config or DEFAULT_CONFIGS)]
    work = Path(tempfile.mkdtemp(prefix="vstream_stride_bench_"))
    rows = []
    try:
        sources = write_sources(work / "src", args.cameras, args.frames, (width, height))
        for n, config in enumerate(configs):
            settings = EncodeSettings(**config)
            out = work / f"out_{n}"
            start = time.perf_counter()
            summary = encode_sources(
                [CameraSource("clip", p.stem, p) for p in sources], out, settings=settings, progress=False
            )
            seconds = time.perf_counter() - start
            streams = [Stream(p) for p in sorted((out / "videos" / "clip").glob("*.mp4"))]
            rng = random.Random(n)
            samples = [
                [(s.info.gop_of(f), f) for f in rng.sample(range(s.info.frame_count), args.samples)] for s in streams
            ]
            check(streams, samples)
            rows.append(
                {
                    "config": config,
                    "bytes": summary.output_bytes,
                    "encode_fps": summary.frames_encoded / seconds,
                    "reads": reads(streams, samples),
                }
            )
        measure(rows, args.repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(rows, args, (width, height))


def report(rows: list[dict[str, Any]], args: argparse.Namespace, size: tuple[int, int]) -> None:
    baselines = {row["config"]["codec"]: row for row in rows if row["config"].get("keyframe_stride", 1) == 1}
    print(
        f"{args.cameras} cameras x {args.frames} frames at {size[0]}x{size[1]}, 1 decoding thread, CPU time; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}. Median of {args.repeats} (min-max)."
    )
    print(
        f"{'config':<40} {'size':>6} {'read at':>8} {'all ms/f':>15} {'planned ms/f':>15} "
        f"{'dec/del all':>14} {'planned':>8} {'planned/base':>13}"
    )
    for row in rows:
        base = baselines.get(row["config"]["codec"], row)
        size_ratio = row["bytes"] / base["bytes"]
        m, b = row["measured"], base["measured"]
        names = [*(f"stride {s}" for s in STRIDES), "random"]
        for i, (name, every, planned, baseline) in enumerate(
            (name, m[f"{name}/all"], m[f"{name}/planned"], b[f"{name}/all"]) for name in names
        ):
            t, p = every["cpu_ms_per_frame"], planned["cpu_ms_per_frame"]
            label = json.dumps(row["config"]) if i == 0 else ""
            ratio = f"{p['median'] / baseline['cpu_ms_per_frame']['median']:.2f}x"
            print(
                f"{label:<40} {(f'{size_ratio:.2f}x' if i == 0 else ''):>6} {name:>8} "
                f"{t['median']:>6.2f} ({t['min']:.2f}-{t['max']:.2f}) {p['median']:>6.2f} ({p['min']:.2f}-{p['max']:.2f}) "
                f"{every['decoded_per_delivered']:>14.2f} {planned['decoded_per_delivered']:>8.2f} {ratio:>13}"
            )
    result = {
        "schema": SCHEMA,
        "machine": {
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg()[0],
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "data": {"cameras": args.cameras, "frames": args.frames, "size": list(size), "samples": args.samples},
        "rows": rows,
    }
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
