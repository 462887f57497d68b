"""How a clip dataset resolves a request: the clip, its camera files, their frame tables and the frames read.

:class:`RequestResolver` is the part of :class:`~lightning_vstream.clips.dataset.VideoClipDataset` that
checks requests against the index, resolves times to frames, applies the frame policy, and has
the I/O threads fetch the GOPs that remote files will need; the dataset decodes what it resolves.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from lightning_vstream.clips.planner import FramePolicy, snap_to_keyframes
from lightning_vstream.clips.selection import ClipRequest, frame_table, resolve_times
from lightning_vstream.decode.base import FrameDecoder, VideoDecodeError, VideoInfo
from lightning_vstream.errors import ConfigurationError, ConfigurationTypeError
from lightning_vstream.index import CameraStream, Clip, VideoIndex
from lightning_vstream.index.records import ClipSequence
from lightning_vstream.storage.urls import basename

if TYPE_CHECKING:
    from lightning_vstream.clips.decoders import DecoderCache

__all__ = ["RequestResolver"]

log = logging.getLogger("lightning_vstream")


class RequestResolver:
    """Checks and resolves clip requests against an index (a base of
    :class:`~lightning_vstream.clips.dataset.VideoClipDataset`, which sets the attributes below).
    """

    index: VideoIndex
    cameras: tuple[str, ...]
    requests: list[ClipRequest]
    frame_policy: FramePolicy
    on_error: Literal["raise", "skip"]
    decode_device: str
    #: Samples this process delivered as ``valid=False`` (``on_error="skip"``).
    skipped: int
    _infos: dict[Path | str, VideoInfo]
    _bad_files: set[str]
    _cache: DecoderCache | None
    _clock: int  # samples read by this process: the order in which remote GOPs are fetched

    @property
    def bad_files(self) -> int:
        """Distinct files this process could not read (``on_error="skip"``)."""
        return len(self._bad_files)

    # -- validation ---------------------------------------------------------------------------
    def _where(self) -> str:
        source = self.index.source
        return repr(basename(source) if isinstance(source, str) else source.name)

    def _position(self, request: ClipRequest, origin: str) -> int:
        try:
            return self.index.position(request.clip_id)
        except KeyError:
            known = ", ".join(repr(self.index.clip_id(i)) for i in range(min(5, len(self.index))))
            raise ConfigurationError(
                f"{origin}: clip {request.clip_id!r} is not in the index {self._where()} (clips include {known}); "
                "check the clip id, or rebuild the index with `vstream index`."
            ) from None

    def _check_names(self, request: ClipRequest, has: Sequence[str], origin: str) -> list[str]:
        names = list(request.cameras if request.cameras is not None else self.cameras)
        missing = [n for n in names if n not in has]
        if missing:
            raise ConfigurationError(
                f"{origin}: clip {request.clip_id!r} has no camera(s) {missing} (it has {list(has)}); "
                "request cameras that the index lists, or load the index with those cameras."
            )
        return names

    def _check_frames(self, request: ClipRequest, frame_count: int, origin: str) -> None:
        for f in request.frames:
            if not 0 <= f < frame_count:
                raise IndexError(
                    f"{origin}: frame {f} is out of range for clip {request.clip_id!r}, which has "
                    f"{frame_count} frames (valid: 0..{frame_count - 1}) in {self._where()}."
                )

    def _check_request(self, request: ClipRequest, origin: str) -> None:
        """:meth:`_check` without building the clip where the index holds its clips as arrays."""
        clips = self.index.clips
        if not isinstance(clips, ClipSequence):
            self._check(request, origin)
            return
        position = self._position(request, origin)
        self._check_names(request, clips.camera_names, origin)
        self._check_frames(request, int(clips.frame_counts[position]), origin)

    def _check(self, request: ClipRequest, origin: str) -> tuple[Clip, list[CameraStream]]:
        clip = self.index.clips[self._position(request, origin)]
        by_name = {cam.name: cam for cam in clip.cameras}
        names = self._check_names(request, list(by_name), origin)
        self._check_frames(request, clip.frame_count, origin)
        return clip, [by_name[n] for n in names]

    def _info(self, cam: CameraStream) -> VideoInfo:
        info = self._infos.get(cam.path)
        if info is None:
            info = cam.info
        if info is None:
            # Only probed tables are kept here: the index's frame tables keep the recently used
            # ones, so reading every file of a large index does not keep every table in memory.
            info = self._infos[cam.path] = frame_table(cam, self.index.storage)
        return info

    def _resolve(
        self, item: int | ClipRequest, *, ahead: bool = False
    ) -> tuple[Clip, list[CameraStream], list[VideoInfo], list[int], ClipRequest, str]:
        """The clip, camera streams, their frame tables, the frame indices ``item`` returns, the request and
        where it came from (for errors). Frame tables are empty when the first camera cannot be probed, or
        a file does not hold the frames asked for, under ``on_error="skip"`` (``ahead``: raise, a sample
        announced ahead is skipped when it is read)."""
        if isinstance(item, ClipRequest):
            request, origin = item, "request"
        else:
            if isinstance(item, bool) or not hasattr(item, "__index__"):
                hint = (
                    f"; to read clip {item!r}, pass a request such as dataset[at_indices({item!r}, [0, 1, 2])]"
                    if isinstance(item, str)
                    else ""
                )
                raise ConfigurationTypeError(
                    f"VideoClipDataset is indexed by request position (an int in 0..{len(self.requests) - 1}) or "
                    f"by a ClipRequest, not by a {type(item).__name__} ({item!r}){hint}."
                )
            item = item.__index__()
            if not -len(self.requests) <= item < len(self.requests):
                raise IndexError(f"request {item} is out of range: the dataset holds {len(self.requests)} requests.")
            request, origin = self.requests[item], f"requests[{item}]"
        clip, streams = self._check(request, origin)
        try:
            reference = self._info(streams[0])
        except (VideoDecodeError, OSError) as err:  # the file cannot even be probed
            if self.on_error == "raise":
                raise
            label = f"clip {clip.clip_id!r}, camera {streams[0].name!r}"
            self._skip(streams[0].path, label, err)
            return clip, streams, [], [], request, origin
        if request.times:
            label = f"clip {clip.clip_id!r}, camera {streams[0].name!r}"
            indices = resolve_times(
                reference, request.times, policy=request.policy, frame_count=clip.frame_count, where=label
            )
        else:
            indices = list(request.frames)
        if self.frame_policy == "nearest_keyframe":
            indices = snap_to_keyframes(indices, reference)
        infos = [self._info(cam) for cam in streams]
        for cam, info in zip(streams, infos):
            if indices and max(indices) >= info.frame_count:  # a data fault (skippable), not a request out of range
                label = f"clip {clip.clip_id!r}, camera {cam.name!r}"
                fault = VideoDecodeError(
                    f"{label} ({str(cam.path)!r}): the index lists {clip.frame_count} frames, but the file holds "
                    f"{info.frame_count}, so frame {max(indices)} cannot be read. Re-run `vstream index` to rebuild "
                    "the index."
                )
                if self.on_error == "raise" or ahead:
                    raise fault
                self._skip(cam.path, label, fault)
                return clip, streams, [], [], request, origin
        return clip, streams, infos, indices, request, origin

    def _announce(self, reads: Sequence[tuple[FrameDecoder, Sequence[int]]], *, ahead: int = 0) -> None:
        """Have the I/O threads fetch every GOP the ``(decoder, frames)`` reads of remote files need, at once
        (merged where adjacent).

        The decoders then find each GOP fetched or on its way, so a sample waits for one round trip,
        not one per GOP. ``ahead`` orders fetches for later samples after those of the current one.
        """
        from lightning_vstream.decode.gop_reads import GopDecoder

        for decoder, indices in reads:
            if isinstance(decoder, GopDecoder):
                decoder.fetcher.prefetch(decoder.units_for(indices), due=self._clock + ahead)
        self._clock += 1 if ahead == 0 else 0

    def prefetch(self, items: Sequence[int | ClipRequest]) -> None:
        """Start fetching the GOPs of remote files that ``items`` will need (the samples asked for next).

        Nothing is decoded and no decoder is opened; the bytes wait in this process's bounded
        prefetch memory (or the node cache) for the decoders. Local files are left alone. Samples
        that cannot be resolved are skipped here (they raise, or are skipped, when read).
        """
        if self.index.storage is None or self.decode_device != "cpu":
            return
        from lightning_vstream.decode.gop_reads import gop_runs
        from lightning_vstream.storage.fetcher import fetcher_for

        fetcher = fetcher_for(self.index.storage)
        for ahead, item in enumerate(items, start=1):
            try:
                _, streams, infos, indices, _, _ = self._resolve(item, ahead=True)
            except (VideoDecodeError, ConfigurationError, IndexError, OSError):
                continue
            for cam, info in zip(streams, infos):
                if info.layout is not None and isinstance(cam.path, str):
                    fetcher.prefetch(gop_runs(cam.path, info).units_for(info, indices), due=self._clock + ahead)

    def _skip(self, path: Path | str, label: str, err: Exception, *, count: bool = True) -> None:
        self.skipped += count
        if self._cache is not None and path in self._cache:
            self._cache.drop(path)
        if str(path) not in self._bad_files:
            self._bad_files.add(str(path))
            log.warning("skipping samples of %s (%s): %s", label, str(path), err)
