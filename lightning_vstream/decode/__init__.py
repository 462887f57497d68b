"""Decoding backends behind one protocol: PyAV on the CPU, PyNvVideoCodec on NVIDIA GPUs, image folders.

The protocol and what every backend shares:

- :mod:`~lightning_vstream.decode.base`: the decoder protocol (:class:`FrameDecoder`), :class:`VideoInfo` and the
  bookkeeping backends share.
- :mod:`~lightning_vstream.decode.factory`: how a decoder for a camera stream is chosen and made
  (:func:`make_decoder`); :mod:`~lightning_vstream.decode.decoder_table`: the table of those one reader
  keeps open (:class:`~lightning_vstream.decode.decoder_table.DecoderTable`).
- :mod:`~lightning_vstream.decode.gops`: the one GOP scheduler: which GOPs of which streams to decode for a set of
  wanted frames, on which thread.
- :mod:`~lightning_vstream.decode.threads`: the one runner of decoding threads (:class:`DecodeThreads`) and the
  GOP tasks it runs (:class:`GopExecutor`).
- :mod:`~lightning_vstream.decode.counters`: :class:`DecodeStats`, what a loader decoded, delivered and skipped.
- :mod:`~lightning_vstream.decode.device`: which device decodes, and which errors are the GPU's own.

The backends, a subpackage each, and the image folders:

- :mod:`~lightning_vstream.decode.cpu`: PyAV (FFmpeg) on the CPU: probing files, :class:`PyAVDecoder`, RGB output.
- :mod:`~lightning_vstream.decode.nvdec`: PyNvVideoCodec on NVIDIA GPUs: :class:`NvDecoder`, sessions, packets,
  memory, the NV12 -> RGB conversion and its Triton kernel.
- :mod:`~lightning_vstream.decode.ranged`: remote (or ``file://``) videos decoded from the byte ranges of the
  GOPs they need (:class:`GopDecoder`).
- :mod:`~lightning_vstream.decode.images`: image-folder cameras (JPEG or PNG frames, Pillow).
- :mod:`~lightning_vstream.decode.bitstream`: which pictures are references, read from the packets' headers
  (every backend leaves out the ones no frame read needs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_vstream._exports import lazy_exports
from lightning_vstream.decode.base import FrameDecoder, VideoDecodeError, VideoInfo

if TYPE_CHECKING:
    from lightning_vstream.decode.cpu.probe import probe_video
    from lightning_vstream.decode.cpu.pyav import PyAVDecoder
    from lightning_vstream.decode.factory import make_decoder
    from lightning_vstream.decode.images import with_image_fps

__all__ = [
    "FrameDecoder",
    "PyAVDecoder",
    "VideoDecodeError",
    "VideoInfo",
    "make_decoder",
    "probe_video",
    "with_image_fps",
]

#: Loaded on first access: the decoder factory, the CPU backend's decoder and prober, and the image-folder frame rate.
_LAZY = {
    "PyAVDecoder": "lightning_vstream.decode.cpu.pyav",
    "make_decoder": "lightning_vstream.decode.factory",
    "probe_video": "lightning_vstream.decode.cpu.probe",
    "with_image_fps": "lightning_vstream.decode.images",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
