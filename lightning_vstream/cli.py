"""The ``vstream`` command: build indexes, write stamped synthetic data, run the demo.

Exit codes: 0 on success, 1 when the command ran and failed (a bad index, an unreadable file),
2 for a usage error (unknown option, malformed value), as argparse reports them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lightning_vstream.errors import ConfigurationError

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
        raise argparse.ArgumentTypeError(
            f"frames {text!r} must be a count or a comma-separated list of counts."
        ) from None
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

    modes = [flag for flag in ("check", "quick_check", "tables") if getattr(args, flag)]
    if len(modes) > 1:
        raise ConfigurationError(
            f"--{modes[0].replace('_', '-')} and --{modes[1].replace('_', '-')} cannot be combined; pass one of them."
        )
    from lightning_vstream.storage.urls import is_url

    if is_url(args.root):
        return _remote_index(args, modes[0] if modes else None)
    if modes:
        flag = "--" + modes[0].replace("_", "-")
        if Path(args.root).is_dir():
            raise ConfigurationError(
                f"{str(args.root)!r} is a folder; {flag} works on an index file, e.g. "
                f"`vstream index {flag} {Path(args.root) / 'index.json'}`."
            )
        return {"check": _check, "quick_check": _quick_check, "tables": _tables}[modes[0]](args)
    if Path(args.root).is_file():
        raise ConfigurationError(
            f"{str(args.root)!r} is a file; `vstream index` scans a dataset folder. To validate an "
            "existing index file, run `vstream index --check INDEX_FILE`."
        )
    output = args.output or Path(args.root) / "index.json"
    path = build_index(
        args.root, output=output, progress=not args.quiet, metadata=not args.no_metadata, table_format=args.table_format
    )
    index = load_index(path)
    print(
        f"wrote {path}: {len(index)} clips, cameras {list(index.camera_names)}, {index.total_frames} frames per camera"
    )
    return 0


def _storage_options(pairs: Sequence[str]) -> dict[str, Any]:
    """``--storage-option KEY=VALUE`` pairs as a dict (values read as JSON where they parse: true, 30, ...)."""
    import json

    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigurationError(
                f"--storage-option {pair!r} must look like KEY=VALUE, e.g. endpoint=http://host:9000."
            )
        if value.lower() in ("true", "false"):
            options[key] = value.lower() == "true"
            continue
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def _remote_index(args: argparse.Namespace, mode: str | None) -> int:
    """``vstream index`` on a URL: build in place, --check, --quick-check or --tables (see docs/remote.md)."""
    from tqdm import tqdm

    from lightning_vstream.index import load_index
    from lightning_vstream.index.remote import build_remote_index, verify_remote_index, write_remote_index_tables
    from lightning_vstream.storage.options import StorageConfig

    options = _storage_options(args.storage_option)
    config = StorageConfig.make(options)

    def bar(items: Any) -> Any:
        return tqdm(items, desc="reading", unit="file", disable=args.quiet, file=sys.stderr)

    if mode == "check":
        report = verify_remote_index(args.root, storage=config, progress=bar)
        if report.problems:
            listed = "\n".join(f"  {i + 1}. {p}" for i, p in enumerate(report.problems))
            print(
                f"vstream index --check: {report.index}: {len(report.problems)} problem(s) in {report.files} files:\n"
                f"{listed}\nRestore the files, or re-run `vstream index` if they were replaced on purpose.",
                file=sys.stderr,
            )
            return 1
        print(f"{report.index}: {report.files} files, {report.frames} frames: every packet matches its checksum.")
        return 0
    if mode == "quick_check":
        index = load_index(args.root, check="thorough", storage_options=options)
        print(
            f"{index.source}: {len(index)} clips, {len(index.camera_names)} cameras, {index.total_frames} frames per "
            "camera: every file's size and ETag match the index (quick check)."
        )
        return 0
    if mode == "tables":
        written = write_remote_index_tables(args.root, storage=config, progress=bar)
        print(f"wrote {written}: frame tables of every file {args.root} lists; integrity checks are on.")
        return 0
    path = build_remote_index(args.root, output=args.output, storage=config, progress=bar)
    index = load_index(path, storage_options=options)
    print(
        f"wrote {path}: {len(index)} clips, cameras {list(index.camera_names)}, {index.total_frames} frames per camera"
    )
    return 0


def _quick_check(args: argparse.Namespace) -> int:
    from lightning_vstream.index import load_index

    index = load_index(args.root, check="thorough")
    print(
        f"{index.source}: {len(index)} clips, {len(index.camera_names)} cameras, "
        f"{index.total_frames} frames per camera: all files match the index (quick check: frame tables trusted "
        "where size and modification time are unchanged)."
    )
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
        print(
            f"vstream index --check: {report.index}: {len(report.problems)} problem(s) in {report.files} files:\n"
            f"{listed}\nRestore the files, or re-run `vstream index` if they were replaced on purpose.",
            file=sys.stderr,
        )
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


def _cmd_encode(args: argparse.Namespace) -> int:
    from lightning_vstream.encode import encode_index

    summary = encode_index(
        args.src_index,
        args.out_dir,
        codec=args.codec,
        gop=args.gop,
        bframes=args.bframes,
        crf=args.crf,
        bitrate=args.bitrate,
        preset=args.preset,
        cameras=args.cameras,
        jobs=args.jobs,
        progress=not args.quiet,
    )
    print(
        f"wrote {summary.index}: {summary.files_encoded} files encoded ({summary.frames_encoded} frames, "
        f"{summary.frames_per_second:.1f} frames/s, {summary.size_ratio:.3f} x source size), "
        f"{summary.files_skipped} already done"
    )
    return 0


def _cmd_import_nuscenes(args: argparse.Namespace) -> int:
    from lightning_vstream.encode import EncodeSettings
    from lightning_vstream.importers import import_nuscenes

    settings = EncodeSettings(
        codec=args.codec, gop=args.gop, bframes=args.bframes, crf=args.crf, bitrate=args.bitrate, preset=args.preset
    )
    result = import_nuscenes(
        args.dataroot,
        args.out_dir,
        version=args.version,
        scenes=args.scenes,
        cameras=args.cameras,
        key_frames_only=args.key_frames_only,
        settings=settings,
        jobs=args.jobs,
        progress=not args.quiet,
    )
    enc = result.encode
    print(
        f"wrote {result.index} and {result.annotations}/: {len(result.scenes)} scenes, {result.frames} frames per "
        f"camera ({result.key_frames} key frames); {enc.files_encoded} videos encoded "
        f"({enc.frames_per_second:.1f} frames/s, {enc.size_ratio:.3f} x JPEG size), {enc.files_skipped} already done"
    )
    return 0


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer.") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1.")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer.") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more.")
    return value


def _crf(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer.") from None
    if not 0 <= value <= 51:
        raise argparse.ArgumentTypeError(f"{text!r} must be from 0 (lossless) to 51.")
    return value


def _version() -> str:
    from lightning_vstream import __version__

    return f"vstream (lightning_vstream) {__version__}"


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows each option's default, and descriptions as written."""


_DESCRIPTION = """Frame-exact video loading for PyTorch Lightning: build and check indexes, encode image
datasets to video, import nuScenes, write stamped synthetic data, run the end-to-end demo.
'vstream COMMAND --help' describes each command.

exit codes: 0 success, 1 the command failed, 2 usage error"""


def _encode_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--codec", choices=["hevc", "h264"], default="hevc", help="video codec")
    parser.add_argument("--gop", type=_positive, default=12, help="frames between keyframes")
    parser.add_argument("--bframes", type=_non_negative, default=0, help="consecutive B-frames (0 for none)")
    rate = parser.add_mutually_exclusive_group()
    rate.add_argument(
        "--crf", type=_crf, default=None, help="constant quality 0..51; None: the codec's own, 28 (hevc) or 23 (h264)"
    )
    rate.add_argument(
        "--bitrate", default=None, help="target bit rate instead of --crf, e.g. 4M or 800k; None: use --crf"
    )
    parser.add_argument("--preset", default="fast", help="x264/x265 speed preset (ultrafast .. veryslow)")
    parser.add_argument("--jobs", type=_positive, default=1, help="files encoded in parallel (processes)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vstream", description=_DESCRIPTION, formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    synth = sub.add_parser(
        "synth",
        help="write a stamped synthetic dataset (accvlab layout + index.json)",
        description="Write a multi-camera dataset whose every frame is stamped with its clip, camera and frame "
        "number, in the accvlab layout, with index.json and its frame tables.",
        formatter_class=_HelpFormatter,
    )
    synth.add_argument("root", type=Path, help="folder to write (created if missing)")
    synth.add_argument("--clips", type=_positive, default=4, help="number of clips")
    synth.add_argument("--cameras", type=_positive, default=6, help="cameras per clip (nuScenes names up to 6)")
    synth.add_argument("--frames", type=_counts, default=40, help="frames per clip, or a comma list cycled over clips")
    synth.add_argument("--size", type=_size, default=(160, 96), help="frame size, WIDTHxHEIGHT")
    synth.add_argument("--codec", choices=["h264", "hevc"], default="h264", help="video codec")
    synth.add_argument("--gop", type=_positive, default=12, help="frames between keyframes")
    synth.add_argument("--bframes", type=_non_negative, default=0, help="consecutive B-frames (0 for none)")
    synth.add_argument("--fps", type=float, default=12.0, help="frame rate")
    synth.add_argument("--preset", default="veryfast", help="x264/x265 speed preset")
    synth.add_argument("--jobs", type=_positive, default=1, help="parallel encoding processes")
    synth.add_argument(
        "--annotations",
        action="store_true",
        help="also write synthetic calibration, ego poses and boxes to ROOT/annotations",
    )
    synth.set_defaults(func=_cmd_synth)

    index = sub.add_parser(
        "index",
        help="scan a dataset tree and write index.json (or --check an index)",
        description="Find clip folders under ROOT, probe every camera file and write an accvlab index plus its "
        "frame tables; or, with --check, verify an existing index file against the files.",
        formatter_class=_HelpFormatter,
    )
    index.add_argument(
        "root",
        type=str,  # a URL (s3://bucket/ds) must stay a string
        help="dataset folder or URL (or, with --check/--quick-check/--tables, the index file or its URL)",
    )
    index.add_argument("-o", "--output", type=str, default=None, help="index file to write (default ROOT/index.json)")
    index.add_argument("--no-metadata", action="store_true", help="do not write the frame tables")
    index.add_argument(
        "--table-format",
        choices=["binary", "json"],
        default="binary",
        help="frame tables as index.tables.bin (memory-mapped, default) or index.meta.json",
    )
    index.add_argument(
        "--check",
        action="store_true",
        help="re-read every packet of an existing index's files, verify checksums and fingerprints, "
        "list every problem; exit 1 on any",
    )
    index.add_argument(
        "--quick-check",
        action="store_true",
        help="compare an existing index with its files using the stored frame tables (fast)",
    )
    index.add_argument(
        "--tables",
        action="store_true",
        help="write the frame tables of an existing index's files (turns integrity checks on)",
    )
    index.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    index.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="for URLs: a storage option (endpoint, region, anonymous=true...; see docs/remote.md), repeatable; "
        "credentials come from the provider's environment",
    )
    index.set_defaults(func=_cmd_index)

    encode = sub.add_parser(
        "encode",
        help="transcode an index (image folders or videos) to one video per camera",
        description="Transcode every camera of every clip of SRC_INDEX (image folders, videos, or both) into "
        "OUT_DIR/videos/<clip>/<camera>.mp4 and write OUT_DIR/index.json. Every frame keeps its source time; "
        "files already done are skipped when run again.",
        formatter_class=_HelpFormatter,
    )
    encode.add_argument("src_index", type=Path, help="index of the source dataset")
    encode.add_argument("out_dir", type=Path, help="output folder: videos/<clip>/<camera>.mp4 and index.json")
    _encode_options(encode)
    encode.add_argument("--cameras", nargs="+", default=None, help="encode only these cameras; None: all")
    encode.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    encode.set_defaults(func=_cmd_encode)

    nusc = sub.add_parser(
        "import-nuscenes",
        help="nuScenes tables + camera JPEGs -> videos, index and annotations",
        description="Import a dataset in the nuScenes layout (DATAROOT/VERSION/*.json, samples/, sweeps/) into one "
        "video per scene and camera (sample_data timestamps kept), OUT_DIR/index.json and per-scene annotation "
        "files in OUT_DIR/annotations/.",
        formatter_class=_HelpFormatter,
    )
    nusc.add_argument("dataroot", type=Path, help="folder holding VERSION/, samples/ and sweeps/")
    nusc.add_argument("out_dir", type=Path, help="output folder: videos/, index.json, annotations/")
    nusc.add_argument("--version", default="v1.0-mini", help="table folder, e.g. v1.0-mini or v1.0-trainval")
    nusc.add_argument("--scenes", nargs="+", default=None, help="scene names to import; None: all")
    nusc.add_argument("--cameras", nargs="+", default=None, help="camera channels; None: the six CAM_*")
    nusc.add_argument("--key-frames-only", action="store_true", help="only the annotated key frames (2 Hz)")
    _encode_options(nusc)
    nusc.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    nusc.set_defaults(func=_cmd_import_nuscenes)

    demo = sub.add_parser(
        "demo",
        help="build a small stamped dataset and train a tiny temporal model on it",
        description="Build (once, cached) a small stamped 6-camera dataset, train a tiny temporal model on it with "
        "the throughput and temporal-reset callbacks, check every delivered frame's stamp and print frames/sec.",
        formatter_class=_HelpFormatter,
    )
    demo.add_argument("--cache-dir", type=Path, default=Path(".vstream_cache"), help="where the dataset is cached")
    demo.add_argument("--steps", type=_positive, default=40, help="training steps")
    demo.add_argument("--num-workers", type=_non_negative, default=2, help="decoding worker processes")
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``vstream`` console script.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit code: 0 on success, 1 when the command failed. Usage errors exit with 2 through
        ``SystemExit``, as argparse does.

    Example::

        >>> main(["synth", "data", "--clips", "2"])  # doctest: +SKIP
        0
    """
    from lightning_vstream.errors import VStreamError

    args = _parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except PermissionError as err:
        where = f" {str(err.filename)!r}" if err.filename else ""
        print(
            f"vstream {args.command}: error: permission denied{where}: check the file's owner and mode, "
            "or run as a user who may read (and, for outputs, write) it.",
            file=sys.stderr,
        )
    except FileNotFoundError as err:
        message = str(err) if err.filename is None else f"{str(err.filename)!r} does not exist."
        print(f"vstream {args.command}: error: {message}", file=sys.stderr)
    except (VStreamError, ValueError, OSError) as err:
        print(f"vstream {args.command}: error: {err}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"vstream {args.command}: interrupted.", file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
