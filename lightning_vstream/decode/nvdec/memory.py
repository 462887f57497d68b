"""GPU memory NVDEC takes outside torch's allocator, and the check made before a run's first step.

A decoder's surfaces (its reference pictures, its output surfaces) and PyNvVideoCodec's output
buffers are allocated with ``cuMemAlloc`` inside ``Decode``, when the decoder meets a sequence
header; running out of memory there ends the process instead of raising. So before the first
step, the stream engine and random access compare what their decoders will take
(:func:`nvdec_bytes` per decoder, for every format an index holds) with the GPU's free memory
(``cudaMemGetInfo``) and raise :class:`~lightning_vstream.errors.GpuMemoryError` naming what to
lower when it does not fit (:func:`check_nvdec_memory`), and the stream engine's decode threads
create every decoder they will need before the first step (:func:`prepare_decoders`), so NVDEC
allocates its surfaces then, not at a clip switch hours into a run.

Example::

    >>> nvdec_bytes("hevc", 1600, 900, 8) // 2**20
    70
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_vstream.decode.base import VideoDecodeError, VideoInfo
from lightning_vstream.decode.device import FrameMemory
from lightning_vstream.decode.nvdec.pool import DecoderPool, shared_decoder_pool
from lightning_vstream.errors import DecoderCapabilityError, GpuMemoryError

if TYPE_CHECKING:
    from lightning_vstream.decode.nvdec.decoder import LatencyChoice

__all__ = ["DEFAULT_HEADROOM", "check_nvdec_memory", "nvdec_bytes", "one_file_per_format", "prepare_decoders"]

#: GPU memory left free for training after the decoders, unless told otherwise.
DEFAULT_HEADROOM = 2 << 30
#: Decode surfaces a decoder may ask for: the codec's largest decoded-picture buffer plus the 4 PyNvVideoCodec
#: adds (it asks ``min_num_decode_surfaces + 4``).
_DECODE_SURFACES = {"h264": 21, "hevc": 21, "av1": 14, "vp9": 14, "vp8": 8, "mpeg2video": 7}
#: Besides them: NVDEC's output surfaces (2) and the library's output buffers (one per frame one ``Decode``
#: returns, 2 at most when streaming).
_OTHER_SURFACES = 4
#: Per decoder, whatever its size: the driver's own state.
_PER_DECODER = 4 << 20
_GIB = 1 << 30


def nvdec_bytes(codec: str, width: int, height: int, bit_depth: int) -> int:
    """Bytes of GPU memory one decoder of this format may take at most (an estimate from NVDEC's rules).

    Surfaces are 4:2:0 (1.5 rows of samples per row of pixels) of the coded height (16-aligned), rows
    of one byte per sample up to 8 bits and two above, padded to 512 bytes (NVDEC's pitch); the count
    is the codec's largest decoded-picture buffer plus the output surfaces and buffers.

    Example::

        >>> nvdec_bytes("hevc", 1600, 900, 10) // 2**20, nvdec_bytes("h264", 256, 256, 8) // 2**20
        (120, 8)
    """
    pitch = -(-width * (1 if bit_depth <= 8 else 2) // 512) * 512
    frame = pitch * (-(-height // 16) * 16) * 3 // 2
    surfaces = _DECODE_SURFACES.get(codec, 21) + _OTHER_SURFACES
    return surfaces * frame + _PER_DECODER


def one_file_per_format(index: Any) -> list[tuple[Any, Any]]:
    """One camera file, with its frame table, per (codec, width, height) among an index's clips."""
    seen: dict[tuple[str, int, int], tuple[Any, Any]] = {}
    for clip in index.clips:
        for camera in clip.cameras:
            info = camera.info
            if info is None or getattr(camera.path, "is_dir", lambda: False)():
                continue
            seen.setdefault((info.codec, info.width, info.height), (camera.path, info))
    return list(seen.values())


def _bit_depth(info: VideoInfo) -> int:
    """The stream's bit depth from its codec configuration; 10 (the larger surfaces) when it cannot be read."""
    from lightning_vstream.decode.nvdec.packets import config_format

    found = config_format(info)
    return found.bit_depth if found is not None else 10


def check_nvdec_memory(
    gpu: int,
    decoders: Iterable[tuple[VideoInfo, int]],
    *,
    memory: FrameMemory,
    lower: str,
    headroom: int = DEFAULT_HEADROOM,
) -> dict[str, Any]:
    """Raise :class:`~lightning_vstream.errors.GpuMemoryError` unless ``decoders`` fit in GPU ``gpu``'s free memory.

    Args:
        gpu: GPU ordinal.
        decoders: ``(frame table, count)``: how many decoders of each file's format will exist at once.
        memory: Where the free memory is asked (:meth:`FrameMemory.mem_get_info`).
        lower: The settings that make fewer decoders, named in the error.
        headroom: Bytes to leave free besides (training's own memory).

    Returns:
        ``{"free": ..., "total": ..., "nvdec": ..., "decoders": ...}`` (bytes), for reports.

    Example::

        >>> check_nvdec_memory(0, [(info, 12)], memory=frame_memory(), lower="engine_threads")  # doctest: +SKIP
        {'free': 84012040192, 'total': 85045346304, 'nvdec': 709883904, 'decoders': 12}
    """
    needed = 0
    count = 0
    kinds: list[str] = []
    for info, n in decoders:
        if n <= 0:
            continue
        each = nvdec_bytes(info.codec, info.width, info.height, _bit_depth(info))
        needed += n * each
        count += n
        kinds.append(f"{n} x {info.codec} {info.width}x{info.height} ({each / 2**20:.0f} MiB each)")
    free, total = memory.mem_get_info(gpu)
    report = {"free": free, "total": total, "nvdec": needed, "decoders": count}
    if count and needed + headroom > free:
        raise GpuMemoryError(
            f"GPU {gpu} has {free / _GIB:.2f} GiB free of {total / _GIB:.2f} GiB, but NVDEC needs about "
            f"{needed / _GIB:.2f} GiB for {count} decoders ({', '.join(kinds)}) and {headroom / _GIB:.2f} GiB should "
            f"stay free for training. NVDEC allocates outside torch's allocator, where running out ends the process "
            f"instead of raising. Lower {lower}, or free GPU memory before the first step."
        )
    return report


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
    from lightning_vstream.decode.nvdec.decoder import NvDecoder

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
