"""``vstream index``: scan a dataset tree and write its index, or check an existing index."""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_vstream.commands.args import existing
from lightning_vstream.errors import ConfigurationError, VStreamWarning

if TYPE_CHECKING:
    from lightning_vstream.indexing.verify import VerifyReport

#: Incomplete clips printed by name; the file lists them all.
_SHOWN = 20
_MISSING_INDEX = (
    "Run `vstream index DATASET_FOLDER` to index your videos, or `vstream synth FOLDER` for a stamped dataset."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Find clip folders under ROOT, probe every camera file and write an accvlab index plus its "
        "frame tables; or, with --check, verify an existing index file against the files. Clips that are "
        "not whole (a camera file missing, or not a readable video) are left out of the index and listed, "
        "with the reason, in INDEX.incomplete.json next to it (--strict refuses them instead)."
    )
    parser.add_argument(
        "root",
        type=str,  # a URL (s3://bucket/ds) must stay a string
        help="dataset folder or URL (or, with --check/--quick-check/--tables, the index file or its URL)",
    )
    parser.add_argument("-o", "--output", type=str, default=None, help="index file to write (default: ROOT/index.json)")
    parser.add_argument("--no-metadata", action="store_true", help="do not write the frame tables")
    parser.add_argument(
        "--table-format",
        choices=["binary", "json"],
        default="binary",
        help="frame tables as index.tables.bin (memory-mapped, the one format written; 'json' is refused: "
        "index.meta.json files of earlier releases are still read)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="re-read every packet of an existing index's files, verify checksums and fingerprints, "
        "list every problem; exit 1 on any",
    )
    parser.add_argument(
        "--quick-check",
        action="store_true",
        help="compare an existing index with its files using the stored frame tables (fast); exit 1 on any problem",
    )
    parser.add_argument(
        "--tables",
        action="store_true",
        help="write the frame tables of an existing index's files (turns integrity checks on)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="refuse a dataset with incomplete clips (a camera file missing or unreadable) instead of indexing "
        "the whole clips and listing the others in INDEX.incomplete.json",
    )
    parser.add_argument(
        "--shorten-truncated",
        action="store_true",
        help="keep a clip with a camera file cut short at the frames every camera holds whole, instead of "
        "leaving it out as incomplete",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace an existing file at the output (or its tables) that is not an index written by vstream "
        "index; an output inside a clip folder is refused even so",
    )
    parser.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="where files are probed: local processes (--jobs) or Ray tasks (the cluster at RAY_ADDRESS, or a "
        "local one); the index is the same",
    )
    parser.add_argument("-j", "--jobs", type=int, default=1, help="local probing processes (default: 1)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    parser.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="for URLs: a storage option (endpoint, region, anonymous=true...; see docs/remote.md), repeatable; "
        "credentials come from the provider's environment",
    )


def run(args: argparse.Namespace) -> int:
    from lightning_vstream.indexing import build_index, load_index
    from lightning_vstream.indexing.output import incomplete_path

    modes = [flag for flag in ("check", "quick_check", "tables") if getattr(args, flag)]
    if len(modes) > 1:
        raise ConfigurationError(
            f"--{modes[0].replace('_', '-')} and --{modes[1].replace('_', '-')} cannot be combined; pass one of them."
        )
    from lightning_vstream.storage.urls import is_url

    if is_url(args.root):
        return _remote_index(args, modes[0] if modes else None)
    root = Path(args.root)
    if args.storage_option:
        raise ConfigurationError(
            f"--storage-option applies to URLs (s3://, gs://, https://...); {args.root!r} is a local path. Leave the "
            "option out, or pass the dataset's URL."
        )
    if modes:
        flag = "--" + modes[0].replace("_", "-")
        if root.is_dir():
            hint = (
                f"`vstream index {flag} {root / 'index.json'}`"
                if (root / "index.json").is_file()
                else f"`vstream index {root}` first writes {root / 'index.json'}"
            )
            raise ConfigurationError(f"{str(root)!r} is a folder; {flag} works on an index file, e.g. {hint}.")
        existing(root, "index file", hint=_MISSING_INDEX)
        return {"check": _check, "quick_check": _quick_check, "tables": _tables}[modes[0]](args)
    if root.is_file():
        raise ConfigurationError(
            f"{str(root)!r} is a file; `vstream index` scans a dataset folder. To validate an "
            "existing index file, run `vstream index --check INDEX_FILE`."
        )
    existing(root, "dataset folder", hint="Give the folder that holds your clip folders (one folder per clip).")
    output = Path(args.output) if args.output else root / "index.json"
    with warnings.catch_warnings():
        # Incomplete clips are said below, in words, with the file that lists them.
        warnings.simplefilter("ignore", VStreamWarning)
        path = build_index(
            root,
            output=output,
            progress=not args.quiet,
            metadata=not args.no_metadata,
            table_format=args.table_format,
            incomplete="raise" if args.strict else "skip",
            truncated="shorten" if args.shorten_truncated else "incomplete",
            force=args.force,
            executor=args.executor,
            workers=args.jobs,
        )
        # Asked for with --no-metadata: said once below, in words, rather than as a warning.
        index = load_index(path)
    print(
        f"wrote {path}: {len(index)} clips, cameras {list(index.camera_names)}, {index.total_frames} frames per camera"
    )
    print_incomplete(incomplete_path(path))
    print_not_indexed(path, root=args.root)
    if args.no_metadata:
        print(
            "note: no frame tables (--no-metadata), so integrity checks are off for these files; "
            f"`vstream index --tables {path}` writes them."
        )
    return 0


def print_not_indexed(index: Path | str, *, root: str | None = None) -> None:
    """Print the camera files the build of ``index`` left out because the other clips lack their camera."""
    from lightning_vstream.index import tables_path
    from lightning_vstream.index.table_file import FrameTables
    from lightning_vstream.indexing.build import not_indexed_note

    tables = tables_path(index)
    if not tables.is_file():
        return
    left = sorted(FrameTables(tables).not_indexed)
    if not left:
        return
    folder = root if root is not None else str(Path(index).parent)
    print(
        f"note: {not_indexed_note(folder, index, left)} To index them, give every clip those cameras and run "
        f"`vstream index {folder}` again; or move the files out of their clip folders."
    )


def print_incomplete(listing: str, *, read: Callable[[str], bytes | None] | None = None) -> None:
    """Print the clips an index build left out, from the list it wrote (nothing when there is none)."""
    import json

    if read is None:
        file = Path(listing)
        raw = file.read_bytes() if file.is_file() else None
    else:
        raw = read(listing)
    if raw is None:
        return
    clips = [(clip_id, reasons) for entries in json.loads(raw).values() for clip_id, reasons in entries.items()]
    if not clips:
        return
    print(f"left out {len(clips)} incomplete clip(s), listed in {listing}:")
    for clip_id, reasons in clips[:_SHOWN]:
        print(f"  {clip_id}: {'; '.join(reasons)}")
    if len(clips) > _SHOWN:
        print(f"  ... and {len(clips) - _SHOWN} more")
    if any("that the other clips do not have" in reason for _, reasons in clips for reason in reasons):
        print(
            "A camera file the other clips do not have: move it out of its clip folder, or index with frame "
            "tables (without --no-metadata), which keeps the clip with the cameras every clip has."
        )
    print(
        "Restore missing or damaged files and run `vstream index` again to include them; --strict refuses a "
        "dataset with incomplete clips."
    )


def _quick_check(args: argparse.Namespace) -> int:
    from lightning_vstream.indexing import load_index
    from lightning_vstream.indexing.verify import files_without_tables

    with warnings.catch_warnings():
        # Files without frame tables are said below, in words, with the exit status of a failed check.
        warnings.simplefilter("ignore", VStreamWarning)
        index = load_index(args.root, check="thorough")
    problems = files_without_tables(index.source)
    if problems:
        listed = "\n".join(f"  {i + 1}. {p}" for i, p in enumerate(problems))
        print(
            f"vstream index --quick-check: {index.source}: {len(problems)} problem(s):\n{listed}\n"
            "Integrity checks are off for these files until the index has their frame tables.",
            file=sys.stderr,
        )
        return 1
    print(
        f"{index.source}: {len(index)} clips, {len(index.camera_names)} cameras, "
        f"{index.total_frames} frames per camera: all files match the index (quick check: frame tables trusted "
        "where size and modification time are unchanged)."
    )
    print_not_indexed(index.source)
    return 0


def _check(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from lightning_vstream.indexing import verify_index

    def bar(items: Any) -> Any:
        return tqdm(items, desc="verifying", unit="file", disable=args.quiet or len(items) < 20, file=sys.stderr)

    return _report(verify_index(args.root, progress=bar))


def _report(report: VerifyReport) -> int:
    """Print what ``vstream index --check`` found; the exit status (1 on any problem)."""
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
    decoded = f" Every one of the {report.decoded} frames the index lists decodes." if report.decoded else ""
    print(f"{report.index}: {report.files} files, {report.frames} frames: every packet matches its checksum.{decoded}")
    return 0


def _tables(args: argparse.Namespace) -> int:
    from lightning_vstream.indexing import write_index_tables

    written = write_index_tables(args.root, table_format=args.table_format, progress=not args.quiet)
    print(f"wrote {written}: frame tables of every file {args.root} lists; integrity checks are on.")
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

    from lightning_vstream.indexing import load_index
    from lightning_vstream.indexing.output import incomplete_path
    from lightning_vstream.indexing.remote_build import build_remote_index, write_remote_index_tables
    from lightning_vstream.indexing.verify import verify_remote_index
    from lightning_vstream.storage.config import StorageConfig

    options = _storage_options(args.storage_option)
    config = StorageConfig(options)

    def bar(items: Any) -> Any:
        return tqdm(items, desc="reading", unit="file", disable=args.quiet, file=sys.stderr)

    if mode == "check":
        return _report(verify_remote_index(args.root, storage=config, progress=bar))
    if mode == "quick_check":
        index = load_index(args.root, check="thorough", storage_options=options)
        identities = [cam.info.identity if cam.info is not None else None for clip in index for cam in clip.cameras]
        etags = sum(1 for identity in identities if identity is not None and identity.etag)
        if etags == len(identities):
            matched = "every file's size and ETag match the index"
        elif etags:
            matched = (
                f"every file's size matches the index, and the ETag of the {etags} of {len(identities)} files it "
                "recorded one for"
            )
        else:
            matched = (
                "every file's size matches the index; it recorded no ETags (it was built from local files), so a "
                "file replaced by one of the same size is caught by the packet checksums as it is read, or by --check"
            )
        print(
            f"{index.source}: {len(index)} clips, {len(index.camera_names)} cameras, {index.total_frames} frames per "
            f"camera: {matched} (quick check)."
        )
        return 0
    if mode == "tables":
        written = write_remote_index_tables(args.root, storage=config, progress=bar)
        print(f"wrote {written}: frame tables of every file {args.root} lists; integrity checks are on.")
        return 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VStreamWarning)  # incomplete clips are said below, in words
        path = build_remote_index(
            args.root,
            output=args.output,
            storage=config,
            progress=bar,
            incomplete="raise" if args.strict else "skip",
        )
    index = load_index(path, storage_options=options)
    print(
        f"wrote {path}: {len(index)} clips, cameras {list(index.camera_names)}, {index.total_frames} frames per camera"
    )
    print_incomplete(incomplete_path(path), read=lambda url: _read_if_there(config, url))
    return 0


def _read_if_there(config: Any, url: str) -> bytes | None:
    from lightning_vstream.errors import MissingFileError
    from lightning_vstream.storage.client import storage_for

    try:
        raw, _ = storage_for(config).read(url, label="list of incomplete clips")
    except MissingFileError:
        return None
    return bytes(raw)
