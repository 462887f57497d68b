"""``vstream encode``: transcode an index (image folders or videos) to one video per camera."""

from __future__ import annotations

import argparse
from pathlib import Path

from lightning_vstream.commands.args import encode_options, encode_summary, existing


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Transcode every camera of every clip of SRC_INDEX (image folders, videos, or both) into "
        "OUT_DIR/videos/<clip>/<camera>.mp4 and write OUT_DIR/index.json. Every frame keeps its source time; "
        "files already done are skipped when run again."
    )
    parser.add_argument("src_index", type=Path, help="index of the source dataset")
    parser.add_argument("out_dir", type=Path, help="output folder: videos/<clip>/<camera>.mp4 and index.json")
    encode_options(parser)
    parser.add_argument("--cameras", nargs="+", default=None, help="encode only these cameras (default: all)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from lightning_vstream.encode import encode_index

    existing(
        args.src_index,
        "source index",
        hint="Write one with `vstream index SOURCE_FOLDER` (image folders or videos, one folder per clip).",
    )
    summary = encode_index(
        args.src_index,
        args.out_dir,
        codec=args.codec,
        gop=args.gop,
        bframes=args.bframes,
        crf=args.crf,
        bitrate=args.bitrate,
        preset=args.preset,
        keyframe_stride=args.keyframe_stride,
        cameras=args.cameras,
        jobs=args.jobs,
        executor=args.executor,
        threads=args.threads,
        progress=not args.quiet,
    )
    print(f"wrote {summary.index}: {encode_summary(summary)}")
    return 0
