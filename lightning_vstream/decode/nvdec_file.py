"""An NVDEC decoder's open file: its frame table, packet source, pooled decoder session and colour converter.

:class:`NvFile` is the file-holding half of :class:`~lightning_vstream.decode.gpu.NvDecoder` (which adds
opening, positioning and decoding): the constructor's checks, the properties, the per-file state
looked up once per file rather than per frame, and closing, which flushes the decoder and hands it
back to its :class:`~lightning_vstream.decode.decoder_pool.DecoderPool` for the next file of the same
format. A file whose identity matched its index entry once is not fingerprinted again while it is
unchanged (:func:`verified`).
"""

from __future__ import annotations

import collections
import functools
import os
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from lightning_vstream.decode.base import DecoderBase, Layout, VideoInfo
from lightning_vstream.decode.decoder_pool import DecoderPool, shared_decoder_pool
from lightning_vstream.decode.device import FrameMemory, frame_memory
from lightning_vstream.decode.nv12 import Backend, Nv12Converter
from lightning_vstream.decode.nvdec import DecoderKey, Latency, Session
from lightning_vstream.decode.nvdec_sources import PacketSource, TableSource
from lightning_vstream.errors import ConfigurationError, ConfigurationTypeError

if TYPE_CHECKING:
    import torch

__all__ = ["LatencyChoice", "NvFile", "StreamChoice", "converter_for", "verified"]

LatencyChoice = Literal["auto", "native", "low"]
StreamChoice = Literal["own", "current"]


def _gpu_ordinal(device: Any) -> int:
    if isinstance(device, bool):
        raise ConfigurationTypeError(f"device={device!r} must be a CUDA device or GPU ordinal.")
    if isinstance(device, int):
        index = device
    else:
        import torch

        dev = torch.device(device)
        if dev.type != "cuda":
            raise ConfigurationError(
                f"NvDecoder decodes on an NVIDIA GPU, but device={str(dev)!r}; use PyAVDecoder "
                "(decode_device='cpu') for CPU decoding."
            )
        index = dev.index if dev.index is not None else 0
    if index < 0:
        raise ConfigurationError(f"device={device!r}: the GPU ordinal must be >= 0.")
    return index


_D = TypeVar("_D", bound="NvFile")


class NvFile(DecoderBase):
    """The open file of an :class:`~lightning_vstream.decode.gpu.NvDecoder` (see the module docs; the
    arguments are :class:`~lightning_vstream.decode.gpu.NvDecoder`'s)."""

    def __init__(
        self,
        path: Path | str,
        *,
        info: VideoInfo | None = None,
        device: torch.device | str | int = 0,
        layout: Layout = "chw",
        label: str = "",
        pool: DecoderPool | None = None,
        latency: LatencyChoice = "auto",
        stream: StreamChoice = "own",
        memory: FrameMemory | None = None,
        backend: Backend = "auto",
    ) -> None:
        if layout not in ("chw", "hwc"):
            raise ConfigurationError(f"layout={layout!r} is not supported; use 'chw' or 'hwc'.")
        if latency not in ("auto", "native", "low"):
            raise ConfigurationError(f"latency={latency!r} is not supported; use 'auto', 'native' or 'low'.")
        if stream not in ("own", "current"):
            raise ConfigurationError(f"stream={stream!r} is not supported; use 'own' or 'current'.")
        if backend not in ("auto", "triton", "torch"):
            raise ConfigurationError(f"backend={backend!r} is not supported; use 'auto', 'triton' or 'torch'.")
        self.path = path if isinstance(path, Path) else Path(path)
        self.gpu = _gpu_ordinal(device)
        self.layout = layout
        self.label = label
        self.latency = latency
        self.stream = stream
        self.backend = backend
        self._memory = memory
        self._pool = pool
        self._info = info
        self._nvc: ModuleType | None = None
        self._key: DecoderKey | None = None
        self._session: Session | None = None
        self._source: PacketSource | TableSource | None = None
        self._convert: Any = None  # the open file's Nv12Converter
        self._import: Any = None  # FrameMemory.import_surface of the open file's memory
        self._surfaces: dict[int, Any] = {}  # the session's output buffers imported for this file, by address
        self._ordered = False  # frames need no stream ordering (decoder on the caller's stream, or host memory)
        self._low = False  # LOW latency: every packet ends its picture
        self._surface_layout: tuple[Any, ...] = ()
        # Of the open file, looked up once per file rather than per frame: its frame count, its
        # pts -> frame index lookup, the decoder's Decode, its stream, and the one PacketData every
        # packet is sent in (the parser copies the bytes during Decode, so it can be refilled).
        self._count = 0
        self._pts_lookup: Any = None
        self._decode: Any = None
        self._stream: Any = None
        self._data: Any = None
        # Frames out of the decoder, not yet returned: (index, DecodedFrame). A DecodedFrame stays
        # valid until the next Decode call, and Decode is called only when this queue is empty.
        self._queue: collections.deque[tuple[int, Any]] = collections.deque()
        self._dirty = False  # packets were fed since the decoder last flushed
        self._ended = False  # the end of the file has been fed to the decoder
        self._last = -1  # index of the last frame taken out of the decoder; -1 when unknown
        self._target = 0
        self._needs_seek = False
        self._frames_decoded = 0
        self._seeks = 0

    # -- properties -------------------------------------------------------------------------
    @property
    def info(self) -> VideoInfo:
        if self._info is None:
            from lightning_vstream.decode.probe import probe_video

            self._info = probe_video(self.path)
        return self._info

    @property
    def memory(self) -> FrameMemory:
        """Where frames live and how they reach torch."""
        if self._memory is None:
            self._memory = frame_memory()
        return self._memory

    @property
    def device(self) -> torch.device:
        """The device frames are returned on (the GPU; the CPU only under a test driver's host memory)."""
        return self.memory.device(self.gpu)

    @property
    def seeks(self) -> int:
        """Number of demuxer seeks performed."""
        return self._seeks

    @property
    def pool(self) -> DecoderPool:
        """The pool decoders come from and go back to."""
        if self._pool is None:
            self._pool = shared_decoder_pool()
        return self._pool

    @property
    def key(self) -> DecoderKey | None:
        """The key of the decoder in use (None while closed)."""
        return self._key

    @property
    def _next(self) -> int:
        """Index of the next frame the decoder pipeline yields (-1 when unknown)."""
        if self._queue:
            return self._queue[0][0]
        return self._last + 1 if self._last >= 0 else -1

    def _latency_for(self, reorder_depth: int | None) -> Latency:
        if self.latency == "native":
            return "NATIVE"
        if self.latency == "low":
            if reorder_depth is None:
                raise ConfigurationError(
                    f"{self._where()}: latency='low' needs to know that the stream has no B-frames, and its frame "
                    "table does not record it; rebuild the index with `vstream index`, or use latency='auto'."
                )
            if reorder_depth:
                raise ConfigurationError(
                    f"{self._where()} reorders frames (B-frames), so latency='low' would return frames out of "
                    "order; use latency='auto' or 'native'."
                )
            return "LOW"
        return "LOW" if reorder_depth == 0 else "NATIVE"

    def _flush(self) -> None:
        """Send the end of stream so the decoder drops its state; discard the frames it returns."""
        self._queue.clear()  # their surfaces die with the next Decode
        if self._dirty and self._session is not None and self._nvc is not None:
            self._session.decoder.Decode(self._nvc.PacketData())
        self._dirty = False

    def _reset(self, *, reusable: bool = True) -> None:
        """Close the file; flush the decoder and return it to the pool (or drop it after a failure)."""
        session, key = self._session, self._key
        if session is not None and key is not None and reusable:
            try:
                self._flush()
            except Exception:
                reusable = False
            if reusable:
                self.pool.release(key, session)
        if self._source is not None:
            try:
                self._source.close()
            except Exception:
                pass
        self._session = None
        self._key = None
        self._source = None
        self._convert = None
        self._surfaces = {}
        self._count = 0
        self._decode = self._stream = self._data = None
        self._queue.clear()
        self._needs_seek = True

    def close(self) -> None:
        target = self._target
        self._reset()
        self._target = target

    def __enter__(self: _D) -> _D:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@functools.lru_cache(maxsize=64)
def converter_for(spec: Any, height: int, width: int, layout: Layout, device: Any, backend: Backend) -> Nv12Converter:
    """The converter of a stream format (it holds no state of its own, so files of one format share it)."""
    return Nv12Converter(spec, height, width, layout=layout, device=device, backend=backend)


#: (path, identity recorded in the index) -> the file's stat (size, modification and change times, inode,
#: device) when it last matched that identity. A file not written since (any write changes its change time)
#: still matches, so later openings in this process skip reading its fingerprint again.
_MATCHED: dict[tuple[str, Any], tuple[int, ...]] = {}
_MATCHED_KEPT = 65536


def verified(path: Path, info: VideoInfo, where: str) -> VideoInfo:
    """:func:`~lightning_vstream.index.identity.verify_identity`, skipped for a file unchanged since it matched."""
    from lightning_vstream.decode.probe import probe_video
    from lightning_vstream.index.identity import verify_identity

    key = (str(path), info.identity)
    try:
        st = os.stat(path)
        stamp: tuple[int, ...] | None = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
    except OSError:
        stamp = None
    if stamp is not None and _MATCHED.get(key) == stamp:
        return info
    checked = verify_identity(path, info, where, probe=probe_video)
    if stamp is not None and checked is info:
        if len(_MATCHED) >= _MATCHED_KEPT:
            _MATCHED.clear()
        _MATCHED[key] = stamp
    return checked
