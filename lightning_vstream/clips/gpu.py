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

Colour: the stream's matrix (BT.709 when tagged so, BT.601 when tagged so or untagged, as FFmpeg
assumes on the CPU path) and range (limited unless tagged full) are honoured by
:func:`nv12_to_rgb`. 8-bit 4:2:0 streams only; others raise
:class:`~lightning_vstream.errors.DecoderCapabilityError` naming the fix.

Nothing here has run on a GPU yet: the code is checked against PyNvVideoCodec 2.2.4's API and
tested on the CPU with a stand-in module.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from lightning_vstream.clips.planner import Emit, GopDecoder, GopTask
from lightning_vstream.decode.base import VideoDecodeError, VideoInfo
from lightning_vstream.errors import DecoderCapabilityError

if TYPE_CHECKING:
    import torch

    from lightning_vstream.decode.gpu import DecoderPool

__all__ = ["ColorSpec", "Nv12Frame", "NvGopDecoder", "decode_engine_count", "nv12_to_rgb", "nvdec_gop_factory"]

Matrix = Literal["bt601", "bt709"]
_NVDEC_CODECS = {"h264": "H264", "hevc": "HEVC", "av1": "AV1", "vp9": "VP9"}
_ANNEXB_FILTERS = {"h264": "h264_mp4toannexb", "hevc": "hevc_mp4toannexb"}
# (Kr, Kb) luma coefficients of each matrix.
_MATRIX_K = {"bt601": (0.299, 0.114), "bt709": (0.2126, 0.0722)}
_CHECKSUM_FIX = (
    "(corrupt or replaced file). Restore the file, or rebuild the index with `vstream index` if it was replaced on "
    "purpose."
)


@dataclass(frozen=True)
class ColorSpec:
    """How a stream's YUV maps to RGB: the matrix and whether the range is full (0-255) or limited (16-235)."""

    matrix: Matrix = "bt601"
    full_range: bool = False


def nv12_to_rgb(nv12: torch.Tensor, out: torch.Tensor, spec: ColorSpec = ColorSpec()) -> torch.Tensor:
    """Convert one NV12 image (``[1.5 H, W]`` uint8: Y plane, then interleaved UV) into ``out`` (``[3, H, W]`` uint8).

    Runs on the tensors' device (GPU or CPU) on the current stream. Chroma is upsampled by
    repetition. This is the fallback conversion; a fused kernel can replace it with the same signature.

    Example::

        >>> import torch
        >>> nv12 = torch.full((6, 4), 128, dtype=torch.uint8); nv12[:4] = 235
        >>> nv12_to_rgb(nv12, torch.empty(3, 4, 4, dtype=torch.uint8))[:, 0, 0].tolist()
        [255, 255, 255]
    """
    import torch

    height, width = out.shape[-2], out.shape[-1]
    if tuple(nv12.shape) != (height * 3 // 2, width):
        raise ValueError(f"an NV12 image for a {width}x{height} frame has shape {(height * 3 // 2, width)}, "
                         f"got {tuple(nv12.shape)}.")
    y = nv12[:height].to(torch.float32)
    uv = nv12[height:].reshape(height // 2, width // 2, 2).to(torch.float32)
    u = uv[..., 0].repeat_interleave(2, 0).repeat_interleave(2, 1) - 128.0
    v = uv[..., 1].repeat_interleave(2, 0).repeat_interleave(2, 1) - 128.0
    if not spec.full_range:
        y = (y - 16.0) * (255.0 / 219.0)
        u = u * (255.0 / 224.0)
        v = v * (255.0 / 224.0)
    kr, kb = _MATRIX_K[spec.matrix]
    kg = 1.0 - kr - kb
    r = y + 2.0 * (1.0 - kr) * v
    b = y + 2.0 * (1.0 - kb) * u
    g = (y - kr * r - kb * b) / kg
    out.copy_(torch.stack((r, g, b)).round_().clamp_(0, 255))
    return out


@dataclass
class Nv12Frame:
    """A decoded NV12 surface, valid until the next decode on its decoder; :meth:`write_into` converts it."""

    surface: Any  # torch.Tensor [1.5 H, W] uint8
    spec: ColorSpec
    stream: Any  # torch.cuda.Stream the surface is ready on, or None on the CPU
    index: int

    def write_into(self, out: torch.Tensor, *, after: Any = None) -> None:
        """Convert into ``out`` (``[3, H, W]``) on the decoder's stream, after event ``after`` when given."""
        import contextlib

        import torch

        if self.stream is None:
            nv12_to_rgb(self.surface, out, self.spec)
            return
        if after is not None:
            self.stream.wait_event(after)
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            nv12_to_rgb(self.surface, out, self.spec)
        out.record_stream(self.stream)


# -- stream format -------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Format:
    codec: str
    width: int
    height: int
    bit_depth: int
    chroma: str
    color: ColorSpec
    reorders: bool


def _stream_format(stream: Any, codec: str) -> _Format:
    ctx = stream.codec_context
    pix = str(getattr(ctx.format, "name", "") or "")
    depth = 10 if "p10" in pix else 12 if "p12" in pix else 8
    chroma = "444" if "444" in pix else "422" if "422" in pix else "400" if pix.startswith("gray") else "420"
    full = pix.startswith("yuvj") or int(getattr(ctx, "color_range", 0) or 0) == 2
    matrix: Matrix = "bt709" if int(getattr(ctx, "colorspace", 2) or 2) == 1 else "bt601"
    reorders = bool(getattr(ctx, "has_b_frames", True))
    return _Format(codec, int(ctx.width), int(ctx.height), depth, chroma, ColorSpec(matrix, full), reorders)


_CAPS: dict[tuple[int, str, str, int], dict[str, int]] = {}
_CAPS_LOCK = threading.Lock()


def _caps(nvc: ModuleType, gpu: int, codec: str, chroma: str, depth: int) -> dict[str, int]:
    key = (gpu, codec, chroma, depth)
    with _CAPS_LOCK:
        if key not in _CAPS:
            chroma_enum = getattr(nvc.cudaVideoChromaFormat, {"400": "Monochrome"}.get(chroma, chroma), None)
            try:
                caps = nvc.GetDecoderCaps(
                    gpuid=gpu, codec=getattr(nvc.cudaVideoCodec, _NVDEC_CODECS[codec]), chromaformat=chroma_enum,
                    bitdepth=depth,
                )
            except Exception:  # noqa: BLE001 - capabilities are advisory; decoding reports real failures
                caps = {}
            _CAPS[key] = dict(caps) if isinstance(caps, dict) else {}
        return _CAPS[key]


def decode_engine_count(gpu: int = 0, *, codec: str = "hevc") -> int:
    """NVDEC engines on ``gpu`` (``GetDecoderCaps``' ``num_decoder_engines``); 1 when unknown."""
    from lightning_vstream.decode.gpu import import_pynvvideocodec

    caps = _caps(import_pynvvideocodec(), gpu, codec, "420", 8)
    return max(int(caps.get("num_decoder_engines", 1) or 1), 1)


# -- packets -------------------------------------------------------------------------------------
class _Packets:
    """PyAV demuxing of one file: packets checked against the frame table's CRCs, then Annex-B filtered."""

    def __init__(self, path: Path, info: VideoInfo, where: str) -> None:
        import av

        self.info, self.where = info, where
        if not path.is_file():
            raise FileNotFoundError(f"video file {str(path)!r} does not exist.")
        try:
            self.container = av.open(str(path), mode="r")
        except av.FFmpegError as err:
            raise VideoDecodeError(f"{where} is not a readable video file: {err}") from err
        if not self.container.streams.video:
            self.container.close()
            raise VideoDecodeError(f"{where} holds no video stream.")
        self.stream = self.container.streams.video[0]
        config = zlib.crc32(self.stream.codec_context.extradata or b"")
        if info.config_crc32 is not None and config != info.config_crc32:
            self.container.close()
            raise VideoDecodeError(
                f"{where}: the codec configuration (SPS/PPS) differs from the checksum recorded when the index was "
                f"built {_CHECKSUM_FIX}"
            )
        self.filter_name = _ANNEXB_FILTERS.get(info.codec)
        self.bsf: Any = None

    def seek(self, target: int) -> Iterator[Any]:
        """Packets from the keyframe at or before ``target`` (stream time base)."""
        self.container.seek(target, stream=self.stream, backward=True)
        if self.filter_name is not None:
            from av.bitstream import BitStreamFilterContext

            self.bsf = BitStreamFilterContext(self.filter_name, self.stream)
        return self._packets()

    def _packets(self) -> Iterator[Any]:
        crcs = self.info.crc32
        for packet in self.container.demux(self.stream):
            if packet.size == 0:
                continue
            if crcs is not None and packet.pts is not None:
                index = self.info.index_of_pts(packet.pts)
                if index is not None and zlib.crc32(packet) != crcs[index]:
                    raise VideoDecodeError(
                        f"{self.where} frame {index}: the compressed data differs from the checksum recorded when "
                        f"the index was built {_CHECKSUM_FIX}"
                    )
            if self.bsf is None:
                yield packet
            else:
                yield from self.bsf.filter(packet)

    def close(self) -> None:
        self.container.close()


# -- the decoder ---------------------------------------------------------------------------------
@dataclass
class _Session:
    decoder: Any
    stream: Any  # torch.cuda.Stream, or None without CUDA (test doubles)
    low_latency: bool


def _create_session(nvc: ModuleType, key: tuple[Hashable, ...]) -> _Session:
    import torch

    gpu, codec, width, height, _depth, _chroma, low = key
    stream = torch.cuda.Stream(device=gpu) if torch.cuda.is_available() else None  # type: ignore[arg-type]
    latency = nvc.DisplayDecodeLatencyType.LOW if low else nvc.DisplayDecodeLatencyType.NATIVE
    decoder = nvc.CreateDecoder(
        gpuid=gpu,
        codec=getattr(nvc.cudaVideoCodec, _NVDEC_CODECS[str(codec)]),
        cudacontext=0,
        cudastream=stream.cuda_stream if stream is not None else 0,
        usedevicememory=True,
        maxwidth=width,
        maxheight=height,
        outputColorType=nvc.OutputColorType.NATIVE,
        latency=latency,
    )
    return _Session(decoder, stream, bool(low))


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
        self._packets: _Packets | None = None
        self._format: _Format | None = None
        self._key: tuple[Hashable, ...] | None = None
        self._session: _Session | None = None
        self._dirty = False
        self._pending: Any = None  # CUDA event after the last conversion from a decoder surface
        self.frames_decoded = 0
        self.frames_converted = 0

    def _where(self, index: int | None = None) -> str:
        where = repr(str(self.path)) + (f" ({self.label})" if self.label else "")
        return where if index is None else f"{where} frame {index}"

    @property
    def pool(self) -> DecoderPool:
        if self._pool is None:
            from lightning_vstream.decode.gpu import shared_decoder_pool

            self._pool = shared_decoder_pool()
        return self._pool

    def _open(self) -> None:
        from lightning_vstream.decode.gpu import import_pynvvideocodec

        info = self.info
        if info.codec not in _NVDEC_CODECS:
            raise DecoderCapabilityError(
                f"{self._where()} uses codec {info.codec!r}, which NVDEC decoding does not take here (supported: "
                f"{sorted(_NVDEC_CODECS)}); use decode_device='cpu' or transcode the file to H.264/HEVC."
            )
        nvc = import_pynvvideocodec()
        packets = _Packets(self.path, info, self._where())
        try:
            fmt = _stream_format(packets.stream, info.codec)
            if (fmt.bit_depth, fmt.chroma) != (8, "420"):
                raise DecoderCapabilityError(
                    f"{self._where()} is {fmt.bit_depth}-bit {fmt.chroma}; GPU random access decodes 8-bit 4:2:0 "
                    "streams. Use decode_device='cpu', or transcode to 8-bit 4:2:0 (`-pix_fmt yuv420p`)."
                )
            caps = _caps(nvc, self.gpu, fmt.codec, fmt.chroma, fmt.bit_depth)
            too_big = fmt.width > caps.get("width_max", fmt.width) or fmt.height > caps.get("height_max", fmt.height)
            too_small = fmt.width < caps.get("width_min", 0) or fmt.height < caps.get("height_min", 0)
            if too_big or too_small:
                raise DecoderCapabilityError(
                    f"{self._where()} is {fmt.width}x{fmt.height}, outside what NVDEC on GPU {self.gpu} decodes for "
                    f"{fmt.codec} ({caps.get('width_min')}x{caps.get('height_min')} to "
                    f"{caps.get('width_max')}x{caps.get('height_max')}); use decode_device='cpu'."
                )
            key = (self.gpu, fmt.codec, fmt.width, fmt.height, fmt.bit_depth, fmt.chroma, not fmt.reorders)
            try:
                session = self.pool.acquire(key, lambda: _create_session(nvc, key))
            except Exception as err:
                raise VideoDecodeError(f"{self._where()}: creating the NVDEC decoder failed: {err}") from err
        except BaseException:
            packets.close()
            raise
        self._nvc, self._packets, self._format, self._key, self._session = nvc, packets, fmt, key, session
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

    def _packet_data(self, packet: Any) -> tuple[Any, Any]:
        import numpy as np

        nvc, session = self._nvc, self._session
        assert nvc is not None and session is not None
        buffer = np.frombuffer(packet, dtype=np.uint8)
        data = nvc.PacketData()
        data.bsl_data = int(buffer.ctypes.data)
        data.bsl = int(buffer.size)
        if packet.pts is None:
            raise VideoDecodeError(
                f"{self._where()}: a packet has no presentation timestamp, so its frame cannot be identified; "
                "remux the file (`ffmpeg -i in.mp4 -c copy -fflags +genpts out.mp4`)."
            )
        data.pts = int(packet.pts)
        if session.low_latency:
            data.decode_flag = nvc.VideoPacketFlag.ENDOFPICTURE
        return data, buffer

    def decode_gop(self, task: GopTask, emit: Emit) -> None:
        """Decode ``task`` from its keyframe; ``emit(index, Nv12Frame)`` for each wanted frame, ascending."""
        if self._session is None:
            self._open()
        nvc, session, packets, fmt = self._nvc, self._session, self._packets, self._format
        assert nvc is not None and session is not None and packets is not None and fmt is not None
        info = self.info
        remaining = list(task.frames)
        gop = task.gop
        self._flush()
        source = packets.seek(info.key_seek[gop])
        first = True  # the next frame out is the first since the last seek
        while remaining:
            packet, frames = self._step(source, remaining[0])
            restart = False
            for frame in frames:
                self.frames_decoded += 1
                pts = int(frame.getPTS())
                index = info.index_of_pts(pts)
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
                emit(index, Nv12Frame(_surface(frame, session.stream), fmt.color, session.stream, index))
                self._converted_on_stream()
            if restart:
                self._flush()
                gop -= 1
                source = packets.seek(info.key_seek[gop])
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
                data, keep_alive = self._packet_data(packet)
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
            except Exception:  # noqa: BLE001 - a decoder that cannot flush is dropped, not reused
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
