"""NVIDIA GPU decoding with PyNvVideoCodec (NVDEC), frame-exact, frames never visiting host memory.

How a frame travels:

1. **demux** (CPU): PyAV reads the compressed packets, checks them against the frame table's
   CRC-32s and converts H.264/H.265 to the Annex-B form NVDEC's parser needs
   (:class:`~lightning_vstream.decode.nvdec.sources.PacketSource`). PyAV rather than PyNvVideoCodec's
   demuxer because seeking must use the frame table's seek targets exactly as
   :class:`~lightning_vstream.decode.cpu.pyav.PyAVDecoder` does. Non-reference pictures no read needs
   are never handed to NVDEC (:class:`~lightning_vstream.decode.gops.FeedFilter`, from the frame
   table's reference codes): a stream read at a stride decodes only the frames read and the
   references between them.
2. **decode** (GPU): a PyNvVideoCodec decoder decodes to NV12 (P016 for 10-bit) in device memory,
   on a CUDA stream that is never the NULL stream. Each packet carries its presentation timestamp,
   and every frame that comes out is checked against the frame table, so a frame is never returned
   under the wrong index. Latency mode ``NATIVE`` keeps NVDEC pipelined; ``LOW`` is used only for
   streams whose frame table records no reordering (no B-frames).
3. **hand-off and colour** (GPU): ``DecodedFrame.__dlpack__(stream=...)`` wraps the decoder's
   surface without a copy, and one fused kernel
   (:class:`~lightning_vstream.decode.nvdec.nv12.Nv12Converter`) converts it with the stream's own matrix
   and range (FFmpeg's rules, so GPU frames match CPU frames) straight into the caller's tensor.
   The surface is one of the decoder's few output buffers, which its next ``Decode`` overwrites:
   the conversion is queued on the decoder's stream before that call, so the stream orders them.

Per frame the host does one ``Decode`` call and one kernel launch: no NVTX range, no stream wait
and no host synchronisation. With ``stream="current"`` (the stream engine's decode threads) a
decoder runs on the calling thread's stream and nothing at all needs ordering: each output buffer
is imported once per file (its shape, strides and device checked then) and found again by its
address. With its own stream (the default) each frame is imported on that stream and the caller's
stream waits for it, one event per frame; the decoder's stream never waits for the caller's (a
slow consumer would hold NVDEC's copies back), so a frame written into the caller's ``out`` is
converted on the decoder's stream into memory of its own and copied on the caller's stream.

A CUDA error, a GPU out of memory or a failed kernel launch raises
:class:`~lightning_vstream.errors.GpuError` (never skipped as a bad file), and the decoder that met
it is dropped without another ``Decode`` call (a flush on a broken context can end the process).

Decoders are expensive to create (tens of milliseconds), so closed :class:`NvDecoder` s hand theirs
back to a :class:`~lightning_vstream.decode.nvdec.pool.DecoderPool`, and the next file with the same GPU,
codec, size, bit depth and chroma format takes it instead of creating one. A pool is per process.

PyNvVideoCodec is imported only when a decoder first opens a file: on machines without an NVIDIA
driver its import fails, and the CPU path never touches it.

**GOP decoding for explicit frame selection** (``decode.device="cuda"`` in random access):
:class:`NvGopDecoder` implements the planner's :class:`~lightning_vstream.decode.threads.TaskDecoder`
with PyNvVideoCodec: packets come from the file's bytes at the places the frame tables record (or
from PyAV's demuxer where they record none; see :func:`~lightning_vstream.decode.nvdec.sources.packet_source`),
each checked against the frame table's CRC-32, are decoded on NVDEC with ``NATIVE`` output (NV12),
and only the wanted frames are converted to RGB, on the decoder's own CUDA stream, straight into
their place in the batch. NVDEC is fed what :func:`~lightning_vstream.decode.gops.plan_feed` plans:
the wanted pictures and the references before them, decoded (the codec needs them) but never
converted; non-reference pictures no wanted frame needs, and every packet after the last wanted
one, are never fed. Each frame's timestamp is checked against the frame table, so a frame is never
mislabelled. The thread that decodes sets its device first; a decoder that raised is dropped
without being flushed, and a CUDA error, a GPU out of memory or a failed kernel launch raises
:class:`~lightning_vstream.errors.GpuError`.

Decoders: one NVDEC decoder per planner worker thread and open file, each created with its own
CUDA stream (``cudastream``; the NULL stream would synchronise after every frame) in the primary
context torch uses (``cudacontext=0``). A closed decoder goes back to a
:class:`~lightning_vstream.decode.nvdec.decoder.DecoderPool` keyed by GPU, codec, coded size, bit depth,
chroma format and latency mode, so the next file of the same format reuses it (PyNvVideoCodec
refuses to reconfigure across a bit-depth change). Latency is ``LOW`` (each packet flagged
``ENDOFPICTURE``, so a frame comes out as soon as it is decoded) only when the frame table records
no reordering (``reorder_depth == 0``); ``NATIVE`` otherwise, as NVIDIA requires.

A decoded frame stays valid only until the decoder's next ``Decode`` call, which writes the next
frame into the same buffer, on the decoder's stream. The conversion of a wanted frame is queued on
that stream before the next ``Decode`` is called, so the stream orders the two: the host never
waits for a frame.

The NVDEC building blocks (stream format, capabilities, decoder keys and pool, sessions, packets)
come from :mod:`lightning_vstream.decode.nvdec.session` and the colour conversion from
:class:`lightning_vstream.decode.nvdec.nv12.Nv12Converter`, shared with the GPU stream engine: the
stream's matrix and range are honoured, and formats NVDEC or the conversion cannot take raise
:class:`~lightning_vstream.errors.DecoderCapabilityError` naming the fix.
"""

from __future__ import annotations

import collections
import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from lightning_vstream.decode.base import DecoderBase, FileBase, KeyframeSeeking, Layout, VideoDecodeError, VideoInfo
from lightning_vstream.decode.device import (
    GPU_INSTALL_HINT,
    DecodeDevice,
    FrameMemory,
    frame_memory,
    gpu_failure,
    import_pynvvideocodec,
    nvdec_available,
    resolve_decode_device,
)
from lightning_vstream.decode.gops import FeedFilter, GopTask
from lightning_vstream.decode.nvdec.nv12 import Backend, Nv12Converter
from lightning_vstream.decode.nvdec.pool import DecoderPool, shared_decoder_pool
from lightning_vstream.decode.nvdec.session import DecoderKey, Latency, Session, check_decodable, create_session
from lightning_vstream.decode.nvdec.sources import PacketSource, TableSource, packet_source
from lightning_vstream.decode.threads import Emit
from lightning_vstream.errors import (
    ConfigurationError,
    ConfigurationTypeError,
    DecoderCapabilityError,
    GpuError,
    UsageError,
    frame_out_of_range,
)
from lightning_vstream.profiling import RANGE_DEMUX, nvtx_range

if TYPE_CHECKING:
    import torch

__all__ = [
    "GPU_INSTALL_HINT",
    "DecodeDevice",
    "DecoderKey",
    "DecoderPool",
    "LatencyChoice",
    "Nv12Frame",
    "NvDecoder",
    "NvGopDecoder",
    "NvdecFile",
    "StreamChoice",
    "converter_for",
    "import_pynvvideocodec",
    "nvdec_available",
    "resolve_decode_device",
    "shared_decoder_pool",
    "verified",
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
                "(decode.device='cpu') for CPU decoding."
            )
        index = dev.index if dev.index is not None else 0
    if index < 0:
        raise ConfigurationError(f"device={device!r}: the GPU ordinal must be >= 0.")
    return index


class NvdecFile(FileBase):
    """What both NVDEC readers of a file share: the GPU, the decoder pool its session comes from and goes back
    to, where frames live, and the end of stream that makes a session drop its state. Subclasses set ``gpu``,
    ``_pool``, ``_memory``, ``_session``, ``_nvc`` and ``_dirty``."""

    gpu: int
    _pool: DecoderPool | None
    _memory: FrameMemory | None
    _session: Session | None
    _nvc: ModuleType | None
    _dirty: bool

    @property
    def pool(self) -> DecoderPool:
        """The pool NVDEC decoders come from and go back to."""
        if self._pool is None:
            self._pool = shared_decoder_pool()
        return self._pool

    @property
    def memory(self) -> FrameMemory:
        """Where frames live and how they reach torch."""
        if self._memory is None:
            self._memory = frame_memory()
        return self._memory

    def _flush(self) -> None:
        """Send the end of stream, if packets were fed since the last, so the session drops its state; the frames
        it returns are discarded."""
        if self._dirty and self._session is not None and self._nvc is not None:
            self._session.decoder.Decode(self._nvc.PacketData())
        self._dirty = False


class NvDecoder(DecoderBase, NvdecFile, KeyframeSeeking):
    """Frame-exact decoder for one video file on an NVIDIA GPU (NVDEC via PyNvVideoCodec).

    Behaves like :class:`~lightning_vstream.decode.cpu.pyav.PyAVDecoder`, with frames returned as
    uint8 RGB CUDA tensors: opens lazily on first use; sequential :meth:`read` calls keep the
    decoder's state and decode each frame once; :meth:`seek` decodes forward within the current
    GOP and otherwise jumps to the keyframe at or before the target (stepping back a GOP if the
    demuxer overshoots); every packet's CRC-32 and every frame's timestamp is checked against the
    frame table. On a jump, frames still inside the decoder are flushed and discarded (not counted
    in :attr:`frames_decoded`). :meth:`close` flushes the decoder and returns it to ``pool`` for
    the next file of the same format.

    NVDEC is fed only the packets the frames read need (:attr:`feed`): a non-reference picture
    that no read asks for is passed over (counted in :attr:`packets_skipped`), so reading every
    ``N``-th frame of a file in the stride layout decodes those frames only. A stride the reads keep
    is learnt; :meth:`expect` announces the frames to come. Reading a frame that was passed over
    restarts at its keyframe, so every read stays exact.

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

    path: Path  # a local file: NVDEC reads remote files through NvGopDecoder

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
        self._feed_filter: FeedFilter | None = None
        self._packets_fed = 0

    # -- properties -------------------------------------------------------------------------
    @property
    def info(self) -> VideoInfo:
        if self._info is None:
            from lightning_vstream.decode.cpu.probe import probe_video

            self._info = probe_video(self.path)
        return self._info

    @property
    def device(self) -> torch.device:
        """The device frames are returned on (the GPU; the CPU only under a test driver's host memory)."""
        return self.memory.device(self.gpu)

    @property
    def seeks(self) -> int:
        """Number of demuxer seeks performed."""
        return self._seeks

    @property
    def packets_fed(self) -> int:
        """Packets handed to NVDEC so far (the end-of-stream calls not counted)."""
        return self._packets_fed

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
        self._queue.clear()  # their surfaces die with the next Decode
        super()._flush()

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

    def __enter__(self) -> NvDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- opening and closing ----------------------------------------------------------------
    def _open(self) -> None:
        info = self.info
        where = self._where()
        if info.identity is not None:
            # As on the CPU: a file that differs from its index entry is re-verified packet by packet
            # (FileChangedError if its content changed) before any frame is decoded.
            self._info = info = verified(self.path, info, where)
        nvc = import_pynvvideocodec()
        memory = self.memory
        source = packet_source(self.path, info, where)
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
            convert = converter_for(
                fmt.color, info.height, info.width, self.layout, memory.device(self.gpu), self.backend
            )
        except BaseException:
            source.close()
            raise
        try:
            session = self.pool.acquire(key, lambda: create_session(nvc, key, memory, stream))
        except Exception as err:
            source.close()
            raise VideoDecodeError(f"{where}: creating the NVDEC decoder failed: {err}") from err
        feed = self.feed
        feed.restart()  # decoding starts at the file's first keyframe
        source.feed = feed if feed.active else None
        self._nvc, self._key, self._session, self._source = nvc, key, session, source
        self._convert = convert
        self._import = memory.import_surface
        self._surfaces = session.surfaces
        self._surfaces.clear()  # imported again (and checked) for each file
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

    # -- positioning ------------------------------------------------------------------------
    def seek(self, index: int) -> None:
        info = self.info
        if not 0 <= index < info.frame_count:
            raise frame_out_of_range(index, info.frame_count, self._where())
        if index == self._target and not self._needs_seek:
            return  # already there: the sequential case costs nothing
        after, key = self._next, info.keyframe_at_or_before(index)
        forward_ok = (
            self._session is not None
            and not self._needs_seek
            and 0 <= after <= index
            # In the target's GOP, or only non-reference pictures (passed over) before its keyframe: reading on
            # costs no decoding, where a jump would flush what NVDEC holds and decode it again.
            and (key <= after or self.feed.passes_over(after, key))
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
        self.feed.restart()
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
        if self.feed.aim(index):  # its picture, or one it is predicted from, was passed over
            self._needs_seek = True
            return self._read_positioned(out, aimed=True)
        queue = self._queue
        while not queue:
            self._feed(index)
        taken, frame = queue.popleft()
        if taken != index:
            taken, frame = self._catch_up(index, taken, frame, -1)
        self._last = taken
        if self._ordered:  # the decoder runs on the caller's stream: the conversion follows its work
            surface = self._surfaces.get(frame.GetPtrToPlane(0))
            if surface is None:
                surface = self._surface(frame, taken)
            try:
                tensor = self._convert(surface, out)
            except BaseException as err:
                failure = self._failed(err, taken)
                if failure is err:
                    raise
                raise failure from err
        else:
            tensor = self._to_tensor(frame, taken, out)
        self._target = taken + 1
        return tensor

    def _read_positioned(self, out: torch.Tensor | None, *, aimed: bool = False) -> torch.Tensor:
        """:meth:`read` when the file is not open yet, a seek is pending, or the file has no frame at the position
        (``aimed``: the feed already knows the target)."""
        info = self._info if self._info is not None else self.info
        target = self._target
        if target >= info.frame_count:
            raise frame_out_of_range(target, info.frame_count, self._where())
        if not aimed and self.feed.aim(target):
            self._needs_seek = True  # its picture, or one it is predicted from, was passed over
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
        wanted keyframe after a jump to GOP ``key_ordinal`` (then :meth:`_step_back` jumps one GOP earlier), or
        frames are missing (:class:`VideoDecodeError`).
        """
        queue = self._queue
        while True:
            before = self._last
            self._last = index
            if index == target:
                return index, frame
            if index > target:
                earlier = self._step_back(key_ordinal)  # the demuxer landed past the wanted keyframe
                if earlier is not None:
                    key_ordinal = earlier
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
                self._packets_fed += 1
                frames = self._decode(data)
            else:
                frames = self._decode(nvc.PacketData())
                self._ended, self._dirty = True, False
        except VideoDecodeError:
            self._reset(reusable=False)
            raise
        except Exception as err:
            failure = self._failed(err, self._target)
            if failure is err:
                failure = VideoDecodeError(f"{self._where(self._target)}: NVDEC decoding failed: {err}")
            raise failure from err
        except BaseException:
            self._reset(reusable=False)  # interrupted inside Decode: its state is unknown
            raise
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

    def _failed(self, err: BaseException, index: int) -> BaseException:
        """Drop the decoder after ``err`` (never flushed: a flush after a CUDA error can end the process); the
        :class:`~lightning_vstream.errors.GpuError` ``err`` stands for, or ``err`` itself."""
        where = self._where(index)
        self._reset(reusable=False)
        failure = gpu_failure(err, where)
        return failure if failure is not None else err

    def _surface(self, frame: Any, index: int, *, keep: bool = True) -> torch.Tensor:
        """Import an output buffer of the decoder (on its stream) and check it: the layout every frame of the file
        must have, and its device. Kept (``keep``) and found again by its address; decoders on a stream of their
        own import every frame, so that the import orders the caller's stream after the decoder's work."""
        try:
            surface = self._import(frame, self._stream)
        except BaseException as err:
            failure = self._failed(err, index)
            if failure is err:
                raise
            raise failure from err
        if (surface.shape, surface.stride(), surface.element_size()) != self._surface_layout:
            raise self._surface_error(surface, index)
        if surface.device != self.device:
            expected, target = self.device, self._target
            self._reset(reusable=False)
            raise GpuError(
                f"{self._where(target)}: the decoder's frames live on {surface.device}, but this decoder was made for "
                f"{expected}: decoding and training would run on different GPUs. Every thread that decodes must "
                "set its device first (torch.cuda.set_device); check CUDA_VISIBLE_DEVICES and the device each rank "
                "was given."
            )
        if keep:
            self._surfaces[frame.GetPtrToPlane(0)] = surface
        return surface

    def _surface_error(self, surface: torch.Tensor, index: int) -> DecoderCapabilityError:
        shape, strides, itemsize = self._surface_layout
        version = getattr(self._nvc, "__version__", "unknown")
        target = self._target
        self._reset(reusable=False)
        return DecoderCapabilityError(
            f"{self._where(target)}: PyNvVideoCodec {version} exported frame {index} as a {surface.dtype} "
            f"surface of shape {tuple(surface.shape)} with strides {tuple(surface.stride())}; expected "
            f"{'NV12' if itemsize == 1 else 'P016'} {shape} with strides {strides}. Reading it would give wrong "
            "pixels; install pynvvideocodec>=2.2.4, or decode this file with decode.device='cpu'."
        )

    def _to_tensor(self, frame: Any, index: int, out: torch.Tensor | None) -> torch.Tensor:
        session, convert = self._session, self._convert
        if session is None or convert is None:  # pragma: no cover - read() opens first
            raise UsageError("internal error: converting on a closed NvDecoder")
        if self._ordered:  # the decoder runs on the caller's stream: the conversion follows its work
            surface = self._surfaces.get(frame.GetPtrToPlane(0))
            if surface is None:
                surface = self._surface(frame, index)
            try:
                return convert(surface, out)
            except BaseException as err:
                failure = self._failed(err, index)
                if failure is err:
                    raise
                raise failure from err
        import torch

        # The decoder's stream never waits for the caller's: converted there into memory of its own (kept from
        # reuse until the caller's work on it is done), then copied into `out` on the caller's stream.
        stream = session.stream
        consumer = self.memory.current_stream(self.gpu)
        try:
            with torch.cuda.stream(stream):
                result = convert(self._surface(frame, index, keep=False))
            consumer.wait_stream(stream)
            result.record_stream(consumer)
            if out is not None:
                out.copy_(result)
                return out
            return result
        except (DecoderCapabilityError, GpuError):
            raise
        except BaseException as err:
            failure = self._failed(err, index)
            if failure is err:
                raise
            raise failure from err

    def __repr__(self) -> str:
        state = "open" if self._session is not None else "closed"
        return f"NvDecoder({str(self.path)!r}, gpu={self.gpu}, position={self._target}, {state})"


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
    from lightning_vstream.decode.cpu.probe import probe_video
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


@dataclass
class Nv12Frame:
    """A decoded NV12 surface, valid until the next decode on its decoder; :meth:`write_into` converts it."""

    surface: Any  # torch.Tensor [1.5 H, W] uint8 (NV12) or 16-bit (P016)
    convert: Nv12Converter
    stream: Any  # the decoder's stream, which the caller's stream waits for once per batch
    index: int
    on_stream: bool = True  # convert on ``stream`` (False: host memory, where nothing needs ordering)

    def write_into(self, out: torch.Tensor) -> None:
        """Convert into ``out`` (``[3, H, W]``) on the decoder's stream.

        ``out`` must be memory no earlier work still uses (the decoder's stream never waits for the
        caller's); the caller waits for the stream before reading ``out``.
        """
        if not self.on_stream:
            self.convert(self.surface, out)
            return
        import torch

        with torch.cuda.stream(self.stream):
            self.convert(self.surface, out)


class NvGopDecoder(NvdecFile):
    """Decodes GOP tasks of one video file on NVDEC (see the module docs).

    A task's decode is fed only what :func:`~lightning_vstream.decode.gops.plan_feed` plans for its
    wanted frames: from the keyframe, the wanted pictures and the pictures they are predicted from,
    and no packet after the last wanted one (the end of the stream is sent instead, which brings the
    last frames out). The source's :class:`~lightning_vstream.decode.gops.FeedFilter` decides packet
    by packet, expecting the wanted frames whose packets are still to come. Pictures no wanted frame
    needs are passed over and counted in :attr:`packets_skipped`.

    Args:
        path: Video file.
        info: Its frame table.
        gpu: GPU ordinal.
        pool: Decoder pool; :func:`~lightning_vstream.decode.nvdec.decoder.shared_decoder_pool` when None.
        label: Clip and camera, for error messages.
        memory: Where frames live (:func:`~lightning_vstream.decode.device.frame_memory` when None).

    Example::

        >>> dec = NvGopDecoder("clip/CAM_FRONT.mp4", info=info, gpu=0)  # doctest: +SKIP
        >>> dec.decode_gop(task, lambda index, frame: frame.write_into(out[index]))  # doctest: +SKIP
    """

    path: Path  # a local file: remote GOPs are read with PyAV

    def __init__(
        self,
        path: Path | str,
        *,
        info: VideoInfo,
        gpu: int = 0,
        pool: DecoderPool | None = None,
        label: str = "",
        memory: FrameMemory | None = None,
    ) -> None:
        self.path = Path(path)
        self._info = info
        self.gpu = gpu
        self.label = label
        self._pool = pool
        self._memory = memory
        self._nvc: ModuleType | None = None
        self._packets: PacketSource | TableSource | None = None
        self._data: Any = None  # the PacketData every packet is sent in
        self._convert: Nv12Converter | None = None
        self._key: DecoderKey | None = None
        self._session: Session | None = None
        self._surface_layout: tuple[Any, ...] = ()
        self._dirty = False
        self._feed_filter: FeedFilter | None = None  # built from the frame table on first use
        self._unfed: set[int] = set()  # wanted frames of the task whose packets NVDEC has not been fed yet
        self.frames_decoded = 0
        self.frames_converted = 0
        #: Packets handed to NVDEC so far (the end-of-stream calls not counted).
        self.packets_fed = 0

    @property
    def info(self) -> VideoInfo:
        """The file's frame table."""
        return self._info

    def _open(self) -> None:
        nvc = import_pynvvideocodec()
        memory = self.memory
        packets = packet_source(self.path, self.info, self._where())
        try:
            fmt = packets.format
            check_decodable(self.gpu, fmt, self._where())
            # LOW only where the frame table records no reordering, as NVIDIA requires.
            latency: Latency = "LOW" if fmt.reorder_depth == 0 else "NATIVE"
            key = DecoderKey(self.gpu, fmt.codec, fmt.width, fmt.height, fmt.bit_depth, fmt.chroma, "NATIVE", latency)
            convert = Nv12Converter(fmt.color, fmt.height, fmt.width, device=memory.device(self.gpu))
            try:
                session = self.pool.acquire(key, lambda: create_session(nvc, key, memory))
            except Exception as err:
                raise VideoDecodeError(f"{self._where()}: creating the NVDEC decoder failed: {err}") from err
        except BaseException:
            packets.close()
            raise
        feed = self.feed
        packets.feed = feed if feed.active else None
        self._nvc, self._packets, self._key, self._session = nvc, packets, key, session
        self._convert = convert
        self._surface_layout = ((fmt.height * 3 // 2, fmt.width), (fmt.width, 1), 1 if fmt.bit_depth <= 8 else 2)
        self._data = nvc.PacketData()
        if latency == "LOW":  # DisplayDecodeLatencyType.LOW needs every packet to end its picture
            self._data.decode_flag = nvc.VideoPacketFlag.ENDOFPICTURE
        self._dirty = False

    def _surface(self, frame: Any, index: int) -> Any:
        """The frame's surface as a tensor, checked against the layout every frame of the file must have."""
        session = self._session
        assert session is not None
        surface = self.memory.import_surface(frame, session.stream)
        shape, strides, itemsize = self._surface_layout
        if surface.shape != shape or surface.stride() != strides or surface.element_size() != itemsize:
            version = getattr(self._nvc, "__version__", "unknown")
            raise DecoderCapabilityError(
                f"{self._where(index)}: PyNvVideoCodec {version} exported a {surface.dtype} surface of shape "
                f"{tuple(surface.shape)} with strides {tuple(surface.stride())}; expected {shape} with strides "
                f"{strides}. Reading it would give wrong pixels; install pynvvideocodec>=2.2.4, or use "
                "decode.device='cpu'."
            )
        return surface

    def decode_gop(self, task: GopTask, emit: Emit) -> None:
        """Decode ``task`` from its keyframe; ``emit(index, Nv12Frame)`` for each wanted frame, ascending.

        Raises:
            GpuError: The GPU failed (a CUDA error, out of memory, a failed kernel launch).
            VideoDecodeError: The file does not decode as its frame table says.
        """
        self.memory.set_device(self.gpu)  # this thread's device, before anything touches the GPU
        try:
            self._decode_gop(task, emit)
        except BaseException as err:
            self._drop()  # never flushed: a Decode after a CUDA error can end the process
            failure = gpu_failure(err, self._where(task.frames[0]))
            if failure is None or failure is err:
                raise
            raise failure from err

    def _decode_gop(self, task: GopTask, emit: Emit) -> None:
        if self._session is None:
            self._open()
        session, packets = self._session, self._packets
        assert session is not None and packets is not None
        info = self.info
        remaining = list(task.frames)
        gop = task.gop
        self._seek(gop, task.frames)
        first = True  # the next frame out is the first since the last seek
        while remaining:
            more, frames = self._step(remaining[0])
            restart = False
            for frame in frames:
                self.frames_decoded += 1
                pts = frame.getPTS()
                index = info.index_of_pts(pts) if pts is not None else None
                if index is None:
                    raise VideoDecodeError(
                        f"{self._where(remaining[0])}: the decoder produced a frame with timestamp {pts}, which is "
                        "not in the file's frame table (corrupt file, or a stale index: rebuild it with "
                        "`vstream index`)."
                    )
                if first and index > remaining[0] and gop > 0:
                    restart = True  # the demuxer landed past the keyframe
                    break
                first = False
                if not remaining or index < remaining[0]:
                    continue  # decoded only to reach a wanted frame: never converted
                if index > remaining[0]:
                    raise VideoDecodeError(
                        f"{self._where(remaining[0])}: the decoder produced frame {index} where frame {remaining[0]} "
                        "was due; the frames between are missing or corrupt."
                    )
                remaining.pop(0)
                self.frames_converted += 1
                assert self._convert is not None
                surface = self._surface(frame, index)
                emit(index, Nv12Frame(surface, self._convert, session.stream, index, on_stream=not self.memory.host))
            if restart:
                gop -= 1
                self._seek(gop, remaining)
                first = True
            elif not more and remaining and self._unfed:
                raise VideoDecodeError(
                    f"{self._where(remaining[0])}: the file ended before this frame although its frame table lists "
                    f"{info.frame_count} frames (truncated file?)."
                )
            elif not more and remaining:
                raise VideoDecodeError(
                    f"{self._where(remaining[0])}: the decoder returned no frame for this frame's packet, even at the "
                    "end of the stream (a corrupt packet, or a stale index: rebuild it with `vstream index`)."
                )

    def _seek(self, gop: int, frames: Sequence[int]) -> None:
        """Start decoding at keyframe ``gop`` towards ``frames`` (wanted, ascending), fed what they need."""
        packets, feed = self._packets, self.feed
        assert packets is not None
        feed.expect(frames)
        feed.aim(frames[0])
        self._flush()
        packets.seek_key(gop)
        feed.restart()
        self._unfed = set(frames)

    def _step(self, due: int) -> tuple[bool, list[Any]]:
        """Feed the next packet the task needs to the decoder, or the end of the stream once every wanted
        frame's packet is in (or at the end of the file); whether a packet was fed, and the frames out."""
        nvc, session, packets = self._nvc, self._session, self._packets
        assert nvc is not None and session is not None and packets is not None
        try:
            unfed = self._unfed
            more = bool(unfed) and packets.fill(self._data)  # the source keeps the bytes until its next fill
            if more:
                index = self.info.pts_index.get(self._data.pts)
                if index in unfed:
                    unfed.discard(index)
                    if unfed:
                        # Only the sub-layers of the wanted frames still to come count from here on: what
                        # plan_feed plans for the task, packet by packet.
                        self.feed.expect(tuple(sorted(unfed)))
                self._dirty = True
                self.packets_fed += 1
                frames = list(session.decoder.Decode(self._data))
            else:
                frames = list(session.decoder.Decode(nvc.PacketData()))
                self._dirty = False
        except VideoDecodeError:
            raise
        except Exception as err:  # PyAV and PyNvVideoCodec raise their own types
            if gpu_failure(err) is not None:
                raise
            raise VideoDecodeError(f"{self._where(due)}: decoding failed: {err}") from err
        return more, frames

    def _drop(self) -> None:
        """Close the file and drop the NVDEC decoder (not flushed, not returned to the pool)."""
        self._session = None
        self._key = None
        if self._packets is not None:
            try:
                self._packets.close()
            except Exception:
                pass
            self._packets = None
        self._dirty = False

    def close(self) -> None:
        """Close the file and return the NVDEC decoder to the pool (flushed)."""
        session, key = self._session, self._key
        if session is not None and key is not None:
            try:
                self._flush()
            except Exception:
                session = None
            if session is not None:
                self.pool.release(key, session)
        self._session = None
        if self._packets is not None:
            self._packets.close()
            self._packets = None
        self._dirty = False
