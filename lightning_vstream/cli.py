"""The ``vstream`` command: build indexes, write stamped synthetic data, run the demo."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["main"]


def _size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {text!r} must look like WIDTHxHEIGHT, for example 1600x900.") from None
    return width, height


def _counts(text: str) -> int | list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"frames {text!r} must be a count or a comma-separated list of counts.") from None
    if any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"frames {text!r} must be positive.")
    return values[0] if len(values) == 1 else values


def _cmd_synth(args: argparse.Namespace) -> int:
    from lightning_vstream.demos.synth import write_dataset

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
    )
    print(f"wrote {args.clips} clips x {args.cameras} cameras to {args.root}; index: {index}")
    return 0


def _cmd_index(args: argparse.Namespace) -> int:
    from lightning_vstream.index import build_index, load_index

    if args.check:
        if Path(args.root).is_dir():
            raise ValueError(f"{str(args.root)!r} is a folder; --check validates an index file, e.g. "
                             f"`vstream index --check {Path(args.root) / 'index.json'}`.")
        index = load_index(args.root, check="thorough")
        print(f"{index.source}: {len(index)} clips, {len(index.camera_names)} cameras, "
              f"{index.total_frames} frames per camera: all files match.")
        return 0
    if Path(args.root).is_file():
        raise ValueError(f"{str(args.root)!r} is a file; `vstream index` scans a dataset folder. To validate an "
                         "existing index file, run `vstream index --check INDEX_FILE`.")
    output = args.output or Path(args.root) / "index.json"
    path = build_index(args.root, output=output, progress=not args.quiet, metadata=not args.no_metadata)
    index = load_index(path)
    print(f"wrote {path}: {len(index)} clips, cameras {list(index.camera_names)}, "
          f"{index.total_frames} frames per camera")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from lightning_vstream.demos.demo import run_demo

    run_demo(cache_dir=args.cache_dir, steps=args.steps, num_workers=args.num_workers)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vstream", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    synth = sub.add_parser("synth", help="write a stamped synthetic dataset (accvlab layout + index.json)")
    synth.add_argument("root", type=Path)
    synth.add_argument("--clips", type=int, default=4)
    synth.add_argument("--cameras", type=int, default=6)
    synth.add_argument("--frames", type=_counts, default=40, help="frames per clip, or a comma list cycled over clips")
    synth.add_argument("--size", type=_size, default=(160, 96), help="WIDTHxHEIGHT")
    synth.add_argument("--codec", choices=["h264", "hevc"], default="h264")
    synth.add_argument("--gop", type=int, default=12)
    synth.add_argument("--bframes", type=int, default=0)
    synth.add_argument("--fps", type=float, default=12.0)
    synth.add_argument("--preset", default="veryfast")
    synth.add_argument("--jobs", type=int, default=1, help="parallel encoding processes")
    synth.add_argument("--annotations", action="store_true",
                       help="also write synthetic calibration, ego poses and boxes to ROOT/annotations")
    synth.set_defaults(func=_cmd_synth)

    index = sub.add_parser("index", help="scan a dataset tree and write index.json (or --check an index)")
    index.add_argument("root", type=Path, help="dataset folder (or, with --check, the index file)")
    index.add_argument("-o", "--output", type=Path, default=None, help="index file to write (default ROOT/index.json)")
    index.add_argument("--no-metadata", action="store_true", help="do not write the frame-table sidecar")
    index.add_argument("--check", action="store_true", help="probe every file of an existing index and report all problems")
    index.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    index.set_defaults(func=_cmd_index)

    demo = sub.add_parser("demo", help="build a small stamped dataset and train a tiny temporal model on it")
    demo.add_argument("--cache-dir", type=Path, default=Path(".vstream_cache"))
    demo.add_argument("--steps", type=int, default=40)
    demo.add_argument("--num-workers", type=int, default=2)
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``vstream`` console script."""
    from lightning_vstream.decode.base import VideoDecodeError

    args = _parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except (ValueError, FileNotFoundError, VideoDecodeError) as err:
        print(f"vstream {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
