"""File identity: what tells cheaply whether a camera file is still the one the index describes.

An index records, per video file, its size, its modification time (``st_mtime_ns``) and a
fingerprint: the CRC-32 of its first and of its last 64 KiB (the codec configuration's CRC-32
is already part of the frame table, :attr:`VideoInfo.config_crc32`). When any of these differ
when a decoder opens the file (or on ``load_index(check="thorough")``), the file is re-verified
in full: it is probed again and every packet's CRC-32 compared with the stored ones. A file whose
content is unchanged (a copy, a ``touch``) passes; a replaced or swapped file is rejected with
:class:`FileChangedError` before any frame is decoded. The stored frame table is always kept, so
every packet is still checked while decoding: no frame is ever delivered from data the index did
not record.

This module reads files but imports no decoder: re-verifying a file probes it with the ``probe``
its caller passes (a decoder probes its own file; :mod:`lightning_vstream.indexing` passes its probe).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat as stat_module
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from lightning_vstream.errors import FileChangedError, MissingFileError, VideoDecodeError
from lightning_vstream.index.checksum import crc32

if TYPE_CHECKING:
    from lightning_vstream.index.tables import VideoInfo

__all__ = [
    "BLOCK",
    "FileIdentity",
    "NotRegularFileError",
    "Probe",
    "file_identity",
    "open_regular",
    "reverify",
    "verify_identity",
]

#: Reads a local file's frame table (every packet's timestamp and CRC-32), e.g.
#: :func:`lightning_vstream.decode.cpu.probe.probe_video`.
Probe = Callable[[Path], "VideoInfo"]

#: Bytes read at each end of a file for its fingerprint.
BLOCK = 64 * 1024

# (path, recorded identity, current identity) -> current identity (content verified) or the error:
# decoders of one changed file reopened again and again re-verify it once per process.
_VERDICTS: dict[tuple[str, FileIdentity, FileIdentity], FileIdentity | FileChangedError] = {}

_FIX = "Re-run `vstream index` to rebuild the index if the file was replaced on purpose, or restore the file."


@dataclass(frozen=True)
class FileIdentity:
    """Size, modification time and fingerprint of one video file, as recorded in an index.

    Args:
        size: File size in bytes.
        mtime_ns: Modification time in nanoseconds (``os.stat().st_mtime_ns``).
        head_crc32: CRC-32 of the first :data:`BLOCK` bytes.
        tail_crc32: CRC-32 of the last :data:`BLOCK` bytes (of the whole file when it is smaller).
        etag: The ETag (or generation) of a remote object, recorded when the index was built on the
            object store itself; reads then carry ``If-Match``. None for local files and for indexes
            built locally and uploaded (their objects are identified by size and packet CRC-32s).

    Example::

        >>> FileIdentity(10, 0, 1, 2).matches(FileIdentity(10, 0, 5, 6))
        False
    """

    size: int
    mtime_ns: int
    head_crc32: int
    tail_crc32: int
    etag: str | None = None

    @property
    def size_only(self) -> bool:
        """True for identities read from older sidecars, which recorded the size alone (the rest is -1)."""
        return self.mtime_ns < 0

    def matches(self, other: FileIdentity) -> bool:
        """Same size, modification time and fingerprint (the size alone for :attr:`size_only` identities)."""
        if self.size_only:
            return self.size == other.size
        return (self.size, self.mtime_ns, self.head_crc32, self.tail_crc32) == (
            other.size,
            other.mtime_ns,
            other.head_crc32,
            other.tail_crc32,
        )

    def describe_difference(self, current: FileIdentity) -> str:
        """Which of size, mtime and fingerprint differ, in words, for error messages."""
        parts = []
        if self.size != current.size:
            parts.append(f"size {self.size} -> {current.size} bytes")
        if self.mtime_ns != current.mtime_ns:
            parts.append("modification time changed")
        if (self.head_crc32, self.tail_crc32) != (current.head_crc32, current.tail_crc32):
            parts.append("content fingerprint differs")
        return ", ".join(parts) or "no difference"

    def to_dict(self) -> dict[str, Any]:
        found = dataclasses.asdict(self)
        if self.etag is None:
            del found["etag"]
        return found

    @classmethod
    def from_dict(cls, data: Any) -> FileIdentity | None:
        """Parse a stored identity; None when it is missing or malformed (old sidecars)."""
        try:
            values = [data[f.name] for f in dataclasses.fields(cls) if f.name != "etag"]
            etag = data.get("etag")
        except (KeyError, TypeError, AttributeError):
            return None
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            return None
        size, mtime_ns, head, tail = values
        return cls(size, mtime_ns, head, tail, etag=etag if isinstance(etag, str) and etag else None)


def open_regular(path: Path | str) -> BinaryIO:
    """Open a file for reading only if it is a regular file; never block on a FIFO or a device.

    The file is opened without blocking (``O_NONBLOCK``, so a FIFO with no writer does not wait
    for one) and checked with ``fstat`` on the open descriptor, so a file replaced by a FIFO, a
    socket or a device between a check and the open is still refused.

    Raises:
        NotRegularFileError: ``path`` is not a regular file (an ``OSError``, errno ``EINVAL``).
        OSError: The file cannot be opened.

    Example::

        >>> with open_regular("data/videos/scene-0000/CAM_FRONT.mp4") as f:  # doctest: +SKIP
        ...     head = f.read(16)
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        st = os.fstat(fd)
        if not stat_module.S_ISREG(st.st_mode):
            raise NotRegularFileError(path, st.st_mode)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class NotRegularFileError(OSError):
    """A path that should hold a video or an image is a FIFO, a socket, a device or a folder."""

    def __init__(self, path: Path | str, mode: int) -> None:
        kind = _KINDS.get(stat_module.S_IFMT(mode), "not a regular file")
        super().__init__(errno.EINVAL, f"it is {kind}; expected a regular file", str(path))


_KINDS = {
    stat_module.S_IFIFO: "a FIFO (named pipe)",
    stat_module.S_IFSOCK: "a socket",
    stat_module.S_IFCHR: "a character device",
    stat_module.S_IFBLK: "a block device",
    stat_module.S_IFDIR: "a folder",
}


def file_identity(path: Path | str, *, stat: os.stat_result | None = None) -> FileIdentity:
    """Read a file's size, modification time and fingerprint (at most 128 KiB are read).

    Raises:
        OSError: The file cannot be read.

    Example::

        >>> file_identity("data/videos/scene-0000/CAM_FRONT.mp4").size  # doctest: +SKIP
        183404
    """
    with open_regular(path) as f:
        st = stat if stat is not None else os.fstat(f.fileno())
        head = f.read(BLOCK)
        if st.st_size > BLOCK:
            f.seek(max(st.st_size - BLOCK, 0))
            tail = f.read(BLOCK)
        else:
            tail = head
    return FileIdentity(st.st_size, st.st_mtime_ns, crc32(head), crc32(tail))


def _difference(stored: VideoInfo, probed: VideoInfo) -> tuple[str, int] | None:
    """None when two frame tables describe the same packets, else (what differs, first intact-prefix length).

    The prefix length counts the leading frames whose timestamps and packet checksums match; it is
    0 when the file is another file altogether (other codec configuration, other timestamps, or a
    different first packet).
    """
    if probed.crc32 is None or stored.crc32 is None:
        return "it has no packet checksums to compare", 0
    if stored.config_crc32 is not None and probed.config_crc32 != stored.config_crc32:
        return "the codec configuration (SPS/PPS) differs from the one recorded when the index was built", 0
    moved = next((i for i, (a, b) in enumerate(zip(probed.pts, stored.pts)) if a != b), None)
    if moved is not None:
        return f"frame {moved} onwards has other timestamps than the index recorded", 0
    bad = [i for i, (a, b) in enumerate(zip(probed.crc32, stored.crc32)) if a != b]
    if bad:
        return (
            f"the compressed data of frame {bad[0]} differs from the checksum recorded when the index was "
            f"built ({len(bad)} frame(s) differ)"
        ), bad[0]
    if probed.frame_count != stored.frame_count:
        shorter = min(probed.frame_count, stored.frame_count)
        return (
            f"it holds {probed.frame_count} frames where the index recorded {stored.frame_count} (frame "
            f"{shorter} onwards differs)"
        ), shorter
    return None


def reverify(path: Path, stored: VideoInfo, where: str, *, probe: Probe, damaged_ok: bool = False) -> VideoInfo:
    """Probe ``path`` in full and accept it only if its packets match ``stored``.

    Args:
        path: The file.
        stored: Its frame table from the index.
        where: The file, clip and camera, for messages.
        probe: Reads the file's current frame table.
        damaged_ok: Also accept a file that is the indexed one with a damaged tail (a truncated
            copy, corrupted packets after intact leading frames): its leading frames are exactly
            the indexed ones, and a decoder keeps checking every packet against ``stored``, so it
            raises at the first damaged frame. A file whose first frame, timestamps or codec
            configuration differ is always rejected.

    Returns:
        ``stored`` with the file's current identity.

    Raises:
        FileChangedError: The file's packets differ from the frame table, or it cannot be probed.
    """
    try:
        current = file_identity(path)
        probed = probe(path)
    except (VideoDecodeError, OSError, ValueError) as err:
        raise FileChangedError(
            where, [(f"{where} changed since the index was built and can no longer be read as a video ({err}). {_FIX}")]
        ) from None
    difference = _difference(stored, probed)
    if difference is not None and not (damaged_ok and difference[1] > 0):
        raise FileChangedError(where, [f"{where} changed since the index was built: {difference[0]}. {_FIX}"])
    return dataclasses.replace(stored, identity=current)


def verify_identity(path: Path, info: VideoInfo, where: str, *, probe: Probe) -> VideoInfo:
    """Compare a file with the identity recorded in ``info``; re-verify it in full on any difference.

    Files whose frame table has no recorded identity (older sidecars, image folders) are returned
    unchanged: their packets are still checked against the stored CRC-32s while decoding. A file
    whose leading frames are intact but whose tail is damaged is accepted (see
    :func:`reverify`): the decoder delivers those leading frames and raises at the first damaged one.

    Returns:
        ``info``, or ``info`` with the current identity after a successful full re-verification.

    Raises:
        FileChangedError: The file changed and its packets no longer match the frame table.
        MissingFileError: The file no longer exists.
    """
    recorded = info.identity
    if recorded is None:
        return info
    try:
        current = file_identity(path)
    except FileNotFoundError:
        # Gone, not changed: the loaders name the clip to leave out (see MissingFileError's readers).
        raise MissingFileError(f"{where}: the index lists this file, but it no longer exists.") from None
    except OSError as err:
        raise FileChangedError(where, [f"{where} cannot be read ({err.strerror or err}). {_FIX}"]) from None
    if recorded.matches(current):
        return info
    key = (str(path), recorded, current)
    verdict = _VERDICTS.get(key)
    if verdict is not None:  # this process already re-verified this very file
        if isinstance(verdict, FileChangedError):
            raise FileChangedError(verdict.source, verdict.problems)
        return dataclasses.replace(info, identity=verdict)
    if len(_VERDICTS) > 4096:
        _VERDICTS.clear()
    try:
        checked = reverify(path, info, where, probe=probe, damaged_ok=True)
    except FileChangedError as err:
        _VERDICTS[key] = err
        raise
    _VERDICTS[key] = current
    return checked
