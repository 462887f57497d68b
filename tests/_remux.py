"""Copy a test video's packets into another container, unchanged (no re-encoding)."""

from __future__ import annotations

from pathlib import Path

import av


def remux(src: Path, dst: Path, *, packets: int | None = None) -> Path:
    """``src``'s video stream in the container ``dst``'s extension names; only its first ``packets`` if given."""
    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        video = inp.streams.video[0]
        stream = out.add_stream_from_template(video)
        written = 0
        for packet in inp.demux(video):
            if packet.dts is None:  # the demuxer's flush packet
                continue
            if packets is not None and written == packets:
                break
            packet.stream = stream
            out.mux(packet)
            written += 1
    return dst
