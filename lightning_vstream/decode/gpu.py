"""NVIDIA GPU decoding with PyNvVideoCodec (NVDEC), frame-exact, frames never visiting host memory.

How a frame travels:

1. **demux** (CPU): PyAV reads the compressed packets, checks them against the frame table's
   CRC-32s and converts H.264/H.265 to the Annex-B form NVDEC's parser needs
   (:class:`~lightning_vstream.decode.nvdec_sources.PacketSource`). PyAV rather than PyNvVideoCodec's
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
back to a :class:`~lightning_vstream.decode.decoder_pool.DecoderPool`, and the next file with the same GPU,
codec, size, bit depth and chroma format takes it instead of creating one. A pool is per process.

PyNvVideoCodec is imported only when a decoder first opens a file: on machines without an NVIDIA
driver its import fails, and the CPU path never touches it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_vstream.decode.base import VideoDecodeError
from lightning_vstream.decode.decoder_pool import DecoderPool, shared_decoder_pool
from lightning_vstream.decode.device import (
    GPU_INSTALL_HINT,
    DecodeDevice,
    gpu_failure,
    import_pynvvideocodec,
    nvdec_available,
    resolve_decode_device,
)
from lightning_vstream.decode.nvdec import DecoderKey, check_decodable, create_session
from lightning_vstream.decode.nvdec_file import NvFile, converter_for, verified
from lightning_vstream.decode.nvdec_sources import packet_source
from lightning_vstream.errors import DecoderCapabilityError, GpuError, UsageError
from lightning_vstream.profiling import RANGE_DEMUX, nvtx_range

if TYPE_CHECKING:
    import torch

__all__ = [
    "GPU_INSTALL_HINT",
    "DecodeDevice",
    "DecoderKey",
    "DecoderPool",
    "NvDecoder",
    "import_pynvvideocodec",
    "nvdec_available",
    "resolve_decode_device",
    "shared_decoder_pool",
]


# -- the decoder -------------------------------------------------------------------------------
class NvDecoder(NvFile):
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
            "pixels; install pynvvideocodec>=2.2.4, or decode this file with decode_device='cpu'."
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
