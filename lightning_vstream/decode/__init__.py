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

CPU (PyAV):

- :mod:`~lightning_vstream.decode.probe`: opening a file, choosing its video stream, building its frame table.
- :mod:`~lightning_vstream.decode.cpu`: :class:`PyAVDecoder`, frame-exact seeks and RGB output.
- :mod:`~lightning_vstream.decode.rgb_output`: a decoded FFmpeg frame converted to RGB at one size or more.
- :mod:`~lightning_vstream.decode.colour`: YUV -> RGB conversion on the CPU (swscale).
- :mod:`~lightning_vstream.decode.gop_reads`: remote (or ``file://``) videos decoded from the byte ranges of the
  GOPs they need (:class:`GopDecoder`).
- :mod:`~lightning_vstream.decode.range_file`: a remote object read as a file, checked against the index.
- :mod:`~lightning_vstream.decode.bitstream`: which pictures are references, read from the packets' headers.
- :mod:`~lightning_vstream.decode.ffmpeg_fork`: FFmpeg's decoders across ``fork()``.
- :mod:`~lightning_vstream.decode.images`: image-folder cameras (JPEG or PNG frames, Pillow).

GPU (PyNvVideoCodec, NVDEC):

- :mod:`~lightning_vstream.decode.gpu`: :class:`NvDecoder` and :class:`NvGopDecoder`, frame-exact, frames never
  visiting host memory.
- :mod:`~lightning_vstream.decode.nvdec`: stream formats, capabilities, decoder sessions, the one-time probe.
- :mod:`~lightning_vstream.decode.nvdec_probe`: the child process of that probe.
- :mod:`~lightning_vstream.decode.nvdec_sources`: where NVDEC's packets come from: the places the frame tables
  record, or PyAV's demuxer where the tables hold none.
- :mod:`~lightning_vstream.decode.nvdec_packets`: packets read straight from their file and made Annex B.
- :mod:`~lightning_vstream.decode.nvdec_memory`: GPU memory NVDEC takes outside torch, checked before a run.
- :mod:`~lightning_vstream.decode.decoder_pool`: NVDEC decoders kept for reuse between files.
- :mod:`~lightning_vstream.decode.surfaces`: how decoded surfaces reach torch, and the device operations GPU
  threads need.
- :mod:`~lightning_vstream.decode.nv12`: NV12 -> RGB with the stream's colour matrix and range, on any device.
- :mod:`~lightning_vstream.decode.nv12_kernel`: the fused Triton kernel of that conversion.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_vstream._exports import lazy_exports
from lightning_vstream.decode.base import FrameDecoder, VideoDecodeError, VideoInfo

if TYPE_CHECKING:
    from lightning_vstream.decode.cpu import PyAVDecoder
    from lightning_vstream.decode.factory import make_decoder
    from lightning_vstream.decode.images import with_image_fps
    from lightning_vstream.decode.probe import probe_video

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
    "PyAVDecoder": "lightning_vstream.decode.cpu",
    "make_decoder": "lightning_vstream.decode.factory",
    "probe_video": "lightning_vstream.decode.probe",
    "with_image_fps": "lightning_vstream.decode.images",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
