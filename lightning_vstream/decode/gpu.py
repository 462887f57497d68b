"""NVIDIA GPU decoding with PyNvVideoCodec (NVDEC), frame-exact, frames never visiting host memory.

How a frame travels:

1. **demux** (CPU): PyAV reads the compressed packets, checks them against the frame table's
   CRC-32s and converts H.264/H.265 to the Annex-B form NVDEC's parser needs
   (:class:`~lightning_vstream.decode.nvdec.PacketSource`). PyAV rather than PyNvVideoCodec's
   demuxer because seeking must use the frame table's seek targets exactly as
   :class:`~lightning_vstream.decode.cpu.PyAVDecoder` does.
2. **decode** (GPU): a PyNvVideoCodec decoder decodes to NV12 (P016 for 10-bit) in device memory,
   on a CUDA stream that is never the NULL stream. Each packet carries its presentation timestamp,
   and every frame that comes out is checked against the frame table, so a frame is never returned
   under the wrong index. Latency mode ``NATIVE`` keeps NVDEC pipelined; ``LOW`` is used only for
   streams whose frame table records no reordering (no B-frames).
3. **hand-off and colour** (GPU): ``DecodedFrame.__dlpack__(stream=...)`` wraps the decoder's
   surface without a copy, and one fused kernel
   (:class:`~lightning_vstream.decode.nv12.Nv12Converter`) converts it with the stream's own matrix
   and range (FFmpeg's rules, so GPU frames match CPU frames) straight into the caller's tensor.
   The surface is the decoder's single output buffer, which its next ``Decode`` overwrites: the
   conversion is queued on the decoder's stream before that call, so the stream orders them.

Per frame the host does one ``Decode`` call, one DLPack import and one kernel launch: no NVTX
range, no stream wait and no host synchronisation. With ``stream="current"`` (the stream engine's
decode threads) a decoder runs on the calling thread's stream and nothing at all needs ordering;
with its own stream (the default) the caller's stream waits for the decoder's, one event per frame.

Decoders are expensive to create (tens of milliseconds), so closed :class:`NvDecoder` s hand theirs
back to a :class:`~lightning_vstream.decode.nvdec.DecoderPool`, and the next file with the same GPU,
codec, size, bit depth and chroma format takes it instead of creating one. A pool is per process.

PyNvVideoCodec is imported only when a decoder first opens a file: on machines without an NVIDIA
driver its import fails, and the CPU path never touches it.
"""

from __future__ import annotations

import collections
import functools
import os
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from lightning_vstream.decode import nvdec_packets
from lightning_vstream.decode.base import (
    DecoderBase,
    Layout,
    VideoDecodeError,
    VideoInfo,
)
from lightning_vstream.decode.device import (
    GPU_INSTALL_HINT,
    DecodeDevice,
    FrameMemory,
    frame_memory,
    import_pynvvideocodec,
    nvdec_available,
    resolve_decode_device,
)
from lightning_vstream.decode.nv12 import Backend, Nv12Converter
from lightning_vstream.decode.nvdec import (
    DecoderKey,
    DecoderPool,
    Latency,
    PacketSource,
    Session,
    check_decodable,
    create_session,
    shared_decoder_pool,
)
from lightning_vstream.decode.nvdec_packets import LayoutSource
from lightning_vstream.errors import ConfigurationError, ConfigurationTypeError, DecoderCapabilityError, UsageError
from lightning_vstream.profiling import RANGE_DEMUX, nvtx_range

if TYPE_CHECKING:
    import torch

__all__ = [
    "GPU_INSTALL_HINT",
    "DecodeDevice",
    "DecoderKey",
    "DecoderPool",
    "LatencyChoice",
    "NvDecoder",
    "StreamChoice",
    "import_pynvvideocodec",
    "nvdec_available",
    "prepare_decoders",
    "resolve_decode_device",
    "shared_decoder_pool",
]

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


# -- the decoder -------------------------------------------------------------------------------
class NvDecoder(DecoderBase):
    """Frame-exact decoder for one video file on an NVIDIA GPU (NVDEC via PyNvVideoCodec).

    Behaves like :class:`~lightning_vstream.decode.cpu.PyAVDecoder`, with frames returned as
    uint8 RGB CUDA tensors: opens lazily on first use; sequential :meth:`read` calls keep the
    decoder's state and decode each frame once; :meth:`seek` decodes forward within the current
    GOP and otherwise jumps to the keyframe at or before the target (stepping back a GOP if the
    demuxer overshoots); every packet's CRC-32 and every frame's timestamp is checked against the
    frame table. On a jump, frames still inside the decoder are flushed and discarded (not counted
    in :attr:`frames_decoded`). :meth:`close` flushes the decoder and returns it to ``pool`` for
    the next file of the same format.

    Work is ordered on CUDA streams, never by waiting on the host. A returned frame is ready for
    whatever the stream current at the call runs next; with ``out`` it is written there, in place.

    Args:
        path: Video file.
        info: Frame table, if already known (from an index's metadata); probed with PyAV otherwise.
        device: CUDA device (or GPU ordinal) to decode on; see :func:`resolve_decode_device`.
        layout: ``"chw"`` (default) or ``"hwc"`` for the returned tensors.
        label: Where the file comes from (clip and camera), used in error messages.
        pool: Pool to take decoders from and return them to; :func:`shared_decoder_pool` if None.
        latency: ``"auto"`` (default) uses NVDEC's ``LOW`` latency mode only for streams whose
            frame table records no reordering (``reorder_depth == 0``), ``NATIVE`` otherwise;
            ``"native"`` / ``"low"`` force one (``"low"`` on a stream with B-frames, or of unknown
            reordering, is refused).
        stream: ``"own"`` (default): the decoder runs on a CUDA stream of its own and the caller's
            stream waits for it at each frame. ``"current"``: it runs on the stream current when
            the file opens, and every later call must be made with that stream current; frames
            then need no ordering at all (the stream engine's decode threads do this).
        memory: Where frames live (:func:`~lightning_vstream.decode.device.frame_memory` when None).
        backend: Colour conversion: ``"auto"`` (the fused Triton kernel on a GPU when Triton
            imports, torch otherwise), ``"triton"`` or ``"torch"``.

    Raises:
        ValueError: ``layout``, ``latency``, ``stream`` or ``device`` is not supported.

    Example::

        >>> dec = NvDecoder("clip/CAM_FRONT.mp4", device="cuda:0")  # doctest: +SKIP
        >>> dec.get(17).shape, dec.get(17).device  # doctest: +SKIP
        (torch.Size([3, 900, 1600]), device(type='cuda', index=0))
    """

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
        self._source: PacketSource | LayoutSource | None = None
        self._convert: Any = None  # the open file's Nv12Converter
        self._import: Any = None  # FrameMemory.import_surface of the open file's memory
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
            from lightning_vstream.decode.cpu import probe_video

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

    # -- opening and closing ----------------------------------------------------------------
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

    def _open(self) -> None:
        info = self.info
        where = self._where()
        if info.identity is not None:
            # As on the CPU: a file that differs from its index entry is re-verified packet by packet
            # (FileChangedError if its content changed) before any frame is decoded.
            self._info = info = _verified(self.path, info, where)
        nvc = import_pynvvideocodec()
        memory = self.memory
        source = self._packet_source(info, where)
        try:
            fmt = source.format
            check_decodable(self.gpu, fmt, where)
            latency = self._latency_for(fmt.reorder_depth)
            stream = memory.current_stream(self.gpu) if self.stream == "current" else None
            if stream is not None and not stream.cuda_stream:
                stream = None  # never the NULL stream: a stream of its own instead
            key = DecoderKey(
                self.gpu,
                fmt.codec,
                info.width,
                info.height,
                fmt.bit_depth,
                fmt.chroma,
                "NATIVE",
                latency,
                stream.cuda_stream if stream is not None else 0,
            )
            convert = _converter(fmt.color, info.height, info.width, self.layout, memory.device(self.gpu), self.backend)
        except BaseException:
            source.close()
            raise
        try:
            session = self.pool.acquire(key, lambda: create_session(nvc, key, memory, stream))
        except Exception as err:
            source.close()
            raise VideoDecodeError(f"{where}: creating the NVDEC decoder failed: {err}") from err
        self._nvc, self._key, self._session, self._source = nvc, key, session, source
        self._convert = convert
        self._import = memory.import_surface
        self._count = info.frame_count
        self._pts_lookup = info.pts_index.get
        self._decode = session.decoder.Decode
        self._stream = session.stream
        self._data = nvc.PacketData()
        self._ordered = memory.host or stream is not None
        self._low = latency == "LOW"
        if self._low:  # DisplayDecodeLatencyType.LOW needs every packet to end its picture
            self._data.decode_flag = nvc.VideoPacketFlag.ENDOFPICTURE
        # What every frame's DLPack export must look like: NV12 (uint8) or P016 (16-bit), (1.5 H, W), rows
        # of W samples. PyNvVideoCodec before 2.2.4 exports P016 with strides (W, 2): a wrong view.
        self._surface_layout = ((info.height * 3 // 2, info.width), (info.width, 1), 1 if fmt.bit_depth <= 8 else 2)
        self._queue.clear()
        self._dirty = False  # fresh decoders and pooled ones (flushed on release) hold nothing
        self._ended = False
        self._last = -1

    def _packet_source(self, info: VideoInfo, where: str) -> PacketSource | LayoutSource:
        """Where the file's packets come from: its own bytes once their layout is known, else PyAV's demuxer.

        A file's layout is worked out while PyAV demuxes it, chunk by chunk as readings of the file go through
        them (:class:`~lightning_vstream.decode.nvdec_packets.LayoutRecorder`), and kept for the process;
        files whose packets cannot be read from their bytes exactly as the demuxer gives them stay with it.
        """
        if not nvdec_packets.READ_FROM_LAYOUT:
            return PacketSource(self.path, info, where)
        path = self.path
        known, layout = nvdec_packets.cached_layout(path)
        if isinstance(layout, nvdec_packets.FileLayout):
            return LayoutSource(path, info, where, layout)
        source = PacketSource(path, info, where)
        if known and layout is None:
            return source  # its packets cannot be read from its bytes
        partial = layout if layout is not None else source.partial_layout()
        if not known:
            nvdec_packets.keep_layout(path, partial)
        if partial is not None:
            source.record_layout(
                nvdec_packets.LayoutRecorder(path, info, partial, lambda found: nvdec_packets.keep_layout(path, found))
            )
        return source

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
        self._count = 0
        self._decode = self._stream = self._data = None
        self._queue.clear()
        self._needs_seek = True

    def close(self) -> None:
        target = self._target
        self._reset()
        self._target = target

    def __enter__(self) -> NvDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- positioning ------------------------------------------------------------------------
    def seek(self, index: int) -> None:
        info = self.info
        if not 0 <= index < info.frame_count:
            raise IndexError(
                f"frame {index} is out of range for {self._where()}, which holds "
                f"{info.frame_count} frames (valid: 0..{info.frame_count - 1})."
            )
        if index == self._target and not self._needs_seek:
            return  # already there: the sequential case costs nothing
        forward_ok = (
            self._session is not None
            and not self._needs_seek
            and info.keyframe_at_or_before(index) <= self._next <= index
        )
        self._target = index
        self._needs_seek = not forward_ok

    def _jump(self, key_ordinal: int) -> None:
        """Flush the decoder and position the demuxer on keyframe ``key_ordinal``."""
        if self._session is None:
            self._open()
        source = self._source
        if source is None:  # pragma: no cover - _open sets it or raises
            raise UsageError("internal error: no packet source after opening")
        self._flush()
        with nvtx_range(RANGE_DEMUX):
            source.seek_key(key_ordinal)
        self._seeks += 1
        self._ended = False
        self._last = -1

    # -- decoding ---------------------------------------------------------------------------
    def read(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """Decode the frame at :attr:`position` (into ``out`` when given) and advance by one.

        Args:
            out: A uint8 tensor of the frame's shape on :attr:`device` (any strides, for example a
                row of a batch) to write the RGB frame into; the conversion writes it once, directly.
        """
        if self._session is None or self._needs_seek or self._target >= self._count:
            return self._read_positioned(out)
        return self.get(self._target, out)

    def get(self, index: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Return frame ``index`` (see :meth:`seek` for the cost), written into ``out`` when given."""
        if index != self._target or self._session is None or self._needs_seek or index >= self._count:
            if index != self._target or self._needs_seek or index < 0:
                self.seek(index)
            return self._read_positioned(out)
        # The next frame of an open file: the streaming case, once per frame. Every frame still goes
        # through the same checks as after a seek: its timestamp (in _feed), its index and its export.
        queue = self._queue
        while not queue:
            self._feed(index)
        taken, frame = queue.popleft()
        if taken != index:
            taken, frame = self._catch_up(index, taken, frame, -1)
        self._last = taken
        if self._ordered:  # the decoder runs on the caller's stream: the conversion follows its work
            surface = self._import(frame, self._stream)
            if (surface.shape, surface.stride(), surface.element_size()) != self._surface_layout:
                raise self._surface_error(surface, taken)
            tensor = self._convert(surface, out)
        else:
            tensor = self._to_tensor(frame, taken, out)
        self._target = taken + 1
        return tensor

    def _read_positioned(self, out: torch.Tensor | None) -> torch.Tensor:
        """:meth:`read` when the file is not open yet, a seek is pending, or the file has no frame at the position."""
        info = self._info if self._info is not None else self.info
        target = self._target
        if target >= info.frame_count:
            raise IndexError(
                f"{self._where()} has no frame {target}: it holds {info.frame_count} frames "
                f"(valid: 0..{info.frame_count - 1})."
            )
        key_ordinal = -1  # the GOP jumped to; -1 when reading on from where the decoder is
        if self._session is None or self._needs_seek:
            key_ordinal = info.gop_of(target)
            if self._session is None:
                self._open()
                # A fresh file starts at its first keyframe: no seek needed for the first GOP.
                self._needs_seek = key_ordinal != 0
            if self._needs_seek:
                self._jump(key_ordinal)
                self._needs_seek = False
            else:
                key_ordinal = -1
        queue = self._queue
        while not queue:
            self._feed(target)
        index, frame = queue.popleft()
        if index != target:
            index, frame = self._catch_up(target, index, frame, key_ordinal)
        self._last = index
        tensor = self._to_tensor(frame, index, out)
        self._target = index + 1
        return tensor

    def _catch_up(self, target: int, index: int, frame: Any, key_ordinal: int) -> tuple[int, Any]:
        """Take frames out of the decoder until frame ``target``'s; ``index`` (not ``target``) came out first.

        Frames before ``target`` are passed over. A frame past it means the demuxer landed past the
        wanted keyframe after a jump to GOP ``key_ordinal`` (then the jump steps back one GOP), or
        frames are missing (:class:`VideoDecodeError`).
        """
        queue = self._queue
        while True:
            before = self._last
            self._last = index
            if index == target:
                return index, frame
            if index > target:
                if key_ordinal > 0:
                    # The demuxer landed past the wanted keyframe; step back one GOP.
                    key_ordinal -= 1
                    self._jump(key_ordinal)
                else:
                    self._reset(reusable=False)
                    raise VideoDecodeError(
                        f"{self._where(target)}: the decoder skipped from frame {before} to frame {index}; "
                        "the frames between are missing or corrupt."
                    )
            while not queue:
                self._feed(target)
            index, frame = queue.popleft()

    def _feed(self, keep_from: int) -> None:
        """Send the next packet, or the end of the stream, to the decoder; queue the frames from ``keep_from`` on.

        Frames before ``keep_from`` are dropped without touching their pixels.
        """
        source, nvc = self._source, self._nvc
        if source is None or nvc is None:  # pragma: no cover - read() opens first
            raise UsageError("internal error: decoding from a closed NvDecoder")
        if self._ended:
            target = self._target
            self._reset(reusable=False)
            raise VideoDecodeError(
                f"{self._where(target)}: the file ended before this frame although its frame "
                f"table lists {self.info.frame_count} frames (truncated file?)."
            )
        data = self._data
        try:
            more = source.fill(data)
        except VideoDecodeError:
            self._reset(reusable=False)
            raise
        except Exception as err:
            import av

            if not isinstance(err, av.FFmpegError):
                raise
            target = self._target
            self._reset(reusable=False)
            raise VideoDecodeError(f"{self._where(target)}: demuxing failed: {err}") from err
        try:
            if more:
                # The source keeps the bytes data points at until its next fill, after Decode has returned.
                self._dirty = True
                frames = self._decode(data)
            else:
                frames = self._decode(nvc.PacketData())
                self._ended, self._dirty = True, False
        except VideoDecodeError:
            self._reset(reusable=False)
            raise
        except Exception as err:
            target = self._target
            self._reset(reusable=False)
            raise VideoDecodeError(f"{self._where(target)}: NVDEC decoding failed: {err}") from err
        if not frames:
            return
        lookup = self._pts_lookup
        for frame in frames:
            self._frames_decoded += 1
            pts = frame.getPTS()
            index = lookup(pts)
            if index is None:
                target = self._target
                self._reset(reusable=False)
                raise VideoDecodeError(
                    f"{self._where(target)}: the decoder produced a frame with timestamp {pts!r}, which "
                    "is not in the file's frame table (corrupt file, or a stale index: rebuild it with "
                    "`vstream index`)."
                )
            if index >= keep_from:
                self._queue.append((index, frame))
            else:
                self._last = index

    def _surface_error(self, surface: torch.Tensor, index: int) -> DecoderCapabilityError:
        shape, strides, itemsize = self._surface_layout
        version = getattr(self._nvc, "__version__", "unknown")
        target = self._target
        self._reset(reusable=False)
        return DecoderCapabilityError(
            f"{self._where(target)}: PyNvVideoCodec {version} exported frame {index} as a {surface.dtype} "
            f"surface of shape {tuple(surface.shape)} with strides {tuple(surface.stride())}; expected "
            f"{'NV12' if itemsize == 1 else 'P016'} {shape} with strides {strides}. Reading it would give wrong "
            "pixels; install pynvvideocodec>=2.2.4, or decode this file with decode_device='cpu'."
        )

    def _to_tensor(self, frame: Any, index: int, out: torch.Tensor | None) -> torch.Tensor:
        session, convert = self._session, self._convert
        if session is None or convert is None:  # pragma: no cover - read() opens first
            raise UsageError("internal error: converting on a closed NvDecoder")
        if self._ordered:  # the decoder runs on the caller's stream: the conversion follows its work
            surface = self._import(frame, session.stream)
            if (surface.shape, surface.stride(), surface.element_size()) != self._surface_layout:
                raise self._surface_error(surface, index)
            return convert(surface, out)
        import torch

        stream = session.stream
        consumer = self.memory.current_stream(self.gpu)
        if out is not None:
            stream.wait_stream(consumer)  # the caller's earlier use of `out` comes first
        with torch.cuda.stream(stream):
            surface = self._import(frame, stream)
            if (surface.shape, surface.stride(), surface.element_size()) != self._surface_layout:
                raise self._surface_error(surface, index)
            result = convert(surface, out)
        consumer.wait_stream(stream)
        if out is None:
            result.record_stream(consumer)
        return result

    def __repr__(self) -> str:
        state = "open" if self._session is not None else "closed"
        return f"NvDecoder({str(self.path)!r}, gpu={self.gpu}, position={self._target}, {state})"


@functools.lru_cache(maxsize=64)
def _converter(spec: Any, height: int, width: int, layout: Layout, device: Any, backend: Backend) -> Nv12Converter:
    """The converter of a stream format (it holds no state of its own, so files of one format share it)."""
    return Nv12Converter(spec, height, width, layout=layout, device=device, backend=backend)


#: (path, identity recorded in the index) -> the file's stat (size, modification and change times, inode,
#: device) when it last matched that identity. A file not written since (any write changes its change time)
#: still matches, so later openings in this process skip reading its fingerprint again.
_MATCHED: dict[tuple[str, Any], tuple[int, ...]] = {}
_MATCHED_KEPT = 65536


def _verified(path: Path, info: VideoInfo, where: str) -> VideoInfo:
    """:func:`~lightning_vstream.index.identity.verify_identity`, skipped for a file unchanged since it matched."""
    from lightning_vstream.decode.cpu import probe_video
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


def prepare_decoders(
    files: list[tuple[Path, VideoInfo | None]],
    count: int,
    *,
    gpu: int,
    pool: DecoderPool | None = None,
    memory: FrameMemory | None = None,
    latency: LatencyChoice = "native",
) -> int:
    """Create ``count`` decoders per format of ``files`` on the calling thread's stream, ready in ``pool``.

    NVDEC allocates a decoder's surfaces outside torch's allocator when the decoder meets its first
    sequence header, and running out of GPU memory there ends the process instead of raising. So
    the decoders a decode thread will need are created here, before training starts: for each file
    (one per format: codec, size, bit depth), ``count`` decoders each decode the file's first frame
    and go back to the pool (flushed), where the thread's later files find them. Files that cannot
    be decoded are skipped here: they fail, or fall back to the CPU, when they are read.

    Args:
        files: One ``(path, frame table)`` per format to prepare for.
        count: Decoders per format (the streams the calling thread decodes at once).
        gpu: GPU ordinal.
        pool: Where the decoders go (:func:`shared_decoder_pool` when None); it keeps at least
            ``count`` idle decoders per format.
        memory: Where frames live (:func:`~lightning_vstream.decode.device.frame_memory` when None).
        latency: The latency mode the thread's decoders will ask for (part of a decoder's key).

    Returns:
        The number of decoders created.

    Example::

        >>> prepare_decoders([(Path("clip/CAM_FRONT.mp4"), None)], 6, gpu=0)  # doctest: +SKIP
        6
    """
    pool = pool if pool is not None else shared_decoder_pool()
    pool.max_idle_per_key = max(pool.max_idle_per_key, count)
    created = pool.stats["created"]
    for path, info in files:
        opened = [
            NvDecoder(path, info=info, device=gpu, pool=pool, stream="current", memory=memory, latency=latency)
            for _ in range(count)
        ]
        try:
            for decoder in opened:
                decoder.get(0)
        except (DecoderCapabilityError, VideoDecodeError, OSError):
            pass  # the file fails (or falls back to the CPU) when it is read, under the loader's error policy
        finally:
            for decoder in opened:
                decoder.close()
    return pool.stats["created"] - created
