"""``vstream preview``: draw the first batches a model would receive, from an index or a training config."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lightning_vstream.commands.args import positive
from lightning_vstream.errors import ConfigurationError

_CONFIG_SUFFIXES = (".yaml", ".yml")
_DEFAULT_BATCH_SIZE = 4  # StreamVideoDataModule's default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Draw what the model receives: the first training batches, every camera's frame after augmentation and "
        "transforms, labelled with step, slot, clip, frame index and time; slots that start a clip (is_first) "
        "framed in orange; annotation boxes projected into every camera through the delivered intrinsics, "
        "which include img_aug_matrix. From an index (a StreamVideoDataModule with default options, and the "
        "annotations/ folder next to the index if there is one) or from a LightningCLI config (its data: "
        "section, exactly as training builds it)."
    )
    parser.add_argument("source", metavar="INDEX_OR_CONFIG", help="an index file (or URL), or a YAML training config")
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        help="image to write (default: preview.png next to a local index, else in the current folder)",
    )
    parser.add_argument(
        "--clip", default=None, help="draw this clip only, in one slot (default: the batches as trained)"
    )
    parser.add_argument("--steps", type=positive, default=4, help="batches (steps) to draw")
    parser.add_argument("--slots", type=positive, default=None, help="slots of each batch to draw (default: all)")
    parser.add_argument(
        "--batch-size",
        type=positive,
        default=None,
        help="slots per batch (default: the config's, or 4, or as many as an index with fewer clips has)",
    )
    parser.add_argument(
        "--scale", type=positive, default=None, help="enlarge frames by this factor (default: to 200+ px)"
    )


def run(args: argparse.Namespace) -> int:
    from lightning_vstream.preview import preview_batches
    from lightning_vstream.storage.urls import is_url

    source = str(args.source)
    is_config = source.lower().endswith(_CONFIG_SUFFIXES)
    if not is_config and not is_url(source) and not Path(source).is_file():
        # The same rule as every command: a path that does not exist is a wrong command line (exit 2).
        raise ConfigurationError(
            f"index file {source!r} does not exist. Run `vstream index DATASET_FOLDER` to index your videos, "
            "or `vstream synth FOLDER` for a stamped dataset."
        )
    data = _config_data(Path(source)) if is_config else _index_data(source)
    if args.batch_size is not None:
        data["batch_size"] = args.batch_size
    elif not is_config and args.clip is None:
        data["batch_size"] = _default_batch_size(source)
    output = args.output
    if output is None:
        output = Path(source).parent / "preview.png" if not is_config and not is_url(source) else Path("preview.png")
    if args.clip is not None:
        _one_clip(data, args.clip)
    datamodule = _datamodule(data)
    picture = preview_batches(datamodule, steps=args.steps, max_slots=args.slots, scale=args.scale)
    datamodule.teardown()
    path = picture.save(output)
    steps = len({tile.step for tile in picture.tiles})
    clips = sorted({tile.clip_id for tile in picture.tiles if tile.valid})
    shown = ", ".join(clips[:6]) + (f" and {len(clips) - 6} more" if len(clips) > 6 else "")
    print(
        f"wrote {path}: {steps} step(s), {len(picture.tiles)} camera frames of {shown} ({picture.image.width}x"
        f"{picture.image.height} pixels)"
    )
    return 0


def _default_batch_size(index: str) -> int:
    """4 slots, or one per clip for an index of fewer clips: a preview adapts to the data it is shown."""
    from lightning_vstream.indexing import load_index

    return max(1, min(_DEFAULT_BATCH_SIZE, len(load_index(index))))


def _index_data(index: str) -> dict[str, Any]:
    """The DataModule options for an index: defaults, and its annotations folder if it has one."""
    from lightning_vstream.storage.urls import is_url

    data: dict[str, Any] = {"index_file": index}
    if not is_url(index):
        annotations = Path(index).parent / "annotations"
        if annotations.is_dir():
            data["output"] = {"annotations": str(annotations)}
    return data


def _config_data(path: Path) -> dict[str, Any]:
    """The ``data:`` section of a LightningCLI config (also under a ``fit:`` subcommand)."""
    import yaml  # a dependency of lightning (and jsonargparse)

    if not path.is_file():
        raise ConfigurationError(f"config {str(path)!r} does not exist; pass a YAML training config or an index file.")
    config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    data = config.get("data") if isinstance(config, dict) else None
    if data is None and isinstance(config, dict) and isinstance(config.get("fit"), dict):
        data = config["fit"].get("data")
    if not isinstance(data, dict):
        raise ConfigurationError(
            f"config {str(path)!r} has no data: section; preview draws the batches of the DataModule it configures."
        )
    return dict(data)


def _one_clip(data: dict[str, Any], clip_id: str) -> None:
    """Change the options so that the training loader streams ``clip_id`` alone, in one slot."""
    import difflib

    from lightning_vstream.indexing import load_index

    options = data.get("init_args", data) if "class_path" in data else data
    index_file = options.get("index_file")
    if index_file is None:
        raise ConfigurationError("--clip needs the config's data.index_file (the training index).")
    storage = dict(options.get("storage") or {})
    given = {"storage_options": storage.get("options"), "cache_dir": storage.get("cache_dir")}
    given["cache_limit"] = storage.get("cache_limit")
    index_options = dict(options.get("index") or {})
    index = load_index(
        index_file, cameras=index_options.get("cameras"), **{key: value for key, value in given.items() if value}
    )
    ids = [index.clip_id(i) for i in range(len(index))]
    if clip_id not in ids:
        close = difflib.get_close_matches(clip_id, ids, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f" (it has {len(ids)} clips, e.g. {ids[0]!r})."
        raise ConfigurationError(f"--clip {clip_id!r}: {str(index_file)!r} has no such clip{hint}")
    options["index"] = {**index_options, "exclude_clips": [other for other in ids if other != clip_id]}
    options["batch_size"] = 1
    order = "sampling" if str(data.get("class_path", "")).endswith("ClipVideoDataModule") else "plan"
    options[order] = {**dict(options.get(order) or {}), "shuffle": False}
    for split in ("val_index_file", "test_index_file", "predict_index_file"):
        options.pop(split, None)


def _datamodule(data: dict[str, Any]) -> Any:
    """The DataModule the options describe, built as LightningCLI builds it (``class_path`` or the streaming one)."""
    from lightning_vstream.errors import MissingDependencyError

    plain = set(data) <= {"index_file", "output", "batch_size", "index", "plan"}
    if plain and set(data.get("output") or {}) <= {"annotations"}:  # an index's options: nothing to build
        from lightning_vstream import StreamVideoDataModule

        return StreamVideoDataModule(**data)
    try:
        from jsonargparse import ArgumentParser
    except ImportError:
        raise MissingDependencyError(
            "reading a training config needs jsonargparse; install it with `pip install 'lightning_vstream[cli]'`."
        ) from None
    import lightning.pytorch as pl

    from lightning_vstream import StreamVideoDataModule

    parser = ArgumentParser(exit_on_error=False)
    if "class_path" in data:
        parser.add_subclass_arguments(pl.LightningDataModule, "data")
    else:
        parser.add_class_arguments(StreamVideoDataModule, "data")
    try:
        config = parser.parse_object({"data": data})
    except Exception as err:  # jsonargparse's own error type, with the key and the value
        raise ConfigurationError(f"the config's data: section does not build a DataModule: {err}") from None
    return parser.instantiate_classes(config).data
