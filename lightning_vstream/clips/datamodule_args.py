"""Checking :class:`~lightning_vstream.clips.datamodule.ClipVideoDataModule`'s arguments, each problem named."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_vstream.errors import ConfigurationError
from lightning_vstream.options import check_arguments

__all__ = ["check_clip_arguments"]


def check_clip_arguments(args: Mapping[str, Any]) -> None:
    """Check the DataModule's keyword arguments (``args``, by name): each error names the argument, the value
    received and what is accepted.

    Raises:
        ValueError: An argument is out of range or two arguments contradict each other.
        TypeError: An argument has the wrong type.
    """
    camera_frames = args["camera_frames"]
    frame_policy = args["frame_policy"]
    segments = args["segments"]
    clip_frames = args["clip_frames"]
    frame_stride = args["frame_stride"]
    batch_size = args["batch_size"]
    num_workers = args["num_workers"]
    clips_per_epoch = args["clips_per_epoch"]
    prefetch_factor = args["prefetch_factor"]
    decoder_threads = args["decoder_threads"]
    max_open_decoders = args["max_open_decoders"]
    timeout = args["timeout"]
    decode_device = args["decode_device"]
    index_check = args["index_check"]
    on_error = args["on_error"]
    selection = args["selection"]
    sampler = args["sampler"]
    multiprocessing_context = args["multiprocessing_context"]
    transform = args["transform"]
    world_size = args["world_size"]
    rank = args["rank"]
    if camera_frames not in ("stacked", "per_camera"):
        raise ConfigurationError(
            f"ClipVideoDataModule: camera_frames={camera_frames!r} is not supported; use 'stacked' or 'per_camera'."
        )
    if frame_policy not in ("exact", "nearest_keyframe"):
        raise ConfigurationError(
            f"ClipVideoDataModule: frame_policy={frame_policy!r} is not supported; use 'exact' or "
            "'nearest_keyframe' (approximate)."
        )
    if segments is not None and clip_frames is not None:
        raise ConfigurationError(
            f"pass either segments={list(segments)!r} (a multi-rate window) or clip_frames={clip_frames!r} "
            "(a frame window), not both."
        )
    if segments is not None and frame_stride != 1:
        raise ConfigurationError(
            f"frame_stride={frame_stride!r} applies to frame windows; segments set their own spacing."
        )

    def positive(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1

    check_arguments(
        "ClipVideoDataModule",
        {
            "batch_size": (batch_size, positive(batch_size), "an integer >= 1"),
            "num_workers": (num_workers, num_workers is None or num_workers >= 0, "None or an integer >= 0"),
            "clips_per_epoch": (
                clips_per_epoch,
                clips_per_epoch is None or positive(clips_per_epoch),
                "None or an integer >= 1",
            ),
            "prefetch_factor": (prefetch_factor, prefetch_factor >= 1, "an integer >= 1"),
            "decoder_threads": (decoder_threads, decoder_threads >= 0, "an integer >= 0"),
            "max_open_decoders": (max_open_decoders, positive(max_open_decoders), "an integer >= 1"),
            "timeout": (timeout, timeout >= 0, "a number of seconds >= 0"),
            "decode_device": (decode_device, decode_device in ("cpu", "cuda", "auto"), "'cpu', 'cuda' or 'auto'"),
            "index_check": (index_check, index_check in ("fast", "thorough"), "'fast' or 'thorough'"),
            "on_error": (on_error, on_error in ("raise", "skip"), "'raise' or 'skip'"),
            "selection": (selection, selection in ("regular", "random"), "'regular' or 'random'"),
            "sampler": (
                sampler,
                sampler is None or callable(sampler),
                "None or a callable that takes the dataset and returns a torch Sampler",
            ),
            "multiprocessing_context": (
                multiprocessing_context,
                multiprocessing_context in (None, "fork", "forkserver", "spawn"),
                "None, 'fork', 'forkserver' or 'spawn'",
            ),
            "transform": (
                transform,
                transform is None or callable(transform),
                "None or a callable on frame tensors",
            ),
            "world_size": (world_size, world_size is None or positive(world_size), "None or an integer >= 1"),
            "rank": (rank, rank is None or 0 <= rank < (world_size or 1), "an integer in 0..world_size-1"),
        },
    )
