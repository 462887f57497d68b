"""The NVIDIA GPU backend: PyNvVideoCodec (NVDEC), frames never visiting host memory.

- :mod:`~lightning_vstream.decode.nvdec.decoder`: :class:`~lightning_vstream.decode.nvdec.decoder.NvDecoder` and
  :class:`~lightning_vstream.decode.nvdec.decoder.NvGopDecoder`, frame-exact.
- :mod:`~lightning_vstream.decode.nvdec.session`: stream formats, capabilities, decoder sessions, the one-time
  probe; :mod:`~lightning_vstream.decode.nvdec.probe_child`: the child process of that probe.
- :mod:`~lightning_vstream.decode.nvdec.sources`: where NVDEC's packets come from: the places the frame tables
  record, or PyAV's demuxer where the tables hold none; :mod:`~lightning_vstream.decode.nvdec.packets`: packets
  read straight from their file and made Annex B.
- :mod:`~lightning_vstream.decode.nvdec.memory`: GPU memory NVDEC takes outside torch, checked before a run.
- :mod:`~lightning_vstream.decode.nvdec.pool`: NVDEC decoders kept for reuse between files.
- :mod:`~lightning_vstream.decode.nvdec.surfaces`: how decoded surfaces reach torch, and the device operations
  GPU threads need.
- :mod:`~lightning_vstream.decode.nvdec.nv12`: NV12 -> RGB with the stream's colour matrix and range, on any
  device; :mod:`~lightning_vstream.decode.nvdec.nv12_kernel`: the fused Triton kernel of that conversion.

Importing this package imports neither PyNvVideoCodec nor CUDA.
"""
