"""The CPU backend: PyAV (FFmpeg).

- :mod:`~lightning_vstream.decode.cpu.probe`: opening a file, choosing its video stream, building its frame table.
- :mod:`~lightning_vstream.decode.cpu.pyav`: :class:`~lightning_vstream.decode.cpu.pyav.PyAVDecoder`, frame-exact
  seeks and RGB output.
- :mod:`~lightning_vstream.decode.cpu.rgb_output`: a decoded FFmpeg frame converted to RGB at one size or more.
- :mod:`~lightning_vstream.decode.cpu.colour`: YUV -> RGB conversion on the CPU (swscale).
- :mod:`~lightning_vstream.decode.cpu.ffmpeg_fork`: FFmpeg's decoders across ``fork()``.
"""
