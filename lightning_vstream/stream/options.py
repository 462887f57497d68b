"""The decoding options both stream loaders take, checked one way.

The worker loader's dataset (:class:`~lightning_vstream.stream.worker.StreamDataset`) and the thread
engine (:class:`~lightning_vstream.stream.engine.StreamEngine`) accept the same ``on_error``,
``camera_frames`` and ``max_open_decoders``, and refuse a bad value with the same error.
"""

from __future__ import annotations

from typing import Literal

from lightning_vstream.errors import ConfigurationError

__all__ = ["CameraFrames", "OnError", "check_stream_options"]

OnError = Literal["raise", "skip"]
CameraFrames = Literal["stacked", "per_camera"]


def check_stream_options(*, on_error: str, camera_frames: str, max_open_decoders: int | None) -> None:
    """Raise :class:`~lightning_vstream.errors.ConfigurationError` for the first option not supported.

    Example::

        >>> check_stream_options(on_error="skip", camera_frames="stacked", max_open_decoders=None)
    """
    if camera_frames not in ("stacked", "per_camera"):
        raise ConfigurationError(f"camera_frames={camera_frames!r} is not supported; use 'stacked' or 'per_camera'.")
    if on_error not in ("raise", "skip"):
        raise ConfigurationError(f"on_error={on_error!r} is not supported; use 'raise' or 'skip'.")
    if max_open_decoders is not None and max_open_decoders < 1:
        raise ConfigurationError(f"max_open_decoders={max_open_decoders!r} must be >= 1 or None.")
