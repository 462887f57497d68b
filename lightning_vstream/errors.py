"""The exceptions lightning_vstream raises; every one derives from :class:`VStreamError`.

Each also derives from the built-in type that describes it (``ValueError`` for bad input,
``RuntimeError`` for failures while running), so code that catches those keeps working.

Example::

    >>> from lightning_vstream import VStreamError
    >>> issubclass(IndexValidationError, VStreamError) and issubclass(IndexValidationError, ValueError)
    True
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "AnnotationError",
    "ChecksumError",
    "ConfigurationError",
    "ConfigurationTypeError",
    "DataFormatError",
    "DatasetImportError",
    "DecoderCapabilityError",
    "EncodeError",
    "FileChangedError",
    "FrameSizeError",
    "IndexValidationError",
    "MissingDependencyError",
    "MissingFileError",
    "RemoteAccessError",
    "RemoteStorageError",
    "RemoteTimeoutError",
    "ResumeStateError",
    "StepMismatchError",
    "UsageError",
    "VStreamError",
    "VideoDecodeError",
    "WorkerError",
]


class VStreamError(Exception):
    """Base class of every error lightning_vstream raises on purpose."""


class IndexValidationError(VStreamError, ValueError):
    """An index file does not describe the files on disk; ``problems`` lists every finding."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source = source
        self.problems = list(problems)
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            listed = "\n".join(f"  {i + 1}. {p}" for i, p in enumerate(self.problems))
            message = f"{source} has {len(self.problems)} problems:\n{listed}"
        super().__init__(message)


class VideoDecodeError(VStreamError, RuntimeError):
    """A video file could not be decoded as its frame table promised.

    Raised for truncated files, corrupt packets, decoder failures and frames that come out
    of the decoder at a different position than requested. The message names the file and
    the frame index.
    """


class ConfigurationError(VStreamError, ValueError):
    """An argument or configuration value is invalid; the message names it, the value and what is accepted."""


class ResumeStateError(VStreamError, ValueError):
    """A saved loader or DataModule state does not match the current setup (names the field and both values)."""


class StepMismatchError(VStreamError, RuntimeError):
    """The training loop and the loader disagree on which step a batch belongs to."""


class WorkerError(VStreamError, RuntimeError):
    """A decoding worker died, stalled past the timeout, or failed outside of a decode."""


class DecoderCapabilityError(VStreamError, RuntimeError):
    """The decode device cannot decode this stream (codec, size, bit depth or chroma format)."""


class AnnotationError(VStreamError, ValueError):
    """Annotations are missing, malformed, or cannot be matched to the frames they belong to."""


class ConfigurationTypeError(ConfigurationError, TypeError):
    """An argument has the wrong type (a string where a list is expected, a name where a position is);
    the message names the argument, the value and the accepted form."""


class EncodeError(VStreamError, RuntimeError):
    """Encoding a camera stream failed, or the written file does not keep the source's frames and times."""


class DatasetImportError(VStreamError, ValueError):
    """A dataset being imported (its tables or image files) is missing, malformed or inconsistent."""


class FrameSizeError(VideoDecodeError):
    """A decoded (and transformed) frame does not have the size of the batch it belongs in.

    The message names the file, clip, camera and frame, and both sizes. Under ``on_error="skip"``
    the clip is skipped and counted like any other unreadable file.
    """


class FileChangedError(IndexValidationError, VideoDecodeError):
    """A video file differs from the one the index describes (replaced, swapped, truncated or corrupted).

    Raised when a file's size, modification time or content fingerprint no longer match the index
    and a full re-verification of its packets fails. The message names the file (with its clip and
    camera) and says to re-run ``vstream index``. Also an :class:`IndexValidationError` and a
    :class:`VideoDecodeError`, so either handler catches it.
    """


class DataFormatError(VStreamError, ValueError):
    """A file's content (an index, its frame tables, a timestamps file) is malformed; the message names the file."""


class MissingFileError(VStreamError, FileNotFoundError):
    """A file or folder that an index, a request or an argument names does not exist."""


class MissingDependencyError(VStreamError, ImportError):
    """An optional package a feature needs is not installed (or cannot be imported); the message says which."""


class UsageError(VStreamError, RuntimeError):
    """A method was called out of order (a loader before ``setup()``), or an internal invariant broke."""


class RemoteStorageError(VStreamError, OSError):
    """A request to an object store, HTTP server or file system failed for good.

    Raised once retries (with backoff, under a deadline) are spent, or at once for an error that
    retrying cannot fix. The message names the URL, the byte range, the attempts made and the
    transport's last error.
    """


class RemoteTimeoutError(RemoteStorageError, TimeoutError):
    """A request to remote storage did not finish in time, after every retry (names URL and range)."""


class RemoteAccessError(RemoteStorageError, PermissionError):
    """Remote storage refused the credentials, or the credentials lack permission (names URL and range)."""


class ChecksumError(VideoDecodeError):
    """Compressed data read for a frame does not match the CRC-32 the index recorded, even after reading it again.

    The message names the file, the frame and the byte range. Under ``on_error="skip"`` the clip is
    skipped and counted like any other unreadable file.
    """
