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

__all__ = ["IndexValidationError", "VStreamError", "VideoDecodeError"]


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
