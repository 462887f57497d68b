"""Child process of :func:`lightning_vstream.decode.nvdec.probe_nvdec`: decode one frame on a GPU.

Run as ``python -m lightning_vstream.decode.nvdec_probe GPU``; prints ``NVDEC_PROBE_OK`` and exits 0
when a 256x256 HEVC frame decodes on that GPU and converts to the expected RGB values.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

__all__ = ["main"]


def _write_clip(path: Path) -> None:
    import av
    import numpy as np

    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx265", rate=10)
        stream.width, stream.height, stream.pix_fmt = 256, 256, "yuv420p"
        stream.options = {"x265-params": "log-level=none:bframes=0"}
        image = np.full((256, 256, 3), 128, dtype=np.uint8)
        image[:128] = (200, 40, 40)
        for _ in range(3):
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    gpu = int(args[0]) if args else 0
    from lightning_vstream.decode.gpu import NvDecoder
    from lightning_vstream.decode.nvdec import DecoderPool

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.mp4"
        _write_clip(path)
        decoder = NvDecoder(path, device=gpu, pool=DecoderPool())
        frame = decoder.get(1).cpu()
        decoder.close()
    top = frame[:, 32, 128].tolist()
    if tuple(frame.shape) != (3, 256, 256) or abs(top[0] - 200) > 12 or abs(top[1] - 40) > 12:
        print(f"unexpected frame: shape {tuple(frame.shape)}, pixel {top} (expected about [200, 40, 40])")
        return 1
    print("NVDEC_PROBE_OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
