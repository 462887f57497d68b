"""Ranged reads: remote (or ``file://``) videos decoded from the byte ranges of exactly the GOPs they need.

- :mod:`~lightning_vstream.decode.ranged.gop_reads`: :class:`~lightning_vstream.decode.ranged.gop_reads.GopDecoder`.
- :mod:`~lightning_vstream.decode.ranged.range_file`: a remote object read as a file, checked against the index.
"""
