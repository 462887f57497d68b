"""The exceptions lightning_vstream raises; every one derives from :class:`VStreamError`.

Each also derives from the built-in type that describes it (``ValueError`` for bad input,
``RuntimeError`` for failures while running), so code that catches those keeps working.

Every class can be rebuilt from its message alone, as ``pickle`` and PyTorch's DataLoader do: an
error raised in a DataLoader worker reaches the training process as the same class, and its
message starts with the worker's original message (torch's "Caught ... in DataLoader worker
process N" preamble is moved after it, with the worker's traceback).

Example::

    >>> from lightning_vstream import VStreamError
    >>> issubclass(IndexValidationError, VStreamError) and issubclass(IndexValidationError, ValueError)
    True
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

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
    "FileWriteError",
    "FrameSizeError",
    "GpuError",
    "GpuMemoryError",
    "IndexValidationError",
    "InjectedFaultError",
    "MissingDependencyError",
    "MissingFileError",
    "RemoteAccessError",
    "RemoteStorageError",
    "RemoteTimeoutError",
    "ResumeStateError",
    "RotatedVideoError",
    "StepMismatchError",
    "UsageError",
    "VStreamError",
    "VideoDecodeError",
    "WorkerError",
]


# torch.utils.data's ExceptionWrapper.reraise() rebuilds an error from a worker as
# ``exc_type(f"Caught {name} {where}.\nOriginal {traceback}")``.
_TORCH_REBUILT = re.compile(
    r"Caught (?P<name>\w+) (?P<where>in [^\n]+?)\.\nOriginal (?P<traceback>Traceback \(most recent call last\):\n.*)\Z",
    re.DOTALL,
)


def _original_first(cls: type, text: str) -> str:
    """``text``, or, for a message torch rebuilt after a DataLoader worker raised ``cls``, the worker's own
    message followed by where it was raised and the worker's traceback.

    The worker's message is what follows the last ``module.ClassName: `` line of the traceback (the
    error raised last comes last, after any chained causes).
    """
    found = _TORCH_REBUILT.match(text)
    if found is None or found["name"] != cls.__name__:
        return text
    trace = found["traceback"]
    name = cls.__qualname__ if cls.__module__ in ("__main__", "builtins") else f"{cls.__module__}.{cls.__qualname__}"
    at = trace.rfind(f"\n{name}: ")
    if at < 0:
        return text
    original = trace[at + len(name) + 3 :].rstrip("\n")
    return f"{original}\n\n(raised {found['where']}; the worker's traceback:)\n{trace[: at + 1]}"


class VStreamError(Exception):
    """Base class of every error lightning_vstream raises on purpose.

    Example::

        >>> import pickle
        >>> err = pickle.loads(pickle.dumps(VStreamError("clip 'scene-0001': file 'a.mp4' is damaged")))
        >>> type(err).__name__, str(err)
        ('VStreamError', "clip 'scene-0001': file 'a.mp4' is damaged")
    """

    def __init__(self, *args: object, **kwargs: Any) -> None:
        if len(args) == 1 and isinstance(args[0], str):
            args = (_original_first(type(self), args[0]),)
        super().__init__(*args, **kwargs)  # keywords: ImportError's name and path


class IndexValidationError(VStreamError, ValueError):
    """An index file does not describe the files on disk; ``problems`` lists every finding.

    Args:
        source: What was checked (the index file, or the video file with its clip and camera).
        problems: Every finding, each a complete sentence. Without it, ``source`` is the whole
            message (how ``pickle`` and PyTorch's DataLoader rebuild the error from its text).
    """

    def __init__(self, source: str, problems: Sequence[str] | None = None) -> None:
        if problems is None:
            super().__init__(source)
            self.source = ""
            self.problems = [str(self.args[0])]
            return
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


class InjectedFaultError(VStreamError, RuntimeError):
    """A failure made on purpose by a test (``VSTREAM_TEST_ENCODE_FAULT``); retried as a crashed task is."""


class DatasetImportError(VStreamError, ValueError):
    """A dataset being imported (its tables or image files) is missing, malformed or inconsistent."""


class FrameSizeError(VideoDecodeError):
    """A decoded (and transformed) frame does not have the size of the batch it belongs in.

    The message names the file, clip, camera and frame, and both sizes. Under ``on_error="skip"``
    the clip is skipped and counted like any other unreadable file.
    """


class RotatedVideoError(VideoDecodeError):
    """A video carries a display rotation (a display matrix of 90, 180 or 270 degrees), which is not applied.

    Frames would come out in their coded orientation, not as a player shows them, so such a file is
    refused where it is met: when its index is built, and when a decoder reads its first frame. The
    message names the file (with its clip and camera), the rotation in degrees and how to re-encode the
    file upright.
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


class FileWriteError(VStreamError, OSError):
    """A file could not be written (a full disk, a quota, a file-size limit, a read-only folder).

    Every file this package writes is written to a temporary name in its folder and renamed into
    place, so the previous version of the file is intact and the temporary file is removed. The
    message names the file and the reason; ``errno`` is set as for any ``OSError``.

    Example::

        >>> err = FileWriteError(28, "cannot write 'index.json': No space left on device")
        >>> err.errno, isinstance(err, OSError)
        (28, True)
    """


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


class GpuError(VStreamError, RuntimeError):
    """The GPU failed while decoding or converting: a CUDA error, GPU memory exhausted, or a Triton kernel failure.

    Never a property of the file being read: it is raised whatever ``on_error`` says (a skip would
    skip every clip after it), and the decoder that met it is dropped without being flushed (its
    CUDA context may be unusable). The message names the file and frame, the original error and what
    to check.
    """


class GpuMemoryError(GpuError, MemoryError):
    """The GPU has too little free memory for what NVDEC must allocate outside torch's allocator.

    Raised before the first step (NVDEC running out of memory inside its parser ends the process
    instead of raising); the message gives the numbers and what to lower.
    """


#: Set to 1 to print the full traceback of an error where ``vstream`` and :class:`~lightning_vstream.VStreamCLI`
#: otherwise print only its message (``vstream --debug`` does the same for one command).
DEBUG_ENV = "VSTREAM_DEBUG"

#: Where :func:`_original_first` appended a DataLoader worker's traceback to its message.
_WORKER_TRACEBACK = "\n\n(raised in "


def valid_indices(count: int) -> str:
    """The indices ``0..count - 1`` as an error message gives them.

    Example:
        >>> valid_indices(13), valid_indices(0)
        ('valid: 0..12', 'none is valid')
    """
    return f"valid: 0..{count - 1}" if count > 0 else "none is valid"


def frame_out_of_range(frame: int, count: int, where: str) -> IndexError:
    """The error for frame ``frame`` of ``where`` (a file, a clip) that holds ``count`` frames.

    Example:
        >>> frame_out_of_range(13, 13, "'a.mp4'")
        IndexError("frame 13 is out of range for 'a.mp4', which holds 13 frames (valid: 0..12).")
    """
    return IndexError(
        f"frame {frame} is out of range for {where}, which holds {count} frames ({valid_indices(count)})."
    )


#: Packages whose frames a warning of ours is not attributed to: the line shown is the user's own.
_LIBRARY_MODULES = ("lightning_vstream", "lightning", "pytorch_lightning", "lightning_utilities", "torch")


def user_stacklevel() -> int:
    """The ``stacklevel`` that attributes a warning to the user's code: the first frame outside this package,
    Lightning and torch, counted from the function that calls this one (and then ``warnings.warn``).

    A warning raised in a DataModule hook that Lightning calls would otherwise point at a line of
    Lightning's trainer, and Lightning prints those without the warning's category.
    """
    import sys

    frame = sys._getframe(1)
    level = 1
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if not any(module == name or module.startswith(name + ".") for name in _LIBRARY_MODULES):
            return level
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return 2


def debug_requested() -> bool:
    """Whether ``VSTREAM_DEBUG`` asks for tracebacks (any value but empty or ``0``)."""
    import os

    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def user_message(err: BaseException) -> str:
    """``err`` as a person reads it on a terminal: its message and fix, without a worker's traceback.

    An error rebuilt from a DataLoader worker carries the worker's traceback after its message
    (see :class:`VStreamError`); that part is for ``--debug`` / ``VSTREAM_DEBUG=1``.

    Example::

        >>> user_message(MissingFileError("index file 'x.json' does not exist."))
        "index file 'x.json' does not exist."
    """
    text = str(err)
    cut = text.find(_WORKER_TRACEBACK)
    return (text[:cut] if cut >= 0 else text).rstrip()


class VStreamWarning(UserWarning):
    """Base class of every warning lightning_vstream issues (silence them all with
    ``warnings.filterwarnings("ignore", category=VStreamWarning)``, or turn them into errors).

    Public as ``lightning_vstream.VStreamWarning``; ``__all__`` here lists the exceptions."""
