"""NVIDIA GPU decoding with PyNvVideoCodec (NVDEC), frame-exact, frames never visiting host memory.

How a frame travels:

1. **demux** (CPU, :data:`~lightning_vstream.profiling.RANGE_DEMUX`): PyAV reads the compressed
   packets and converts H.264/H.265 to the Annex-B form NVDEC's parser needs
   (``h264_mp4toannexb`` / ``hevc_mp4toannexb``). PyAV rather than PyNvVideoCodec's own demuxer
   because seeking must use the frame table's seek targets exactly as
   :class:`~lightning_vstream.decode.cpu.PyAVDecoder` does: PyNvDemuxer's ``Seek`` takes a sample
   number, not a timestamp, and cannot step back when a demuxer overshoots.
2. **decode** (GPU, :data:`~lightning_vstream.profiling.RANGE_DECODE`): PyNvVideoCodec's decoder
   (``CreateDecoder``, ``usedevicememory=True``) decodes on NVDEC and converts YUV to RGB with its
   own CUDA kernel (``outputColorType`` ``RGBP`` for ``layout="chw"``, ``RGB`` for ``"hwc"``).
   Each packet carries its presentation timestamp, and every frame that comes out is checked
   against the frame table, so a frame is never returned under the wrong index.
3. **hand-off** (GPU, :data:`~lightning_vstream.profiling.RANGE_HANDOFF`): ``torch.from_dlpack``
   wraps the decoder's surface without a copy, ordered after the decoder's work by the DLPack
   stream protocol; the frame is then copied on the GPU into torch-owned memory, because the
   decoder reuses its surfaces for later frames.

Decoders are expensive to create (tens of milliseconds), so closed :class:`NvDecoder` s hand theirs
back to a :class:`DecoderPool`, and the next file with the same GPU, codec, size and output format
takes it instead of creating one. A pool is per process: with ``decode_device="cuda"`` DataLoader
workers must be started with ``multiprocessing_context="spawn"`` (CUDA does not survive ``fork``).

PyNvVideoCodec is imported only when a decoder first opens a file: on machines without an NVIDIA
driver its import fails, and the CPU path never touches it.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import warnings
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from lightning_vstream.decode.base import DecoderBase, Layout, VideoDecodeError, VideoInfo
from lightning_vstream.profiling import RANGE_DECODE, RANGE_DEMUX, RANGE_HANDOFF, nvtx_range

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

DecodeDevice = Literal["cpu", "cuda", "auto"]

GPU_INSTALL_HINT = (
    "GPU decoding needs PyNvVideoCodec and an NVIDIA driver with NVDEC: run "
    "`pip install lightning_vstream[gpu]` on a machine with an NVIDIA GPU and driver, or use "
    "decode_device='cpu'."
)

#: FFmpeg codec name -> ``PyNvVideoCodec.cudaVideoCodec`` member, for codecs whose packets NVDEC
#: takes as PyAV demuxes them (after the Annex-B filter for H.264/H.265).
_NVDEC_CODECS = {
    "h264": "H264",
    "hevc": "HEVC",
    "av1": "AV1",
    "vp9": "VP9",
    "vp8": "VP8",
    "mpeg2video": "MPEG2",
}
_ANNEXB_FILTERS = {"h264": "h264_mp4toannexb", "hevc": "hevc_mp4toannexb"}
_OUTPUT_COLOR = {"chw": "RGBP", "hwc": "RGB"}

T = TypeVar("T")


# -- availability and device choice ------------------------------------------------------------
def import_pynvvideocodec() -> ModuleType:
    """Import and return the ``PyNvVideoCodec`` module.

    Raises:
        ImportError: It is not installed, or its import failed (it fails on machines without an
            NVIDIA driver); the message says how to fix it.
    """
    try:
        import PyNvVideoCodec
    except Exception as err:  # noqa: BLE001 - without a driver its import raises RuntimeError, not ImportError
        raise ImportError(
            f"PyNvVideoCodec could not be imported ({type(err).__name__}: {err}). {GPU_INSTALL_HINT}"
        ) from err
    if not hasattr(PyNvVideoCodec, "OutputColorType"):
        version = getattr(PyNvVideoCodec, "__version__", "unknown")
        raise ImportError(
            f"PyNvVideoCodec {version} has no OutputColorType (RGB output on the GPU); "
            "install pynvvideocodec>=2.0."
        )
    return PyNvVideoCodec


def nvdec_available() -> bool:
    """True when PyNvVideoCodec imports (which needs an NVIDIA driver); never raises."""
    try:
        import_pynvvideocodec()
    except ImportError:
        return False
    return True


def resolve_decode_device(
    decode_device: DecodeDevice,
    local_rank: int = 0,
    *,
    root_device: torch.device | str | None = None,
    cuda_available: bool | None = None,
    device_count: int | None = None,
    nvdec: bool | None = None,
) -> torch.device:
    """Choose the device frames are decoded on.

    ``"cpu"`` always decodes with PyAV. ``"cuda"`` decodes with NVDEC on this process's GPU and
    fails loudly when that is impossible. ``"auto"`` picks ``"cuda"`` when torch sees a GPU and
    PyNvVideoCodec imports, and ``"cpu"`` otherwise (with a warning when only PyNvVideoCodec is
    missing).

    The GPU is ``root_device`` when it is a CUDA device: pass ``trainer.strategy.root_device``,
    which Lightning sets per rank (with ``devices=[2, 3]``, local rank 0 trains on ``cuda:2``).
    Without it, local rank ``r`` decodes on ``cuda:r``.

    Args:
        decode_device: ``"cpu"``, ``"cuda"`` or ``"auto"``.
        local_rank: This process's rank on its node.
        root_device: The device this rank trains on, when known.
        cuda_available: Whether CUDA is usable; probed with ``torch.cuda.is_available()`` if None.
        device_count: Number of visible GPUs; probed with ``torch.cuda.device_count()`` if None.
        nvdec: Whether PyNvVideoCodec imports; probed if None.

    Returns:
        ``torch.device("cpu")`` or ``torch.device("cuda", index)``.

    Raises:
        ValueError: ``decode_device`` is not one of the three choices, ``local_rank`` is negative,
            or the local rank has no GPU of its own.
        RuntimeError: ``decode_device="cuda"`` but CUDA is not available.
        ImportError: ``decode_device="cuda"`` but PyNvVideoCodec cannot be imported.

    Example::

        >>> resolve_decode_device("auto", 0, cuda_available=False)
        device(type='cpu')
        >>> resolve_decode_device("cuda", 1, cuda_available=True, device_count=2, nvdec=True)
        device(type='cuda', index=1)
    """
    import torch

    if decode_device not in ("cpu", "cuda", "auto"):
        raise ValueError(f"decode_device={decode_device!r} is not supported; use 'cpu', 'cuda' or 'auto'.")
    if not isinstance(local_rank, int) or local_rank < 0:
        raise ValueError(f"local_rank={local_rank!r} must be a non-negative integer.")
    if decode_device == "cpu":
        return torch.device("cpu")
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if not cuda_available:
        if decode_device == "cuda":
            raise RuntimeError(
                "decode_device='cuda' needs a CUDA GPU, but torch.cuda.is_available() is False (no "
                "NVIDIA driver, a CPU-only torch build, or CUDA_VISIBLE_DEVICES hides every GPU). Use "
                "decode_device='cpu', or 'auto' to fall back to the CPU automatically."
            )
        return torch.device("cpu")
    if nvdec is None:
        nvdec = nvdec_available()
    if not nvdec:
        if decode_device == "cuda":
            import_pynvvideocodec()  # raises the ImportError that explains the fix
            raise ImportError(f"PyNvVideoCodec is not usable. {GPU_INSTALL_HINT}")
        warnings.warn(
            "decode_device='auto' decodes on the CPU: CUDA is available but PyNvVideoCodec is not. "
            "Run `pip install lightning_vstream[gpu]` to decode on the GPU.",
            stacklevel=2,
        )
        return torch.device("cpu")
    if root_device is not None:
        root = torch.device(root_device)
        if root.type == "cuda" and root.index is not None:
            return root
    if device_count is None:
        device_count = torch.cuda.device_count()
    if local_rank >= device_count:
        raise ValueError(
            f"local_rank={local_rank} has no GPU of its own: this process sees {device_count} CUDA "
            f"device(s). Pass root_device=trainer.strategy.root_device, or check CUDA_VISIBLE_DEVICES."
        )
    return torch.device("cuda", local_rank)


# -- decoder reuse -----------------------------------------------------------------------------
@dataclass(frozen=True)
class DecoderKey:
    """What a decoder must match to be reused: GPU, codec, coded size and output colour format."""

    gpu: int
    codec: str
    width: int
    height: int
    color: str


class DecoderPool:
    """Idle decoders kept for reuse, keyed by :class:`DecoderKey` (any hashable key works).

    :meth:`acquire` returns an idle decoder with the same key, or calls ``create`` for a new one;
    :meth:`release` gives a decoder back, keeping at most ``max_idle_per_key`` per key (extra ones
    are dropped and freed by garbage collection). Thread-safe; a decoder is handed to one user at a
    time. A pool inherited through ``fork`` empties itself, since CUDA objects do not survive it.

    Args:
        max_idle_per_key: Idle decoders kept per key; 0 disables reuse.

    Example::

        >>> pool = DecoderPool()
        >>> dec = pool.acquire("hevc-1600x900", lambda: object())
        >>> pool.release("hevc-1600x900", dec)
        True
        >>> pool.acquire("hevc-1600x900", lambda: object()) is dec, pool.stats["reused"]
        (True, 1)
    """

    def __init__(self, *, max_idle_per_key: int = 8) -> None:
        if max_idle_per_key < 0:
            raise ValueError(f"max_idle_per_key={max_idle_per_key!r} must be >= 0.")
        self.max_idle_per_key = max_idle_per_key
        self._lock = threading.Lock()
        self._idle: dict[Hashable, list[Any]] = collections.defaultdict(list)
        self._pid = os.getpid()
        self._created = 0
        self._reused = 0
        self._dropped = 0

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            self._idle = collections.defaultdict(list)
            self._pid = os.getpid()

    def acquire(self, key: Hashable, create: Callable[[], T]) -> T:
        """An idle decoder for ``key``, or a new one from ``create()``."""
        with self._lock:
            self._check_process()
            idle = self._idle.get(key)
            if idle:
                self._reused += 1
                return idle.pop()
        decoder = create()  # outside the lock: creating a decoder takes milliseconds
        with self._lock:
            self._created += 1
        return decoder

    def release(self, key: Hashable, decoder: Any) -> bool:
        """Give ``decoder`` back for reuse; returns False when it was dropped instead."""
        with self._lock:
            self._check_process()
            idle = self._idle[key]
            if len(idle) >= self.max_idle_per_key:
                self._dropped += 1
                return False
            idle.append(decoder)
            return True

    def idle(self, key: Hashable | None = None) -> int:
        """Number of idle decoders for ``key``, or in total."""
        with self._lock:
            if key is not None:
                return len(self._idle.get(key, ()))
            return sum(len(v) for v in self._idle.values())

    def clear(self) -> None:
        """Drop every idle decoder."""
        with self._lock:
            self._idle.clear()

    @property
    def stats(self) -> dict[str, int]:
        """Counters: ``created``, ``reused``, ``dropped`` (released beyond the limit) and ``idle``."""
        with self._lock:
            return {
                "created": self._created,
                "reused": self._reused,
                "dropped": self._dropped,
                "idle": sum(len(v) for v in self._idle.values()),
            }


_shared_pool: DecoderPool | None = None
_shared_pool_lock = threading.Lock()


def shared_decoder_pool() -> DecoderPool:
    """The process-wide pool :class:`NvDecoder` uses unless given another (created on first use)."""
    global _shared_pool
    with _shared_pool_lock:
        if _shared_pool is None:
            _shared_pool = DecoderPool()
        return _shared_pool


# -- packets -----------------------------------------------------------------------------------
class _PacketSource:
    """One video stream demuxed by PyAV, as Annex-B packets with presentation timestamps."""

    def __init__(self, path: Path, codec: str) -> None:
        import av

        if not path.is_file():
            raise FileNotFoundError(f"video file {str(path)!r} does not exist.")
        try:
            self._container = av.open(str(path), mode="r")
        except av.FFmpegError as err:
            raise VideoDecodeError(f"{str(path)!r} is not a readable video file: {err}") from err
        if not self._container.streams.video:
            self._container.close()
            raise VideoDecodeError(f"{str(path)!r} holds no video stream.")
        from lightning_vstream.decode.cpu import _video_stream

        self._stream = _video_stream(self._container, path)  # the stream probe_video reads: FFmpeg's best
        self._filter_name = _ANNEXB_FILTERS.get(codec)
        self._bsf = self._make_filter()

    def _make_filter(self) -> Any:
        if self._filter_name is None:
            return None
        from av.bitstream import BitStreamFilterContext

        return BitStreamFilterContext(self._filter_name, self._stream)

    def seek(self, target: int) -> None:
        """Move to the keyframe at or before ``target`` (stream time base), as the frame table says."""
        self._container.seek(target, stream=self._stream, backward=True)
        # The filter inserts parameter sets in front of keyframes; start it fresh after a jump.
        self._bsf = self._make_filter()

    def packets(self) -> Iterator[Any]:
        """Remaining packets (PyAV ``Packet`` objects, which expose their bytes as a buffer)."""
        for packet in self._container.demux(self._stream):
            if packet.size == 0:
                continue  # demuxer flush packet
            if self._bsf is None:
                yield packet
            else:
                yield from self._bsf.filter(packet)

    def close(self) -> None:
        self._container.close()


def _packet_data(nvc: ModuleType, packet: Any) -> tuple[Any, Any]:
    """A PyNvVideoCodec ``PacketData`` pointing at ``packet``'s bytes, and the buffer to keep alive."""
    import numpy as np

    buffer = np.frombuffer(packet, dtype=np.uint8)
    data = nvc.PacketData()
    data.bsl_data = int(buffer.ctypes.data)
    data.bsl = int(buffer.size)
    pts = packet.pts if packet.pts is not None else packet.dts
    data.pts = int(pts) if pts is not None else 0
    return data, buffer


def _frame_pts(frame: Any) -> int | None:
    get = getattr(frame, "getPTS", None)
    value = get() if get is not None else getattr(frame, "timestamp", None)
    return None if value is None else int(value)


@dataclass
class _Session:
    """A PyNvVideoCodec decoder and the CUDA stream its work and our copies run on."""

    decoder: Any
    stream: Any  # torch.cuda.Stream, or None when CUDA is unavailable (test doubles)


def _create_session(nvc: ModuleType, key: DecoderKey) -> _Session:
    import torch

    stream = torch.cuda.Stream(device=key.gpu) if torch.cuda.is_available() else None
    kwargs: dict[str, Any] = {
        "gpuid": key.gpu,
        "codec": getattr(nvc.cudaVideoCodec, _NVDEC_CODECS[key.codec]),
        "cudacontext": 0,  # the device's primary context, which torch uses too
        "cudastream": stream.cuda_stream if stream is not None else 0,
        "usedevicememory": True,
        "maxwidth": key.width,
        "maxheight": key.height,
        "outputColorType": getattr(nvc.OutputColorType, key.color),
    }
    latency = getattr(getattr(nvc, "DisplayDecodeLatencyType", None), "LOW", None)
    if latency is not None:
        # Frames come out as soon as they are decodable, still in presentation order.
        kwargs["latency"] = latency
    return _Session(nvc.CreateDecoder(**kwargs), stream)


def _gpu_ordinal(device: Any) -> int:
    if isinstance(device, bool):
        raise TypeError(f"device={device!r} must be a CUDA device or GPU ordinal.")
    if isinstance(device, int):
        index = device
    else:
        import torch

        dev = torch.device(device)
        if dev.type != "cuda":
            raise ValueError(
                f"NvDecoder decodes on an NVIDIA GPU, but device={str(dev)!r}; use PyAVDecoder "
                "(decode_device='cpu') for CPU decoding."
            )
        index = dev.index if dev.index is not None else 0
    if index < 0:
        raise ValueError(f"device={device!r}: the GPU ordinal must be >= 0.")
    return index


# -- the decoder -------------------------------------------------------------------------------
class NvDecoder(DecoderBase):
    """Frame-exact decoder for one video file on an NVIDIA GPU (NVDEC via PyNvVideoCodec).

    Behaves like :class:`~lightning_vstream.decode.cpu.PyAVDecoder`, with frames returned as
    uint8 RGB CUDA tensors: opens lazily on first use; sequential :meth:`read` calls keep the
    decoder's state and decode each frame once; :meth:`seek` decodes forward within the current
    GOP and otherwise jumps to the keyframe at or before the target (stepping back a GOP if the
    demuxer overshoots); every frame's timestamp is checked against the frame table. On a jump,
    frames still inside the decoder are flushed and discarded (not counted in
    :attr:`frames_decoded`). :meth:`close` flushes the decoder and returns it to ``pool`` for the
    next file of the same codec and size.

    Args:
        path: Video file.
        info: Frame table, if already known (from an index's metadata); probed with PyAV otherwise.
        device: CUDA device (or GPU ordinal) to decode on; see :func:`resolve_decode_device`.
        layout: ``"chw"`` (default) or ``"hwc"`` for the returned tensors.
        label: Where the file comes from (clip and camera), used in error messages.
        pool: Pool to take decoders from and return them to; :func:`shared_decoder_pool` if None.

    Raises:
        ValueError: ``layout`` or ``device`` is not supported.

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
    ) -> None:
        if layout not in ("chw", "hwc"):
            raise ValueError(f"layout={layout!r} is not supported; use 'chw' or 'hwc'.")
        self.path = Path(path)
        self.gpu = _gpu_ordinal(device)
        self.layout = layout
        self.label = label
        self._pool = pool
        self._info = info
        self._nvc: ModuleType | None = None
        self._key: DecoderKey | None = None
        self._session: _Session | None = None
        self._source: _PacketSource | None = None
        self._packets: Iterator[Any] | None = None
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
    def _next(self) -> int:
        """Index of the next frame the decoder pipeline yields (-1 when unknown)."""
        if self._queue:
            return self._queue[0][0]
        return self._last + 1 if self._last >= 0 else -1

    # -- opening and closing ----------------------------------------------------------------
    def _open(self) -> None:
        info = self.info
        if info.codec not in _NVDEC_CODECS:
            raise ValueError(
                f"{self._where()} uses codec {info.codec!r}, which the GPU decoder does not take "
                f"(supported: {sorted(_NVDEC_CODECS)}); decode it with decode_device='cpu'."
            )
        nvc = import_pynvvideocodec()
        key = DecoderKey(self.gpu, info.codec, info.width, info.height, _OUTPUT_COLOR[self.layout])
        source = _PacketSource(self.path, info.codec)
        try:
            session = self.pool.acquire(key, lambda: _create_session(nvc, key))
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
            except Exception:  # noqa: BLE001 - a decoder that cannot flush is not worth keeping
                reusable = False
            if reusable:
                self.pool.release(key, session)
        if self._source is not None:
            try:
                self._source.close()
            except Exception:  # noqa: BLE001 - closing a broken file must not mask the real error
                pass
        self._session = None
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
            raise RuntimeError("internal error: no packet source after opening")
        self._flush()
        self._queue.clear()
        with nvtx_range(RANGE_DEMUX):
            source.seek(self.info.key_seek[key_ordinal])
        self._seeks += 1
        self._packets = source.packets()
        self._ended = False
        self._last = -1

    # -- decoding ---------------------------------------------------------------------------
    def read(self) -> torch.Tensor:
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
            index, tensor = self._next_frame(target)
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
            self._target = index + 1
            return tensor

    def get(self, index: int) -> torch.Tensor:
        """Return frame ``index`` (see :meth:`seek` for the cost)."""
        self.seek(index)
        return self.read()

    def _next_frame(self, keep_from: int) -> tuple[int, Any]:
        """The next ``(index, tensor)`` in presentation order; tensors only for ``index >= keep_from``."""
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

        session, nvc, packets = self._session, self._nvc, self._packets
        if session is None or nvc is None or packets is None:  # pragma: no cover - read() opens first
            raise RuntimeError("internal error: decoding from a closed NvDecoder")
        with nvtx_range(RANGE_DEMUX):
            try:
                packet = next(packets, None)
            except av.FFmpegError as err:
                target = self._target
                self._reset(reusable=False)
                raise VideoDecodeError(f"{self._where(target)}: demuxing failed: {err}") from err
        try:
            with nvtx_range(RANGE_DECODE):
                if packet is None:
                    frames = list(session.decoder.Decode(nvc.PacketData()))
                    self._ended, self._dirty = True, False
                else:
                    data, keep_alive = _packet_data(nvc, packet)
                    self._dirty = True
                    frames = list(session.decoder.Decode(data))
                    del keep_alive  # NVDEC's parser has copied the bytes once Decode returns
        except Exception as err:  # noqa: BLE001 - PyNvVideoCodec raises its own exception types
            target = self._target
            self._reset(reusable=False)
            raise VideoDecodeError(f"{self._where(target)}: NVDEC decoding failed: {err}") from err
        return frames

    def _take(self, frame: Any, keep_from: int) -> None:
        info = self.info
        self._frames_decoded += 1
        pts = _frame_pts(frame)
        index = info.index_of_pts(pts) if pts is not None else None
        if index is None:
            target = self._target
            self._reset(reusable=False)
            raise VideoDecodeError(
                f"{self._where(target)}: the decoder produced a frame with timestamp {pts!r}, which "
                "is not in the file's frame table (corrupt file, or a stale index: rebuild it with "
                "`vstream index`)."
            )
        # Frames before the target are dropped without touching their pixels.
        tensor = self._to_tensor(frame, index) if index >= keep_from else None
        self._queue.append((index, tensor))

    def _to_tensor(self, frame: Any, index: int) -> torch.Tensor:
        import torch

        info = self.info
        expected = (3, info.height, info.width) if self.layout == "chw" else (info.height, info.width, 3)
        stream = self._session.stream if self._session is not None else None
        with nvtx_range(RANGE_HANDOFF):
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                surface = torch.from_dlpack(frame)  # zero-copy view of the decoder's surface
                if tuple(surface.shape) != expected or surface.dtype != torch.uint8:
                    target = self._target
                    self._reset(reusable=False)
                    raise VideoDecodeError(
                        f"{self._where(target)}: NVDEC returned a {surface.dtype} frame of shape "
                        f"{tuple(surface.shape)} for frame {index}; expected uint8 {expected}."
                    )
                # The decoder overwrites its surfaces with later frames: copy out, on the GPU.
                out = surface.clone(memory_format=torch.contiguous_format)
            if stream is not None and out.is_cuda:
                consumer = torch.cuda.current_stream(out.device)
                consumer.wait_stream(stream)
                out.record_stream(consumer)
        return out

    def __repr__(self) -> str:
        state = "open" if self._session is not None else "closed"
        return f"NvDecoder({str(self.path)!r}, gpu={self.gpu}, position={self._target}, {state})"

