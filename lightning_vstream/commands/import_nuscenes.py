"""``vstream import-nuscenes``: the nuScenes tables and camera JPEGs -> videos, index and annotations."""

from __future__ import annotations

import argparse
from pathlib import Path

from lightning_vstream.commands.args import encode_options, encode_summary, existing


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Import a dataset in the nuScenes layout (DATAROOT/VERSION/*.json, samples/, sweeps/) into one "
        "video per scene and camera (sample_data timestamps kept), OUT_DIR/index.json and per-scene annotation "
        "files in OUT_DIR/annotations/."
    )
    parser.add_argument("dataroot", type=Path, help="folder holding VERSION/, samples/ and sweeps/")
    parser.add_argument("out_dir", type=Path, help="output folder: videos/, index.json, annotations/")
    parser.add_argument(
        "--dataset-version",
        metavar="VERSION",
        default="v1.0-mini",
        help="the nuScenes release to import: its table folder in DATAROOT, e.g. v1.0-mini or v1.0-trainval",
    )
    parser.add_argument("--scenes", nargs="+", default=None, help="scene names to import (default: all)")
    parser.add_argument("--cameras", nargs="+", default=None, help="camera channels (default: the six CAM_*)")
    parser.add_argument("--key-frames-only", action="store_true", help="only the annotated key frames (2 Hz)")
    encode_options(parser)
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from lightning_vstream.encode import EncodeSettings
    from lightning_vstream.importers import import_nuscenes

    existing(args.dataroot, "nuScenes data root", hint="Give the folder that holds VERSION/, samples/ and sweeps/.")
    settings = EncodeSettings(
        codec=args.codec,
        gop=args.gop,
        bframes=args.bframes,
        crf=args.crf,
        bitrate=args.bitrate,
        preset=args.preset,
        keyframe_stride=args.keyframe_stride,
    )
    result = import_nuscenes(
        args.dataroot,
        args.out_dir,
        version=args.dataset_version,
        scenes=args.scenes,
        cameras=args.cameras,
        key_frames_only=args.key_frames_only,
        settings=settings,
        jobs=args.jobs,
        executor=args.executor,
        threads=args.threads,
        progress=not args.quiet,
    )
    print(
        f"wrote {result.index} and {result.annotations}/: {len(result.scenes)} scenes, {result.frames} frames per "
        f"camera ({result.key_frames} key frames); {encode_summary(result.encode)}; "
        + (
            f"keyframe stride {result.keyframe_stride} (every {result.keyframe_stride}th frame a reference picture; "
            f"{result.key_frames_on_stride} of {result.key_frames} key frames on the stride)"
            if result.keyframe_stride > 1
            else "keyframe stride 1 (the usual layout)"
        )
    )
    return 0
