"""GOP decoding on NVIDIA GPUs for explicit frame selection (``decode_device="cuda"``).

:class:`NvGopDecoder` implements the planner's :class:`~lightning_vstream.clips.executor.GopDecoder`
with PyNvVideoCodec: packets come from the file's bytes at the places the frame tables record (or
from PyAV's demuxer where they record none; see :func:`~lightning_vstream.decode.nvdec_sources.packet_source`),
each checked against the frame table's CRC-32, are decoded on NVDEC with ``NATIVE`` output (NV12),
and only the wanted frames are converted to RGB, on the decoder's own CUDA stream, straight into
their place in the batch; every other frame of the GOP is decoded (the codec needs it) but never
converted. Each frame's timestamp is checked against the frame table, so a frame is never
mislabelled. The thread that decodes sets its device first; a decoder that raised is dropped
without being flushed, and a CUDA error, a GPU out of memory or a failed kernel launch raises
:class:`~lightning_vstream.errors.GpuError`.

Decoders: one NVDEC decoder per planner worker thread and open file, each created with its own
CUDA stream (``cudastream``; the NULL stream would synchronise after every frame) in the primary
context torch uses (``cudacontext=0``). A closed decoder goes back to a
:class:`~lightning_vstream.decode.gpu.DecoderPool` keyed by GPU, codec, coded size, bit depth,
chroma format and latency mode, so the next file of the same format reuses it (PyNvVideoCodec
refuses to reconfigure across a bit-depth change). Latency is ``LOW`` (each packet flagged
``ENDOFPICTURE``, so a frame comes out as soon as it is decoded) only when the frame table records
no reordering (``reorder_depth == 0``); ``NATIVE`` otherwise, as NVIDIA requires.

A decoded frame stays valid only until the decoder's next ``Decode`` call, which writes the next
frame into the same buffer, on the decoder's stream. The conversion of a wanted frame is queued on
that stream before the next ``Decode`` is called, so the stream orders the two: the host never
waits for a frame.

The NVDEC building blocks (stream format, capabilities, decoder keys and pool, sessions, packets)
come from :mod:`lightning_vstream.decode.nvdec` and the colour conversion from
:class:`lightning_vstream.decode.nv12.Nv12Converter`, shared with the GPU stream engine: the
stream's matrix and range are honoured, and formats NVDEC or the conversion cannot take raise
:class:`~lightning_vstream.errors.DecoderCapabilityError` naming the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from lightning_vstream.clips.executor import Emit
from lightning_vstream.clips.planner import GopTask
from lightning_vstream.decode.base import VideoDecodeError, VideoInfo
from lightning_vstream.decode.decoder_pool import DecoderPool, shared_decoder_pool
from lightning_vstream.decode.device import FrameMemory, frame_memory, gpu_failure
from lightning_vstream.decode.nv12 import Nv12Converter
from lightning_vstream.decode.nvdec import (
    DecoderKey,
    Latency,
    Session,
    check_decodable,
    create_session,
)
from lightning_vstream.decode.nvdec_sources import PacketSource, TableSource, packet_source
from lightning_vstream.errors import DecoderCapabilityError

if TYPE_CHECKING:
    import torch

__all__ = ["Nv12Frame", "NvGopDecoder"]


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


class NvGopDecoder:
    """Decodes GOP tasks of one video file on NVDEC (see the module docs).

    Args:
        path: Video file.
        info: Its frame table.
        gpu: GPU ordinal.
        pool: Decoder pool; :func:`~lightning_vstream.decode.gpu.shared_decoder_pool` when None.
        label: Clip and camera, for error messages.
        memory: Where frames live (:func:`~lightning_vstream.decode.device.frame_memory` when None).

    Example::

        >>> dec = NvGopDecoder("clip/CAM_FRONT.mp4", info=info, gpu=0)  # doctest: +SKIP
        >>> dec.decode_gop(task, lambda index, frame: frame.write_into(out[index]))  # doctest: +SKIP
    """

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
        self.info = info
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
        self.frames_decoded = 0
        self.frames_converted = 0

    def _where(self, index: int | None = None) -> str:
        where = repr(str(self.path)) + (f" ({self.label})" if self.label else "")
        return where if index is None else f"{where} frame {index}"

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

    def _open(self) -> None:
        from lightning_vstream.decode.gpu import import_pynvvideocodec

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
        self._nvc, self._packets, self._key, self._session = nvc, packets, key, session
        self._convert = convert
        self._surface_layout = ((fmt.height * 3 // 2, fmt.width), (fmt.width, 1), 1 if fmt.bit_depth <= 8 else 2)
        self._data = nvc.PacketData()
        if latency == "LOW":  # DisplayDecodeLatencyType.LOW needs every packet to end its picture
            self._data.decode_flag = nvc.VideoPacketFlag.ENDOFPICTURE
        self._dirty = False

    def _flush(self) -> None:
        if self._dirty and self._session is not None and self._nvc is not None:
            self._session.decoder.Decode(self._nvc.PacketData())  # end of stream; frames discarded
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
                "decode_device='cpu'."
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
        self._flush()
        packets.seek_key(gop)
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
                self._flush()
                gop -= 1
                packets.seek_key(gop)
                first = True
            elif not more and remaining:
                raise VideoDecodeError(
                    f"{self._where(remaining[0])}: the file ended before this frame although its frame table lists "
                    f"{info.frame_count} frames (truncated file?)."
                )

    def _step(self, due: int) -> tuple[bool, list[Any]]:
        """Feed the next packet (or the end of the stream) to the decoder; whether there was one, and the frames out."""
        nvc, session, packets = self._nvc, self._session, self._packets
        assert nvc is not None and session is not None and packets is not None
        try:
            more = packets.fill(self._data)  # the source keeps the bytes until its next fill
            if more:
                self._dirty = True
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
