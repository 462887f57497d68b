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


def rotated_copy(src: Path, dst: Path, degrees: int) -> Path:
    """``src``'s frames re-encoded (H.264, same size and times) into ``dst`` with a display matrix of ``degrees``
    (counter-clockwise, as ``VideoFrame.rotation`` reads it back): what a phone writes for a video held upright."""
    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        video = inp.streams.video[0]
        stream = out.add_stream("libx264", rate=video.average_rate)
        stream.width, stream.height, stream.pix_fmt = video.width, video.height, "yuv420p"
        stream.set_display_rotation(degrees)
        for frame in inp.decode(video):
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame.to_ndarray(format="rgb24"), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return dst
