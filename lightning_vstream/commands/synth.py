"""``vstream synth``: write a stamped synthetic dataset (accvlab layout + index.json)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from lightning_vstream.commands.args import counts, non_negative, positive, rate, size


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write a multi-camera dataset whose every frame is stamped with its clip, camera and frame number, in the "
        "accvlab layout, with index.json and its frame tables. Progress goes to standard error: a bar on a "
        "terminal, one line per file otherwise."
    )
    parser.add_argument("root", type=Path, help="folder to write (created if missing)")
    parser.add_argument("--clips", type=positive, default=4, help="number of clips")
    parser.add_argument("--cameras", type=positive, default=6, help="cameras per clip (nuScenes names up to 6)")
    parser.add_argument("--frames", type=counts, default=40, help="frames per clip, or a comma list cycled over clips")
    parser.add_argument("--size", type=size, default="160x96", help="frame size, WIDTHxHEIGHT")
    parser.add_argument("--codec", choices=["h264", "hevc"], default="h264", help="video codec")
    parser.add_argument("--gop", type=positive, default=12, help="frames between keyframes")
    parser.add_argument("--bframes", type=non_negative, default=0, help="consecutive B-frames (0 for none)")
    parser.add_argument("--fps", type=rate, default=12.0, help="frame rate")
    parser.add_argument("--preset", default="veryfast", help="x264/x265 speed preset")
    parser.add_argument("--jobs", type=positive, default=1, help="parallel encoding processes")
    parser.add_argument(
        "--annotations",
        action="store_true",
        help="also write synthetic calibration, ego poses and boxes to ROOT/annotations",
    )
    parser.add_argument(
        "--images",
        action="store_true",
        help="write each camera as a folder of JPEG images with timestamps.txt (an image dataset, as "
        "`vstream encode` takes) instead of a video file; needs Pillow",
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help="delete a dataset already in ROOT (its index, tables, videos/ and annotations/) before writing",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress output")


def run(args: argparse.Namespace) -> int:
    from lightning_vstream.demos.synth import write_dataset

    kind = "image folders" if args.images else "videos"
    with progress_reporter(f"writing {kind}", quiet=args.quiet) as report:
        index = write_dataset(
            args.root,
            clips=args.clips,
            cameras=args.cameras,
            frames=args.frames,
            size=args.size,
            codec=args.codec,
            gop=args.gop,
            bframes=args.bframes,
            fps=args.fps,
            preset=args.preset,
            jobs=args.jobs,
            annotations=args.annotations,
            images=args.images,
            replace=args.replace,
            progress=report,
        )
    print(f"wrote {args.clips} clips x {args.cameras} cameras to {args.root}; index: {index}")
    return 0


@contextmanager
def progress_reporter(
    description: str, *, quiet: bool = False, stream: TextIO | None = None
) -> Iterator[Callable[[str, int, int], None]]:
    """A ``progress(path, done, total)`` callback: a tqdm bar on a terminal, one line per file otherwise.

    Lines (``[3/48] wrote data/videos/scene-0000/CAM_FRONT.mp4``) suit logs and CI, where a bar
    would print as one long line of carriage returns.
    """
    out = stream if stream is not None else sys.stderr
    bar: Any = None

    def report(path: str, done: int, total: int) -> None:
        nonlocal bar
        if quiet:
            return
        if not out.isatty():
            print(f"[{done}/{total}] wrote {path}", file=out, flush=True)
            return
        if bar is None:
            from tqdm import tqdm

            bar = tqdm(total=total, desc=description, unit="file", file=out)
        bar.update(1)

    try:
        yield report
    finally:
        if bar is not None:
            bar.close()
