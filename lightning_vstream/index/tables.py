"""Frame tables: what a probe learns about each camera stream, and the sidecar that stores them.

Richer per-file metadata (codec, size, frame timestamps, keyframe positions, packet CRCs) lives
beside the index: ``<index stem>.tables.bin`` (binary, memory-mapped, see
:mod:`lightning_vstream.index.table_file`) or the older JSON sidecar ``<index stem>.meta.json``,
so plain accvlab readers keep working on our index files and our loader seeks without rescanning
files. Both are versioned and keyed by file path relative to the index folder, and record each
file's identity (size, mtime, fingerprint: :mod:`lightning_vstream.index.identity`); a file whose
identity differs is re-verified in full, never trusted. This module imports neither torch nor any
decoder library.
"""

from __future__ import annotations

import base64
import bisect
import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_vstream.errors import DataFormatError, IndexValidationError
from lightning_vstream.index.identity import FileIdentity

__all__ = [
    "MAX_REFERENCE_CODE",
    "META_FORMAT",
    "META_VERSION",
    "REFERENCE_UNKNOWN",
    "PacketLayout",
    "VideoInfo",
    "cached_info",
    "is_reference",
    "load_metadata",
    "metadata_path",
    "reference_code",
    "table_key",
    "temporal_id",
]

META_FORMAT = "lightning_vstream.meta"
META_VERSION = 1

#: Version of the serialised :class:`VideoInfo` layout (stored in index metadata files).
VIDEO_INFO_VERSION = 1

# -- reference codes: one byte per frame, what the bitstream says about the frame's picture ---------
#: The code of a frame whose picture may or may not be a reference: read as a reference.
REFERENCE_UNKNOWN = 0xFF
_MAX_TEMPORAL_ID = 7
#: The largest code of a known picture (temporal id 7, a reference).
MAX_REFERENCE_CODE = _MAX_TEMPORAL_ID << 1 | 1


def reference_code(*, reference: bool, temporal_id: int) -> int:
    """The one-byte code of a picture: ``temporal_id << 1 | reference`` (0 .. 15).

    ``reference`` False means no picture of the same or a lower temporal sub-layer predicts from
    it (H.265's sub-layer non-reference pictures; in H.264, VP9 and AV1, no picture at all).

    Example::

        >>> reference_code(reference=False, temporal_id=2), reference_code(reference=True, temporal_id=0)
        (4, 1)
    """
    if not 0 <= temporal_id <= _MAX_TEMPORAL_ID:
        raise DataFormatError(f"temporal_id={temporal_id!r} must be from 0 to {_MAX_TEMPORAL_ID}.")
    return temporal_id << 1 | int(bool(reference))


def is_reference(code: int) -> bool:
    """Whether a frame with reference code ``code`` may be predicted from (True when unknown)."""
    return code == REFERENCE_UNKNOWN or bool(code & 1)


def temporal_id(code: int) -> int:
    """The temporal sub-layer of a frame with reference code ``code`` (0 when unknown)."""
    return 0 if code == REFERENCE_UNKNOWN else code >> 1


def _valid_references(codes: tuple[int, ...]) -> bool:
    return all(c == REFERENCE_UNKNOWN or 0 <= c <= MAX_REFERENCE_CODE for c in codes)


@dataclass(frozen=True)
class PacketLayout:
    """Where each frame's compressed packet lies in its file, and what a decoder needs besides the packets.

    With it a reader fetches exactly the byte ranges of the GOPs it needs (one request per GOP
    from an object store) and decodes them from memory with a bare codec context: no demuxer, no
    container header read per open. Recorded by ``vstream index`` only where every packet was
    found whole at its position (MP4, Matroska, raw H.264/H.265 streams; not MPEG-TS, whose packets
    are cut into 188-byte pieces): files without one are read through their container.

    Args:
        pos: Byte offset of every frame's packet, in presentation order (as ``VideoInfo.pts``).
        size: Byte size of every frame's packet.
        extradata: The codec configuration (``avcC`` / ``hvcC`` record, or SPS/PPS), as FFmpeg
            hands it to the decoder.
        colour: ``(color_range, colorspace, color_primaries, color_trc)`` the container declares
            (FFmpeg's enum values); given to the decoder as an opened container would, so frames
            convert to the same RGB.

    Example::

        >>> layout = PacketLayout((48, 900, 1000), (852, 100, 80), b"\\x01", (1, 2, 2, 2))
        >>> layout.span(0, 3)
        (48, 1080)
    """

    pos: tuple[int, ...]
    size: tuple[int, ...]
    extradata: bytes
    colour: tuple[int, int, int, int] = (0, 2, 2, 2)

    def span(self, first: int, stop: int) -> tuple[int, int]:
        """``[start, end)`` bytes holding the packets of frames ``first .. stop - 1`` (presentation order)."""
        pos, size = self.pos[first:stop], self.size[first:stop]
        return min(pos), max(p + n for p, n in zip(pos, size))

    def to_dict(self) -> dict[str, Any]:
        return {
            "pos": list(self.pos),
            "size": list(self.size),
            "extradata": base64.b64encode(self.extradata).decode("ascii"),
            "colour": list(self.colour),
        }

    @classmethod
    def from_dict(cls, data: Any, frames: int) -> PacketLayout:
        """Inverse of :meth:`to_dict`; raises ``DataFormatError`` on a malformed entry."""
        try:
            layout = cls(
                pos=tuple(int(p) for p in data["pos"]),
                size=tuple(int(n) for n in data["size"]),
                extradata=base64.b64decode(data["extradata"]),
                colour=tuple(int(c) for c in data["colour"]),  # type: ignore[arg-type]
            )
        except (KeyError, TypeError, ValueError) as err:
            raise DataFormatError(
                f"video metadata has a malformed packet layout ({err}); rebuild it with `vstream index`."
            ) from None
        if len(layout.pos) != frames or len(layout.size) != frames or len(layout.colour) != 4:
            raise DataFormatError(
                "video metadata has a packet layout of the wrong length; rebuild it with `vstream index`."
            )
        return layout


@dataclass(frozen=True)
class VideoInfo:
    """What a probe learns about one video (or image-sequence) camera stream.

    Frames are numbered ``0 .. frame_count - 1`` in presentation order. ``pts`` holds each
    frame's presentation timestamp in units of ``time_base``; ``key_indices`` the frame
    indices of keyframes (random-access points) and ``key_seek`` the timestamp to hand to the
    demuxer to land on each of them.

    Args:
        codec: Codec name as FFmpeg reports it (``"h264"``, ``"hevc"``, ``"png"``...).
        width: Frame width in pixels.
        height: Frame height in pixels.
        time_base: ``(numerator, denominator)`` of the timestamp unit in seconds.
        pts: Presentation timestamps, strictly increasing, one per frame.
        key_indices: Frame indices of keyframes, strictly increasing, starting at 0.
        key_seek: Demuxer seek target for each keyframe, in the units the container's demuxer
            compares (for MP4, the decode timestamp shifted by the edit list; else the pts).
        average_fps: Frames per second averaged over the whole stream.
        crc32: CRC-32 of every frame's compressed packet (presentation order), recorded when
            the index was built; decoders check packets against it, so corrupted data raises
            instead of decoding into wrong pixels. None when unknown.
        config_crc32: CRC-32 of the codec configuration (SPS/PPS, the ``avcC``/``hvcC`` record),
            checked when a decoder opens the file. None when unknown.
        identity: Size, modification time and fingerprint of the file when the index was built
            (see :mod:`lightning_vstream.index.identity`); a decoder re-verifies the file in full
            when they differ. None when unknown. Not part of equality.
        layout: Byte offset and size of every packet, and the codec configuration (see
            :class:`PacketLayout`), for GOP reads; None when unknown. Not part of equality.
        reorder_depth: How many frames the stream's decode order runs ahead of its presentation
            order (0: frames are stored in presentation order, no B-frame reordering), measured
            from the packets when the index was built. GPU decoders choose NVDEC's latency mode
            from it. None when unknown (indexes built before it was recorded). Not part of equality.
        references: Every frame's reference code (presentation order, see :func:`reference_code`):
            whether its picture is a reference and its temporal sub-layer, read from the packets
            when the index was built (:class:`~lightning_vstream.decode.bitstream.ReferenceReader`);
            :data:`REFERENCE_UNKNOWN` where the bitstream does not say. Readers leave out pictures
            no wanted picture depends on (:func:`~lightning_vstream.decode.gops.plan_feed`). None
            when unknown for the whole file (tables written before it was recorded: nothing is
            left out). Not part of equality.

    Example::

        >>> info = VideoInfo("h264", 64, 48, (1, 12), tuple(range(4)), (0, 2), (0, 2), 12.0)
        >>> info.frame_count, info.keyframe_at_or_before(3)
        (4, 2)
    """

    codec: str
    width: int
    height: int
    time_base: tuple[int, int]
    pts: tuple[int, ...]
    key_indices: tuple[int, ...]
    key_seek: tuple[int, ...]
    average_fps: float
    crc32: tuple[int, ...] | None = None
    config_crc32: int | None = None
    identity: FileIdentity | None = field(default=None, compare=False)
    layout: PacketLayout | None = field(default=None, compare=False, repr=False)
    reorder_depth: int | None = field(default=None, compare=False)
    references: tuple[int, ...] | None = field(default=None, compare=False, repr=False)
    _pts_lookup: dict[int, int] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def frame_count(self) -> int:
        """Number of frames the stream holds."""
        return len(self.pts)

    @property
    def timestamps(self) -> list[float]:
        """Presentation time of every frame, in seconds."""
        num, den = self.time_base
        return [p * num / den for p in self.pts]

    def timestamp(self, index: int) -> float:
        """Presentation time of frame ``index`` in seconds."""
        num, den = self.time_base
        return self.pts[index] * num / den

    def index_of_pts(self, pts: int) -> int | None:
        """Frame index of a presentation timestamp, or None if no frame has it."""
        return self.pts_index.get(pts)

    @property
    def pts_index(self) -> dict[int, int]:
        """Presentation timestamp -> frame index, built on first use and kept (readers look up every packet).

        Treat it as read-only: it is shared by every reader of this table.
        """
        lookup = self._pts_lookup
        if lookup is None:  # built on first use: frame tables are often created by the thousand
            lookup = {p: i for i, p in enumerate(self.pts)}
            object.__setattr__(self, "_pts_lookup", lookup)
        return lookup

    def keyframe_at_or_before(self, index: int) -> int:
        """Frame index of the last keyframe at or before frame ``index``."""
        pos = bisect.bisect_right(self.key_indices, index) - 1
        return self.key_indices[max(pos, 0)]

    def gop_of(self, index: int) -> int:
        """Ordinal of the GOP (keyframe interval) that holds frame ``index``."""
        return max(bisect.bisect_right(self.key_indices, index) - 1, 0)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form, as stored in index metadata files."""
        return {
            "version": VIDEO_INFO_VERSION,
            "codec": self.codec,
            "width": self.width,
            "height": self.height,
            "time_base": list(self.time_base),
            "average_fps": self.average_fps,
            "pts": list(self.pts),
            "key_indices": list(self.key_indices),
            "key_seek": list(self.key_seek),
            **({"crc32": list(self.crc32)} if self.crc32 is not None else {}),
            **({"config_crc32": self.config_crc32} if self.config_crc32 is not None else {}),
            **({"packets": self.layout.to_dict()} if self.layout is not None else {}),
            **({"reorder_depth": self.reorder_depth} if self.reorder_depth is not None else {}),
            **({"references": list(self.references)} if self.references is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VideoInfo:
        """Inverse of :meth:`to_dict`; raises ``ValueError`` on a version or shape mismatch."""
        if data.get("version") != VIDEO_INFO_VERSION:
            raise DataFormatError(
                f"video metadata version {data.get('version')!r} is not supported (expected "
                f"{VIDEO_INFO_VERSION}); rebuild it with `vstream index`."
            )
        info = cls(
            codec=str(data["codec"]),
            width=int(data["width"]),
            height=int(data["height"]),
            time_base=(int(data["time_base"][0]), int(data["time_base"][1])),
            pts=tuple(int(p) for p in data["pts"]),
            key_indices=tuple(int(k) for k in data["key_indices"]),
            key_seek=tuple(int(k) for k in data["key_seek"]),
            average_fps=float(data["average_fps"]),
            crc32=tuple(int(c) for c in data["crc32"]) if data.get("crc32") is not None else None,
            config_crc32=int(data["config_crc32"]) if data.get("config_crc32") is not None else None,
            layout=PacketLayout.from_dict(data["packets"], len(data["pts"])) if data.get("packets") else None,
            reorder_depth=int(data["reorder_depth"]) if data.get("reorder_depth") is not None else None,
            references=tuple(int(c) for c in data["references"]) if data.get("references") is not None else None,
        )
        if info.time_base[0] <= 0 or info.time_base[1] <= 0 or info.width <= 0 or info.height <= 0:
            raise DataFormatError(
                f"video metadata has time_base {info.time_base} and size {info.width}x{info.height}; both must be "
                "positive. Rebuild it with `vstream index`."
            )
        if not info.pts or any(b <= a for a, b in zip(info.pts, info.pts[1:])):
            raise DataFormatError(
                "video metadata timestamps must be non-empty and strictly increasing; rebuild it with `vstream index`."
            )
        if info.crc32 is not None and len(info.crc32) != len(info.pts):
            raise DataFormatError(
                "video metadata has a checksum list of the wrong length; rebuild it with `vstream index`."
            )
        if info.references is not None and (
            len(info.references) != len(info.pts) or not _valid_references(info.references)
        ):
            raise DataFormatError(
                "video metadata has reference flags of the wrong length or with invalid values; rebuild it with "
                "`vstream index`."
            )
        if len(info.key_indices) != len(info.key_seek) or not info.key_indices or info.key_indices[0] != 0:
            raise DataFormatError("video metadata has inconsistent keyframe lists; rebuild it with `vstream index`.")
        if (
            any(b <= a for a, b in zip(info.key_indices, info.key_indices[1:]))
            or info.key_indices[-1] >= info.frame_count
        ):
            raise DataFormatError(
                "video metadata keyframe indices must be increasing and within the frame count; rebuild "
                "it with `vstream index`."
            )
        return info


def metadata_path(index_path: Path | str) -> Path:
    """Where the metadata sidecar of ``index_path`` lives (``index.json`` -> ``index.meta.json``)."""
    index_path = Path(index_path)
    return index_path.with_name(index_path.stem + ".meta.json")


def table_key(base: Path, path: Path) -> str:
    """Key of a camera file in the frame tables: its path relative to the index folder, ``/``-separated.

    Computed lexically (no symbolic link is resolved on either side), so the same key is found
    whichever path leads to the files: a video folder that is a symbolic link keeps its tables.

    Example::

        >>> table_key(Path("/data"), Path("/data/videos/scene-0000/CAM_FRONT.mp4"))
        'videos/scene-0000/CAM_FRONT.mp4'
    """
    return os.path.relpath(path, base).replace(os.sep, "/")


def load_metadata(index_path: Path) -> dict[str, dict[str, Any]]:
    """Entries of the JSON sidecar of ``index_path`` (empty when there is none)."""
    meta_file = metadata_path(index_path)
    where = repr(str(meta_file))
    try:
        if not meta_file.is_file():
            return {}
        raw = meta_file.read_bytes()
    except OSError as err:
        raise IndexValidationError(
            where,
            [
                (
                    f"metadata file {where} cannot be read ({err.strerror or err}); check "
                    "its permissions, or delete it and rebuild it with `vstream index`."
                )
            ],
        ) from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise IndexValidationError(
            where,
            [
                (
                    f"metadata file {where} is not valid UTF-8 (byte {err.start}); delete it "
                    "or rebuild it with `vstream index`."
                )
            ],
        ) from None
    except RecursionError:
        raise IndexValidationError(
            where, [(f"metadata file {where} nests JSON too deeply; delete it or rebuild it with `vstream index`.")]
        ) from None
    except json.JSONDecodeError as err:
        raise IndexValidationError(
            where,
            [
                (
                    f"metadata file {where} is not valid JSON ({err.msg} at line {err.lineno}, column "
                    f"{err.colno}); delete it or rebuild it with `vstream index`."
                )
            ],
        ) from None
    if not isinstance(data, dict) or data.get("format") != META_FORMAT or data.get("version") != META_VERSION:
        raise IndexValidationError(
            where,
            [
                (
                    f"metadata file {where} is not a version-{META_VERSION} lightning_vstream metadata file; "
                    "delete it or rebuild it with `vstream index`."
                )
            ],
        )
    files = data.get("files", {})
    return files if isinstance(files, dict) else {}


def cached_info(meta: Mapping[str, dict[str, Any]], key: str) -> VideoInfo | None:
    """The frame table stored under ``key`` in a JSON sidecar, with its recorded identity; None if absent."""
    entry = meta.get(key)
    if not isinstance(entry, dict):
        return None
    try:
        info = VideoInfo.from_dict(entry["info"])
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
        return None  # a damaged entry is ignored: the file is probed instead (and the user warned)
    identity = FileIdentity.from_dict(entry.get("identity"))
    if identity is None and isinstance(entry.get("size"), int):
        # Sidecars written before file identities record the size alone (see FileIdentity.size_only).
        identity = FileIdentity(entry["size"], -1, -1, -1) if entry["size"] >= 0 else None
    return dataclasses.replace(info, identity=identity) if identity is not None else info
