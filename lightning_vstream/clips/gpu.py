"""GOP decoding on NVIDIA GPUs for explicit frame selection (``decode_device="cuda"``).

:class:`NvGopDecoder` implements the planner's :class:`~lightning_vstream.clips.planner.GopDecoder`
with PyNvVideoCodec: packets are demuxed with PyAV (their checksums checked against the frame
table before the Annex-B filter), decoded on NVDEC with ``NATIVE`` output (NV12), and only the
wanted frames are converted to RGB, on the decoder's own CUDA stream, straight into their place
in the batch; every other frame of the GOP is decoded (the codec needs it) but never converted.
Each frame's timestamp is checked against the frame table, so a frame is never mislabelled.

Decoders: one NVDEC decoder per planner worker thread and open file, each created with its own
CUDA stream (``cudastream``; the NULL stream would synchronise after every frame) in the primary
context torch uses (``cudacontext=0``). A closed decoder goes back to a
:class:`~lightning_vstream.decode.gpu.DecoderPool` keyed by GPU, codec, coded size, bit depth,
chroma format and latency mode, so the next file of the same format reuses it (PyNvVideoCodec
refuses to reconfigure across a bit-depth change). Latency is ``LOW`` (each packet flagged
``ENDOFPICTURE``, so a frame comes out as soon as it is decoded) only when the stream has no
frame reordering (no B-frames); ``NATIVE`` otherwise, as NVIDIA requires. A decoded frame stays
valid only until the decoder's next ``Decode`` call, so before that call the thread waits for the
conversions it queued (one host wait per wanted frame; none for frames only decoded through).

The NVDEC building blocks (stream format, capabilities, decoder keys and pool, sessions, packets)
come from :mod:`lightning_vstream.decode.nvdec` and the colour conversion from
:func:`lightning_vstream.decode.nv12.nv12_to_rgb`, shared with the GPU stream engine: the
stream's matrix and range are honoured, and formats NVDEC or the conversion cannot take raise
:class:`~lightning_vstream.errors.DecoderCapabilityError` naming the fix.

Nothing here has run on a GPU yet: the code is checked against PyNvVideoCodec 2.2.4's API and
tested on the CPU with a stand-in module.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from lightning_vstream.clips.planner import Emit, GopDecoder, GopTask
from lightning_vstream.decode.base import VideoDecodeError, VideoInfo
from lightning_vstream.decode.nv12 import ColorSpec, nv12_to_rgb
from lightning_vstream.decode.nvdec import (
    DecoderKey,
    DecoderPool,
    Latency,
    PacketSource,
    Session,
    check_decodable,
    create_session,
    frame_pts,
    num_decoder_engines,
    packet_data,
    shared_decoder_pool,
)

if TYPE_CHECKING:
    import torch

__all__ = ["Nv12Frame", "NvGopDecoder", "decode_engine_count", "nvdec_gop_factory"]


@dataclass
class Nv12Frame:
    """A decoded NV12 surface, valid until the next decode on its decoder; :meth:`write_into` converts it."""

    surface: Any  # torch.Tensor [1.5 H, W] uint8 (NV12) or 16-bit (P016)
    spec: ColorSpec
    stream: Any  # torch.cuda.Stream the surface is ready on, or None on the CPU (test doubles)
    index: int

    def write_into(self, out: torch.Tensor, *, after: Any = None) -> None:
        """Convert into ``out`` (``[3, H, W]``) on the decoder's stream, after event ``after`` when given."""
        import torch

        if self.stream is None:
            nv12_to_rgb(self.surface, self.spec, out=out)
            return
        if after is not None:
            self.stream.wait_event(after)
        with torch.cuda.stream(self.stream):
            nv12_to_rgb(self.surface, self.spec, out=out)
        out.record_stream(self.stream)


def decode_engine_count(gpu: int = 0, *, codec: str = "hevc") -> int:
    """NVDEC engines on ``gpu`` (``GetDecoderCaps``' ``num_decoder_engines``; at least 1)."""
    from lightning_vstream.decode.gpu import import_pynvvideocodec

    return num_decoder_engines(import_pynvvideocodec(), gpu, codec)


def _surface(frame: Any, stream: Any) -> torch.Tensor:
    import torch

    # __dlpack__(stream=s) makes s wait for the decoder's work; torch.from_dlpack(frame) would first
    # try a call that PyNvVideoCodec rejects, costing an exception per frame.
    capsule = frame.__dlpack__(stream=stream.cuda_stream) if stream is not None else frame.__dlpack__()
    return torch.from_dlpack(capsule)


class NvGopDecoder:
    """Decodes GOP tasks of one video file on NVDEC (see the module docs).

    Args:
        path: Video file.
        info: Its frame table.
        gpu: GPU ordinal.
        pool: Decoder pool; :func:`~lightning_vstream.decode.gpu.shared_decoder_pool` when None.
        label: Clip and camera, for error messages.

    Example::

        >>> dec = NvGopDecoder("clip/CAM_FRONT.mp4", info=info, gpu=0)  # doctest: +SKIP
        >>> dec.decode_gop(task, lambda index, frame: frame.write_into(out[index]))  # doctest: +SKIP
    """

    def __init__(
        self, path: Path | str, *, info: VideoInfo, gpu: int = 0, pool: DecoderPool | None = None, label: str = ""
    ) -> None:
        self.path = Path(path)
        self.info = info
        self.gpu = gpu
        self.label = label
        self._pool = pool
        self._nvc: ModuleType | None = None
        self._packets: PacketSource | None = None
        self._color = ColorSpec()
        self._key: DecoderKey | None = None
        self._session: Session | None = None
        self._dirty = False
        self._pending: Any = None  # CUDA event after the last conversion from a decoder surface
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

    def _open(self) -> None:
        from lightning_vstream.decode.gpu import import_pynvvideocodec

        nvc = import_pynvvideocodec()
        packets = PacketSource(self.path, self.info, self._where())
        try:
            fmt = packets.format
            check_decodable(nvc, self.gpu, fmt, self._where())
            latency: Latency = "NATIVE" if fmt.reorders else "LOW"  # LOW only without reordering, as NVIDIA requires
            key = DecoderKey(self.gpu, fmt.codec, fmt.width, fmt.height, fmt.bit_depth, fmt.chroma, "NATIVE", latency)
            try:
                session = self.pool.acquire(key, lambda: create_session(nvc, key))
            except Exception as err:
                raise VideoDecodeError(f"{self._where()}: creating the NVDEC decoder failed: {err}") from err
        except BaseException:
            packets.close()
            raise
        self._nvc, self._packets, self._key, self._session = nvc, packets, key, session
        self._color = fmt.color
        self._dirty = False

    def _converted_on_stream(self) -> None:
        """Note that kernels reading the decoder's surface were queued (see :meth:`_surfaces_free`)."""
        session = self._session
        if session is not None and session.stream is not None:
            import torch

            self._pending = torch.cuda.Event()
            self._pending.record(session.stream)

    def _surfaces_free(self) -> None:
        # A decoded frame is valid only until the next Decode call on its decoder, which may reuse
        # its surface; wait until the conversions queued on it have run. One host wait per wanted
        # frame, none for the frames decoded only to reach it.
        if self._pending is not None:
            self._pending.synchronize()
            self._pending = None

    def _flush(self) -> None:
        if self._dirty and self._session is not None and self._nvc is not None:
            self._surfaces_free()
            self._session.decoder.Decode(self._nvc.PacketData())  # end of stream; frames discarded
        self._dirty = False

    def decode_gop(self, task: GopTask, emit: Emit) -> None:
        """Decode ``task`` from its keyframe; ``emit(index, Nv12Frame)`` for each wanted frame, ascending."""
        if self._session is None:
            self._open()
        session, packets = self._session, self._packets
        assert session is not None and packets is not None
        info = self.info
        remaining = list(task.frames)
        gop = task.gop
        self._flush()
        packets.seek(info.key_seek[gop])
        source = packets.packets()
        first = True  # the next frame out is the first since the last seek
        while remaining:
            packet, frames = self._step(source, remaining[0])
            restart = False
            for frame in frames:
                self.frames_decoded += 1
                pts = frame_pts(frame)
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
                emit(index, Nv12Frame(_surface(frame, session.stream), self._color, session.stream, index))
                self._converted_on_stream()
            if restart:
                self._flush()
                gop -= 1
                packets.seek(info.key_seek[gop])
                source = packets.packets()
                first = True
            elif packet is None and remaining:
                raise VideoDecodeError(
                    f"{self._where(remaining[0])}: the file ended before this frame although its frame table lists "
                    f"{info.frame_count} frames (truncated file?)."
                )

    def _step(self, source: Iterator[Any], due: int) -> tuple[Any, list[Any]]:
        """Feed the next packet (or the end of the stream) to the decoder; the packet and the frames out."""
        nvc, session = self._nvc, self._session
        assert nvc is not None and session is not None
        self._surfaces_free()
        try:
            packet = next(source, None)
            if packet is None:
                frames = list(session.decoder.Decode(nvc.PacketData()))
                self._dirty = False
            else:
                low = self._key is not None and self._key.latency == "LOW"
                data, keep_alive = packet_data(nvc, packet, self._where(due), end_of_picture=low)
                self._dirty = True
                frames = list(session.decoder.Decode(data))
                del keep_alive  # the parser has copied the bytes once Decode returns
        except VideoDecodeError:
            raise
        except Exception as err:  # PyAV and PyNvVideoCodec raise their own types
            raise VideoDecodeError(f"{self._where(due)}: decoding failed: {err}") from err
        return packet, frames

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


def nvdec_gop_factory(
    gpu: int, *, pool: DecoderPool | None = None, labels: dict[Hashable, str] | None = None
) -> Callable[[GopTask], GopDecoder]:
    """``open_decoder`` for :class:`~lightning_vstream.clips.planner.GopExecutor`: an :class:`NvGopDecoder` per file."""

    def open_decoder(task: GopTask) -> GopDecoder:
        label = (labels or {}).get(task.source, "")
        return NvGopDecoder(Path(str(task.source)), info=task.info, gpu=gpu, pool=pool, label=label)

    return open_decoder
