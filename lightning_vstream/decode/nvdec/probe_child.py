"""Child process of :func:`~lightning_vstream.decode.nvdec.session.probe_nvdec` and :func:`~lightning_vstream.decode.nvdec.session.gpu_caps`.

Run as ``python -m lightning_vstream.decode.nvdec.probe_child [--caps-only]`` with ``CUDA_VISIBLE_DEVICES``
naming the one GPU to ask (it is device 0 here, so PyNvVideoCodec's ``GetDecoderCaps``, which asks
device 0 whatever it is told, asks the right GPU and no other). Prints one line
``NVDEC_PROBE {json}``: PyNvVideoCodec's and the driver's versions, the capability table of every
codec and bit depth (4:2:0), and unless ``--caps-only`` the result of decoding a 256x256 HEVC frame
and converting it to RGB. Exit code 0 when everything asked for worked.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["driver_version", "main"]


def driver_version() -> str | None:
    """The CUDA driver API version of the loaded ``libcuda.so.1`` (``"12.3"``), or None without one."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        value = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(value)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return f"{value.value // 1000}.{value.value % 1000 // 10}"


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


def _caps(nvc: Any) -> dict[str, dict[str, int]]:
    from lightning_vstream.decode.nvdec.session import CAPS_BIT_DEPTHS, NVDEC_CODECS, caps_key

    table: dict[str, dict[str, int]] = {}
    for codec, member in NVDEC_CODECS.items():
        for depth in CAPS_BIT_DEPTHS:
            try:
                raw = nvc.GetDecoderCaps(
                    gpuid=0,
                    codec=getattr(nvc.cudaVideoCodec, member),
                    chromaformat=getattr(nvc.cudaVideoChromaFormat, "420"),
                    bitdepth=depth,
                )
                table[caps_key(codec, depth)] = {str(k): int(v) for k, v in dict(raw).items()}
            except Exception:  # the library raises for codecs the GPU lacks: unsupported
                table[caps_key(codec, depth)] = {"supported": 0}
    return table


def _decode(report: dict[str, Any]) -> bool:
    from lightning_vstream.decode.device import frame_memory
    from lightning_vstream.decode.nvdec.decoder import NvDecoder
    from lightning_vstream.decode.nvdec.pool import DecoderPool

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.mp4"
        _write_clip(path)
        decoder = NvDecoder(path, device=0, pool=DecoderPool())
        frame = decoder.get(1).cpu()
        decoder.close()
    report["decode"] = "ok"
    if frame_memory().host:
        report["pixels"] = "not checked: frames are host memory under a test driver, which decodes no pixels"
        return tuple(frame.shape) == (3, 256, 256)
    top = frame[:, 32, 128].tolist()
    if tuple(frame.shape) != (3, 256, 256) or abs(top[0] - 200) > 12 or abs(top[1] - 40) > 12:
        report["pixels"] = f"wrong: shape {tuple(frame.shape)}, pixel {top} (expected about [200, 40, 40])"
        return False
    report["pixels"] = "checked"
    return True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    from lightning_vstream.decode.device import import_pynvvideocodec

    report: dict[str, Any] = {"status": "failed", "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    nvc = import_pynvvideocodec()
    report["pynvvideocodec"] = str(getattr(nvc, "__version__", "unknown"))
    report["driver"] = driver_version()
    report["caps"] = _caps(nvc)
    ok = True
    if "--caps-only" not in args:
        ok = _decode(report)
    report["status"] = "ok" if ok else "failed"
    print("NVDEC_PROBE " + json.dumps(report, sort_keys=True), flush=True)
    if ok:
        print("NVDEC_PROBE_OK")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
