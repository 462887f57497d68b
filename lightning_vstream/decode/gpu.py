"""NVIDIA GPU decoding with PyNvVideoCodec (NVDEC), frame-exact, frames never visiting host memory.

How a frame travels:

1. **demux** (CPU, :data:`~lightning_vstream.profiling.RANGE_DEMUX`): PyAV reads the compressed
   packets, checks them against the frame table's CRC-32s and converts H.264/H.265 to the Annex-B
   form NVDEC's parser needs (:class:`~lightning_vstream.decode.nvdec.PacketSource`). PyAV rather
   than PyNvVideoCodec's demuxer because seeking must use the frame table's seek targets exactly as
   :class:`~lightning_vstream.decode.cpu.PyAVDecoder` does.
2. **decode** (GPU, :data:`~lightning_vstream.profiling.RANGE_DECODE`): a PyNvVideoCodec decoder
   on its own CUDA stream decodes to NV12 (P016 for 10-bit) in device memory. Each packet carries
   its presentation timestamp, and every frame that comes out is checked against the frame table,
   so a frame is never returned under the wrong index. Latency mode ``NATIVE`` keeps NVDEC
   pipelined; ``LOW`` is used only for streams that declare no reordering (no B-frames).
3. **hand-off and colour** (GPU, :data:`~lightning_vstream.profiling.RANGE_HANDOFF`,
   :data:`~lightning_vstream.profiling.RANGE_COLOR_CONVERT`): ``DecodedFrame.__dlpack__(stream=...)``
   wraps the decoder's surface without a copy, ordered on the decoder's stream, and
   :func:`~lightning_vstream.decode.nv12.nv12_to_rgb` converts it with the stream's own matrix and
   range (FFmpeg's rules, so GPU frames match CPU frames) straight into the caller's tensor.

Decoders are expensive to create (tens of milliseconds), so closed :class:`NvDecoder` s hand theirs
back to a :class:`~lightning_vstream.decode.nvdec.DecoderPool`, and the next file with the same GPU,
codec, size, bit depth and chroma format takes it instead of creating one. A pool is per process.

PyNvVideoCodec is imported only when a decoder first opens a file: on machines without an NVIDIA
driver its import fails, and the CPU path never touches it.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from lightning_vstream.decode.base import (
    DecoderBase,
    Layout,
    VideoDecodeError,
    VideoInfo,
)
from lightning_vstream.decode.device import (
    GPU_INSTALL_HINT,
    DecodeDevice,
    import_pynvvideocodec,
    nvdec_available,
    resolve_decode_device,
)
from lightning_vstream.decode.nv12 import nv12_to_rgb
from lightning_vstream.decode.nvdec import (
    DecoderKey,
    DecoderPool,
    Latency,
    PacketSource,
    Session,
    check_decodable,
    create_session,
    frame_pts,
    packet_data,
    shared_decoder_pool,
)
from lightning_vstream.errors import ConfigurationError, ConfigurationTypeError, DecoderCapabilityError, UsageError
from lightning_vstream.profiling import (
    RANGE_COLOR_CONVERT,
    RANGE_DECODE,
    RANGE_DEMUX,
    RANGE_HANDOFF,
    nvtx_range,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "GPU_INSTALL_HINT",
    "DecodeDevice",
    "DecoderKey",
    "DecoderPool",
    "LatencyChoice",
    "NvDecoder",
    "import_pynvvideocodec",
    "nvdec_available",
    "resolve_decode_device",
    "shared_decoder_pool",
]

LatencyChoice = Literal["auto", "native", "low"]


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

    Work is ordered on CUDA streams, never by waiting on the host: the decoder and the colour
    conversion run on the decoder's own stream, and the stream current when :meth:`read` is called
    waits for them, so the frame is ready for whatever that stream runs next.

    Args:
        path: Video file.
        info: Frame table, if already known (from an index's metadata); probed with PyAV otherwise.
        device: CUDA device (or GPU ordinal) to decode on; see :func:`resolve_decode_device`.
        layout: ``"chw"`` (default) or ``"hwc"`` for the returned tensors.
        label: Where the file comes from (clip and camera), used in error messages.
        pool: Pool to take decoders from and return them to; :func:`shared_decoder_pool` if None.
        latency: ``"auto"`` (default) uses NVDEC's ``LOW`` latency mode only for streams that
            declare no frame reordering, ``NATIVE`` otherwise; ``"native"`` / ``"low"`` force one
            (``"low"`` on a stream with B-frames is refused).

    Raises:
        ValueError: ``layout``, ``latency`` or ``device`` is not supported.

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
    ) -> None:
        if layout not in ("chw", "hwc"):
            raise ConfigurationError(f"layout={layout!r} is not supported; use 'chw' or 'hwc'.")
        if latency not in ("auto", "native", "low"):
            raise ConfigurationError(f"latency={latency!r} is not supported; use 'auto', 'native' or 'low'.")
        self.path = Path(path)
        self.gpu = _gpu_ordinal(device)
        self.layout = layout
        self.label = label
        self.latency = latency
        self._pool = pool
        self._info = info
        self._nvc: ModuleType | None = None
        self._key: DecoderKey | None = None
        self._session: Session | None = None
        self._source: PacketSource | None = None
        self._packets: Iterator[Any] | None = None
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
    def device(self) -> torch.device:
        """The CUDA device frames are decoded on."""
        import torch

        return torch.device("cuda", self.gpu)

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
    def _latency_for(self, reorders: bool) -> Latency:
        if self.latency == "native":
            return "NATIVE"
        if self.latency == "low":
            if reorders:
                raise ConfigurationError(
                    f"{self._where()} reorders frames (B-frames), so latency='low' would return frames out of "
                    "order; use latency='auto' or 'native'."
                )
            return "LOW"
        return "NATIVE" if reorders else "LOW"

    def _open(self) -> None:
        info = self.info
        if info.identity is not None:
            # As on the CPU: a file that differs from its index entry is re-verified packet by packet
            # (FileChangedError if its content changed) before any frame is decoded.
            from lightning_vstream.index.identity import verify_identity

            self._info = info = verify_identity(self.path, info, self._where())
        nvc = import_pynvvideocodec()
        source = PacketSource(self.path, info, self._where())
        try:
            fmt = source.format
            check_decodable(nvc, self.gpu, fmt, self._where())
            key = DecoderKey(
                self.gpu,
                info.codec,
                info.width,
                info.height,
                fmt.bit_depth,
                fmt.chroma,
                "NATIVE",
                self._latency_for(fmt.reorders),
            )
        except BaseException:
            source.close()
            raise
        try:
            session = self.pool.acquire(key, lambda: create_session(nvc, key))
        except Exception as err:
            source.close()
            raise VideoDecodeError(f"{self._where()}: creating the NVDEC decoder failed: {err}") from err
        self._nvc, self._key, self._session, self._source = nvc, key, session, source
        self._packets = source.packets()
        self._queue.clear()
        self._dirty = False  # fresh decoders and pooled ones (flushed on release) hold nothing
        self._ended = False
        self._last = -1

    def _flush(self) -> None:
        """Send the end of stream so the decoder drops its state; discard the frames it returns."""
        self._queue.clear()  # their surfaces die with the next Decode
        if self._dirty and self._session is not None and self._nvc is not None:
            with nvtx_range(RANGE_DECODE):
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
        self._packets = None
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
            source.seek(self.info.key_seek[key_ordinal])
        self._seeks += 1
        self._packets = source.packets()
        self._ended = False
        self._last = -1

    # -- decoding ---------------------------------------------------------------------------
    def read(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """Decode the frame at :attr:`position` (into ``out`` when given) and advance by one.

        Args:
            out: A uint8 CUDA tensor of the frame's shape (any strides, for example a row of a
                batch) to write the RGB frame into; the conversion writes it once, directly.
        """
        info = self.info
        target = self._target
        if target >= info.frame_count:
            raise IndexError(
                f"{self._where()} has no frame {target}: it holds {info.frame_count} frames "
                f"(valid: 0..{info.frame_count - 1})."
            )
        key_ordinal = info.gop_of(target)
        if self._session is None:
            self._open()
            # A fresh file starts at its first keyframe: no seek needed for the first GOP.
            self._needs_seek = key_ordinal != 0
        just_jumped = False
        if self._needs_seek:
            self._jump(key_ordinal)
            self._needs_seek = False
            just_jumped = True
        while True:
            before = self._last
            index, frame = self._next_frame(target)
            if index < target:
                continue
            if index > target:
                if just_jumped and key_ordinal > 0:
                    # The demuxer landed past the wanted keyframe; step back one GOP.
                    key_ordinal -= 1
                    self._jump(key_ordinal)
                    continue
                self._reset(reusable=False)
                raise VideoDecodeError(
                    f"{self._where(target)}: the decoder skipped from frame {before} to frame {index}; "
                    "the frames between are missing or corrupt."
                )
            tensor = self._to_tensor(frame, index, out)
            self._target = index + 1
            return tensor

    def get(self, index: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Return frame ``index`` (see :meth:`seek` for the cost), written into ``out`` when given."""
        self.seek(index)
        return self.read(out)

    def _next_frame(self, keep_from: int) -> tuple[int, Any]:
        """The next ``(index, frame)`` in presentation order; frames before ``keep_from`` are dropped."""
        while not self._queue:
            if self._ended:
                target = self._target
                self._reset(reusable=False)
                raise VideoDecodeError(
                    f"{self._where(target)}: the file ended before this frame although its frame "
                    f"table lists {self.info.frame_count} frames (truncated file?)."
                )
            for frame in self._feed():
                self._take(frame, keep_from)
        item = self._queue.popleft()
        self._last = item[0]
        return item

    def _feed(self) -> list[Any]:
        """Send the next packet, or the end of the stream, to the decoder; return the frames it gives."""
        import av

        session, nvc, packets, key = self._session, self._nvc, self._packets, self._key
        if session is None or nvc is None or packets is None:  # pragma: no cover - read() opens first
            raise UsageError("internal error: decoding from a closed NvDecoder")
        with nvtx_range(RANGE_DEMUX):
            try:
                packet = next(packets, None)
            except av.FFmpegError as err:
                target = self._target
                self._reset(reusable=False)
                raise VideoDecodeError(f"{self._where(target)}: demuxing failed: {err}") from err
            except VideoDecodeError:
                self._reset(reusable=False)
                raise
        try:
            with nvtx_range(RANGE_DECODE):
                if packet is None:
                    frames = list(session.decoder.Decode(nvc.PacketData()))
                    self._ended, self._dirty = True, False
                else:
                    low = key is not None and key.latency == "LOW"
                    data, keep_alive = packet_data(nvc, packet, self._where(), end_of_picture=low)
                    self._dirty = True
                    frames = list(session.decoder.Decode(data))
                    del keep_alive  # NVDEC's parser has copied the bytes once Decode returns
        except VideoDecodeError:
            self._reset(reusable=False)
            raise
        except Exception as err:
            target = self._target
            self._reset(reusable=False)
            raise VideoDecodeError(f"{self._where(target)}: NVDEC decoding failed: {err}") from err
        return frames

    def _take(self, frame: Any, keep_from: int) -> None:
        info = self.info
        self._frames_decoded += 1
        pts = frame_pts(frame)
        index = info.index_of_pts(pts) if pts is not None else None
        if index is None:
            target = self._target
            self._reset(reusable=False)
            raise VideoDecodeError(
                f"{self._where(target)}: the decoder produced a frame with timestamp {pts!r}, which "
                "is not in the file's frame table (corrupt file, or a stale index: rebuild it with "
                "`vstream index`)."
            )
        if index >= keep_from:  # frames before the target are dropped without touching their pixels
            self._queue.append((index, frame))
        else:
            self._last = index

    def _surface(self, frame: Any, stream: Any) -> torch.Tensor:
        """The decoder's NV12 surface as a tensor (no copy), ordered on ``stream``."""
        import torch

        if stream is None:  # test doubles on machines without CUDA
            return torch.from_dlpack(frame)
        # Calling __dlpack__ directly: torch.from_dlpack(frame) first tries a newer protocol
        # version and pays an exception per frame. stream=0 is refused by PyNvVideoCodec.
        return torch.utils.dlpack.from_dlpack(frame.__dlpack__(stream=stream.cuda_stream))

    def _to_tensor(self, frame: Any, index: int, out: torch.Tensor | None) -> torch.Tensor:
        import torch

        info = self.info
        session = self._session
        stream: Any = session.stream if session is not None else None
        source = self._source
        spec = source.format.color if source is not None else None
        with nvtx_range(RANGE_HANDOFF):
            consumer = torch.cuda.current_stream(self.gpu) if stream is not None else None
            if out is not None and consumer is not None:
                stream.wait_stream(consumer)  # the caller's earlier use of `out` comes first
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                surface = self._surface(frame, stream)
                expected = (info.height * 3 // 2, info.width)
                if tuple(surface.shape) != expected or surface.dtype not in (torch.uint8, torch.uint16, torch.int16):
                    target = self._target
                    self._reset(reusable=False)
                    raise DecoderCapabilityError(
                        f"{self._where(target)}: NVDEC returned a {surface.dtype} surface of shape "
                        f"{tuple(surface.shape)} for frame {index}; expected NV12/P016 {expected}. Decode this "
                        "file with decode_device='cpu'."
                    )
                with nvtx_range(RANGE_COLOR_CONVERT):
                    result = (
                        nv12_to_rgb(surface, spec, out=out, layout=self.layout)
                        if spec is not None
                        else nv12_to_rgb(surface, out=out, layout=self.layout)
                    )
            if consumer is not None:
                consumer.wait_stream(stream)
                if out is None:
                    result.record_stream(consumer)
        return result

    def __repr__(self) -> str:
        state = "open" if self._session is not None else "closed"
        return f"NvDecoder({str(self.path)!r}, gpu={self.gpu}, position={self._target}, {state})"
