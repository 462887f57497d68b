"""The ``vstream`` command: build indexes, write stamped synthetic data, run the demo."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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
    )
    print(f"wrote {args.clips} clips x {args.cameras} cameras to {args.root}; index: {index}")
    return 0


def _cmd_index(args: argparse.Namespace) -> int:
    from lightning_vstream.index import build_index, load_index

    modes = [flag for flag in ("check", "quick_check", "tables") if getattr(args, flag)]
    if len(modes) > 1:
        raise ValueError(f"--{modes[0].replace('_', '-')} and --{modes[1].replace('_', '-')} cannot be combined; "
                         "pass one of them.")
    if modes:
        flag = "--" + modes[0].replace("_", "-")
        if Path(args.root).is_dir():
            raise ValueError(f"{str(args.root)!r} is a folder; {flag} works on an index file, e.g. "
                             f"`vstream index {flag} {Path(args.root) / 'index.json'}`.")
        return {"check": _check, "quick_check": _quick_check, "tables": _tables}[modes[0]](args)
    if Path(args.root).is_file():
        raise ValueError(f"{str(args.root)!r} is a file; `vstream index` scans a dataset folder. To validate an "
                         "existing index file, run `vstream index --check INDEX_FILE`.")
    output = args.output or Path(args.root) / "index.json"
    path = build_index(args.root, output=output, progress=not args.quiet, metadata=not args.no_metadata,
                       table_format=args.table_format)
    index = load_index(path)
    print(f"wrote {path}: {len(index)} clips, cameras {list(index.camera_names)}, "
          f"{index.total_frames} frames per camera")
    return 0


def _quick_check(args: argparse.Namespace) -> int:
    from lightning_vstream.index import load_index

    index = load_index(args.root, check="thorough")
    print(f"{index.source}: {len(index)} clips, {len(index.camera_names)} cameras, "
          f"{index.total_frames} frames per camera: all files match the index (quick check: frame tables trusted "
          "where size and modification time are unchanged).")
    return 0


def _check(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from lightning_vstream.index.verify import verify_index

    def bar(items: Any) -> Any:
        return tqdm(items, desc="verifying", unit="file", disable=args.quiet or len(items) < 20, file=sys.stderr)

    report = verify_index(args.root, progress=bar)
    for note in report.notes:
        print(f"note: {note}")
    if report.problems:
        listed = "\n".join(f"  {i + 1}. {p}" for i, p in enumerate(report.problems))
        print(f"vstream index --check: {report.index}: {len(report.problems)} problem(s) in {report.files} files:\n"
              f"{listed}\nRestore the files, or re-run `vstream index` if they were replaced on purpose.",
              file=sys.stderr)
        return 1
    print(f"{report.index}: {report.files} files, {report.frames} frames: every packet matches its checksum.")
    return 0


def _tables(args: argparse.Namespace) -> int:
    from lightning_vstream.index.build import write_index_tables

    written = write_index_tables(args.root, table_format=args.table_format, progress=not args.quiet)
    print(f"wrote {written}: frame tables of every file {args.root} lists; integrity checks are on.")
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
    synth.set_defaults(func=_cmd_synth)

    index = sub.add_parser("index", help="scan a dataset tree and write index.json (or --check an index)")
    index.add_argument("root", type=Path, help="dataset folder (or, with --check/--quick-check/--tables, the index file)")
    index.add_argument("-o", "--output", type=Path, default=None, help="index file to write (default ROOT/index.json)")
    index.add_argument("--no-metadata", action="store_true", help="do not write the frame tables")
    index.add_argument("--table-format", choices=["binary", "json"], default="binary",
                       help="frame tables as index.tables.bin (memory-mapped, default) or index.meta.json")
    index.add_argument("--check", action="store_true",
                       help="re-read every packet of an existing index's files, verify checksums and fingerprints, "
                            "list every problem; exit 1 on any")
    index.add_argument("--quick-check", action="store_true",
                       help="compare an existing index with its files using the stored frame tables (fast)")
    index.add_argument("--tables", action="store_true",
                       help="write the frame tables of an existing index's files (turns integrity checks on)")
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
