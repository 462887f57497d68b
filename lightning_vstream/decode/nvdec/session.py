"""NVDEC building blocks shared by every GPU reader: stream formats, capabilities, decoder sessions and a
one-time probe (decoder reuse: :mod:`~lightning_vstream.decode.nvdec.pool`; packets:
:mod:`~lightning_vstream.decode.nvdec.sources`).

- :class:`StreamFormat` describes what a decoder must handle (codec, size, bit depth, chroma,
  colour) and comes from PyAV's view of the file (:func:`stream_format`).
- :func:`decoder_caps` / :func:`check_decodable` ask NVDEC (``GetDecoderCaps``) whether a format is
  decodable on a GPU and raise :class:`~lightning_vstream.errors.DecoderCapabilityError` naming the
  limit otherwise. The question is asked in a child process that sees only that GPU, since
  PyNvVideoCodec asks device 0 whatever GPU it is given.
- :class:`DecoderKey` keys decoders reused between files
  (:class:`~lightning_vstream.decode.nvdec.pool.DecoderPool`): a key holds everything
  ``CreateDecoder`` fixes (GPU, codec, size, bit depth, chroma, output format, latency, stream),
  because PyNvVideoCodec refuses to reconfigure a decoder across a bit-depth change.
- :func:`create_session` creates a decoder on a CUDA stream that is not the NULL stream (which
  would synchronise after every frame) in the primary context torch uses.
- :func:`probe_nvdec` decodes one frame in a subprocess, once per GPU and process: a CUDA fault
  inside PyNvVideoCodec ends the process instead of raising, so it is found at setup, not hours
  into a run.

Nothing here imports PyNvVideoCodec at module level.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal

from lightning_vstream.decode.base import VideoInfo
from lightning_vstream.decode.device import FrameMemory
from lightning_vstream.decode.nvdec.nv12 import ColorSpec, color_spec_from_stream
from lightning_vstream.errors import DecoderCapabilityError

__all__ = [
    "CAPS_BIT_DEPTHS",
    "NVDEC_CODECS",
    "PROBE_REPORT",
    "DecoderCaps",
    "DecoderKey",
    "Latency",
    "Session",
    "StreamFormat",
    "caps_key",
    "check_decodable",
    "child_env",
    "create_session",
    "decoder_caps",
    "gpu_caps",
    "num_decoder_engines",
    "probe_nvdec",
    "stream_format",
]

Latency = Literal["NATIVE", "LOW"]

#: FFmpeg codec name -> ``PyNvVideoCodec.cudaVideoCodec`` member, for codecs whose packets NVDEC
#: takes as PyAV demuxes them (after the Annex-B filter for H.264/H.265).
NVDEC_CODECS = {"h264": "H264", "hevc": "HEVC", "av1": "AV1", "vp9": "VP9", "vp8": "VP8", "mpeg2video": "MPEG2"}
#: Prefix of the JSON line a probe child prints (see :mod:`lightning_vstream.decode.nvdec.probe_child`).
PROBE_REPORT = "NVDEC_PROBE "


# -- stream formats ------------------------------------------------------------------------------
@dataclass(frozen=True)
class StreamFormat:
    """What a decoder must handle for one video stream.

    Example::

        >>> StreamFormat("hevc", 1600, 900, 8, "420").bit_depth
        8
    """

    codec: str
    width: int
    height: int
    bit_depth: int = 8
    chroma: str = "420"  # "400", "420", "422" or "444"
    color: ColorSpec = field(default_factory=ColorSpec)
    #: Frames decoding runs ahead of presentation (0: no B-frame reordering); None when unknown.
    reorder_depth: int | None = None


def _pix_fmt_layout(pix_fmt: str) -> tuple[int, str]:
    """(bit depth, chroma) of an FFmpeg pixel format name; (8, "420") when unknown."""
    if pix_fmt in ("nv12", "nv21"):
        return 8, "420"
    if pix_fmt.startswith(("p010", "p016")):
        return int(pix_fmt[1:4]) if pix_fmt[1:4].isdigit() else 16, "420"
    match = re.fullmatch(r"(?:yuvj?|yuva)(4\d\d)p(\d+)?(?:le|be)?", pix_fmt)
    if match:
        return int(match.group(2) or 8), match.group(1)
    match = re.fullmatch(r"gray(\d+)?(?:le|be)?", pix_fmt)
    if match:
        return int(match.group(1) or 8), "400"
    return 8, "420"


def stream_format(stream: Any, info: VideoInfo) -> StreamFormat:
    """The :class:`StreamFormat` of a PyAV video stream (sizes and reordering from the frame table).

    Reordering comes from the frame table's ``reorder_depth``, measured from the packets when the
    index was built, not from the codec header's ``has_b_frames``: that is a guess, 0 on some
    camera H.264 that has B-frames.
    """
    ctx = stream.codec_context
    pix_fmt = str(ctx.pix_fmt or "yuv420p")
    depth, chroma = _pix_fmt_layout(pix_fmt)
    color = color_spec_from_stream(getattr(ctx, "colorspace", None), getattr(ctx, "color_range", None), pix_fmt)
    # The codec, not the decoder PyAV picked for it (AV1 files report "libdav1d").
    codec = str(getattr(ctx.codec, "canonical_name", None) or info.codec)
    return StreamFormat(codec, info.width, info.height, depth, chroma, color, info.reorder_depth)


# -- capabilities --------------------------------------------------------------------------------
@dataclass(frozen=True)
class DecoderCaps:
    """What ``GetDecoderCaps`` reports for one (GPU, codec, chroma, bit depth)."""

    supported: bool
    engines: int
    min_width: int
    min_height: int
    max_width: int
    max_height: int
    max_macroblocks: int

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DecoderCaps:
        """From the dictionary ``GetDecoderCaps`` returns."""
        return cls(
            supported=bool(raw.get("supported", 0)),
            engines=int(raw.get("num_decoder_engines", 0)),
            min_width=int(raw.get("width_min", 0)),
            min_height=int(raw.get("height_min", 0)),
            max_width=int(raw.get("width_max", 0)),
            max_height=int(raw.get("height_max", 0)),
            max_macroblocks=int(raw.get("mb_num_max", 0)),
        )


_UNSUPPORTED = DecoderCaps(False, 0, 0, 0, 0, 0, 0)
#: Bit depths the capability table is asked for (4:2:0 only: the GPU path converts nothing else).
CAPS_BIT_DEPTHS = (8, 10, 12)
_caps_tables: dict[int, dict[str, DecoderCaps]] = {}
_caps_lock = threading.Lock()
Runner = Callable[[list[str], float, dict[str, str]], "subprocess.CompletedProcess[str]"]


def caps_key(codec: str, bit_depth: int) -> str:
    """Key of a 4:2:0 format in a GPU's capability table (``"hevc/8"``)."""
    return f"{codec}/{bit_depth}"


def decoder_caps(
    gpu: int,
    codec: str,
    chroma: str = "420",
    bit_depth: int = 8,
    *,
    runner: Runner | None = None,
    timeout: float = 180.0,
) -> DecoderCaps:
    """NVDEC's capabilities for a format on ``gpu``, without touching any other GPU.

    PyNvVideoCodec's ``GetDecoderCaps(gpuid=N)`` creates a context on device 0 and asks it,
    whatever ``N`` is: under DDP every rank would touch GPU 0 (and fail on exclusive-process
    GPUs), and every rank would be told GPU 0's limits. So the table of every codec and bit depth
    is asked once per GPU and process, in a child process that sees only that GPU
    (``CUDA_VISIBLE_DEVICES``), where it is device 0 (see :func:`gpu_caps`).

    Args:
        gpu: GPU ordinal in this process.
        codec: FFmpeg codec name (``"hevc"``...).
        chroma: ``"400"``, ``"420"``, ``"422"`` or ``"444"``; only 4:2:0 is asked (the GPU path
            converts nothing else), every other chroma format is reported unsupported.
        bit_depth: Bits per sample.
        runner: Runs ``(command, timeout, env)`` (tests inject one).
        timeout: Seconds to wait for the child.

    Example::

        >>> decoder_caps(0, "hevc").engines  # doctest: +SKIP
        7
    """
    if codec not in NVDEC_CODECS or chroma != "420" or bit_depth not in CAPS_BIT_DEPTHS:
        return _UNSUPPORTED
    return gpu_caps(gpu, runner=runner, timeout=timeout).get(caps_key(codec, bit_depth), _UNSUPPORTED)


def child_env(gpu: int, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process that sees only GPU ``gpu`` of this process, as its device 0.

    Example::

        >>> child_env(1, {"CUDA_VISIBLE_DEVICES": "4,6"})["CUDA_VISIBLE_DEVICES"]
        '6'
    """
    env = dict(os.environ if environ is None else environ)
    visible = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        if not 0 <= gpu < len(entries):
            raise DecoderCapabilityError(
                f"GPU {gpu} is not visible to this process (CUDA_VISIBLE_DEVICES={visible!r}); check the "
                "device the rank was given."
            )
        env["CUDA_VISIBLE_DEVICES"] = entries[gpu]
    else:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    return env


def _run(cmd: list[str], timeout: float, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env)


def _child_report(result: subprocess.CompletedProcess[str]) -> dict[str, Any] | None:
    """The JSON line a probe child printed (``NVDEC_PROBE {...}``), or None."""
    for line in (result.stdout or "").splitlines():
        if line.startswith(PROBE_REPORT):
            try:
                report = json.loads(line[len(PROBE_REPORT) :])
            except json.JSONDecodeError:
                return None
            return report if isinstance(report, dict) else None
    return None


def _store_caps(gpu: int, report: dict[str, Any]) -> dict[str, DecoderCaps]:
    table = {str(k): DecoderCaps.from_dict(v) for k, v in dict(report.get("caps") or {}).items()}
    with _caps_lock:
        _caps_tables[gpu] = table
    return table


def gpu_caps(gpu: int, *, runner: Runner | None = None, timeout: float = 180.0) -> dict[str, DecoderCaps]:
    """NVDEC's capability table of ``gpu`` (:func:`caps_key` -> :class:`DecoderCaps`), asked once per process.

    Filled by :func:`probe_nvdec` when it has run; otherwise a child process asks only for the
    table (``python -m lightning_vstream.decode.nvdec.probe_child --caps-only``).

    Raises:
        DecoderCapabilityError: The child failed or timed out; the message holds its output.
    """
    with _caps_lock:
        cached = _caps_tables.get(gpu)
        if cached is not None:
            return cached
        cmd = [sys.executable, "-m", "lightning_vstream.decode.nvdec.probe_child", "--caps-only"]
        report = _run_child(gpu, cmd, timeout, runner, "asking NVDEC's capabilities")
        table = {str(k): DecoderCaps.from_dict(v) for k, v in dict(report.get("caps") or {}).items()}
        _caps_tables[gpu] = table
        return table


def _run_child(gpu: int, cmd: list[str], timeout: float, runner: Runner | None, what: str) -> dict[str, Any]:
    """Run a probe child on ``gpu`` alone; its report, or an error holding its output."""
    env = child_env(gpu)
    try:
        result = (runner or _run)(cmd, timeout, env)
    except subprocess.TimeoutExpired:
        raise DecoderCapabilityError(
            f"{what} on GPU {gpu} did not finish within {timeout:g} s (`{' '.join(cmd[1:])}`); check the driver "
            "(nvidia-smi), or pass gpu=GpuOptions(probe=False) to skip the decoding probe."
        ) from None
    report = _child_report(result)
    if result.returncode != 0 or report is None or report.get("status") != "ok":
        tail = ((result.stdout or "") + (result.stderr or "")).strip()[-1500:]
        raise DecoderCapabilityError(
            f"{what} on GPU {gpu} failed in a child process (exit code {result.returncode}); GPU decoding would "
            f"fail the same way in training. Its output:\n{tail}\n"
            "Check the NVIDIA driver and PyNvVideoCodec install (docs/gpu.md, `vstream doctor`), or use "
            "decode.device='cpu'."
        )
    return report


def num_decoder_engines(gpu: int, codec: str = "hevc", *, runner: Runner | None = None) -> int:
    """Number of NVDEC engines on ``gpu`` (at least 1)."""
    return max(1, decoder_caps(gpu, codec, runner=runner).engines)


class _FormatLabel:
    """``hevc 1600x900 8-bit 4:2:0``: a stream format as error messages name it, written when formatted."""

    __slots__ = ("fmt",)

    def __init__(self, fmt: StreamFormat) -> None:
        self.fmt = fmt

    def __format__(self, spec: str) -> str:
        fmt = self.fmt
        return f"{fmt.codec} {fmt.width}x{fmt.height} {fmt.bit_depth}-bit 4:{fmt.chroma[1]}:{fmt.chroma[2]}"


def check_decodable(gpu: int, fmt: StreamFormat, where: str, *, runner: Runner | None = None) -> DecoderCaps:
    """Raise :class:`DecoderCapabilityError` unless NVDEC on ``gpu`` decodes ``fmt``.

    Besides NVDEC's own limits, frames must be 4:2:0 (NV12 / P016 output, which
    :func:`~lightning_vstream.decode.nvdec.nv12.nv12_to_rgb` converts).
    """
    fix = "decode this file with decode.device='cpu', or pass gpu=GpuOptions(fallback='cpu') to decode such files on the CPU."
    label = _FormatLabel(fmt)  # written out only in an error message
    if fmt.codec not in NVDEC_CODECS:
        raise DecoderCapabilityError(
            f"{where} uses codec {fmt.codec!r}, which NVDEC does not decode here (supported: "
            f"{sorted(NVDEC_CODECS)}); {fix}"
        )
    if fmt.chroma != "420":
        raise DecoderCapabilityError(f"{where} is {label}: the GPU path converts only 4:2:0 frames; {fix}")
    caps = decoder_caps(gpu, fmt.codec, fmt.chroma, fmt.bit_depth, runner=runner)
    if not caps.supported:
        raise DecoderCapabilityError(f"{where} is {label}, which NVDEC on GPU {gpu} cannot decode; {fix}")
    if not (caps.min_width <= fmt.width <= caps.max_width and caps.min_height <= fmt.height <= caps.max_height):
        raise DecoderCapabilityError(
            f"{where} is {label}, outside what NVDEC on GPU {gpu} decodes for this format "
            f"({caps.min_width}x{caps.min_height} to {caps.max_width}x{caps.max_height}); {fix}"
        )
    macroblocks = -(-fmt.width // 16) * -(-fmt.height // 16)
    if caps.max_macroblocks and macroblocks > caps.max_macroblocks:
        raise DecoderCapabilityError(
            f"{where} is {label}: {macroblocks} macroblocks exceed NVDEC's {caps.max_macroblocks}; {fix}"
        )
    return caps


# -- decoder reuse -------------------------------------------------------------------------------
@dataclass(frozen=True)
class DecoderKey:
    """Everything ``CreateDecoder`` fixes: a decoder is reused only for a file with the same key."""

    gpu: int
    codec: str
    width: int
    height: int
    bit_depth: int = 8
    chroma: str = "420"
    color: str = "NATIVE"  # PyNvVideoCodec OutputColorType member
    latency: Latency = "NATIVE"
    #: Handle of the CUDA stream the decoder was created on, when its user chose the stream
    #: (the engine's decode threads); 0 for decoders that own a stream of their own.
    stream: int = 0


# -- sessions ------------------------------------------------------------------------------------
@dataclass
class Session:
    """A PyNvVideoCodec decoder and the CUDA stream its work and our conversions run on."""

    decoder: Any
    stream: Any  # torch.cuda.Stream, or a stream of FrameMemory.new_stream (anything with cuda_stream)
    key: DecoderKey | None = None
    #: The decoder's output buffers imported as tensors, by address (``DecodedFrame.GetPtrToPlane(0)``): the
    #: library hands every frame out in one of the same few buffers, so each is imported once per file.
    surfaces: dict[int, Any] = field(default_factory=dict)


def create_session(nvc: ModuleType, key: DecoderKey, memory: FrameMemory, stream: Any = None) -> Session:
    """Create a decoder for ``key`` in torch's primary context, on ``stream`` or a new stream of its own.

    Never on the NULL stream: PyNvVideoCodec then synchronises the whole device after every frame.
    """
    if stream is None:
        stream = memory.new_stream(key.gpu)
    decoder = nvc.CreateDecoder(
        gpuid=key.gpu,
        codec=getattr(nvc.cudaVideoCodec, NVDEC_CODECS[key.codec]),
        cudacontext=0,  # retain the device's primary context, which torch uses too
        cudastream=stream.cuda_stream,
        usedevicememory=True,
        maxwidth=key.width,
        maxheight=key.height,
        outputColorType=getattr(nvc.OutputColorType, key.color),
        latency=getattr(nvc.DisplayDecodeLatencyType, key.latency),
    )
    return Session(decoder, stream, key)


# -- one-time probe ------------------------------------------------------------------------------
_probed: dict[int, dict[str, Any]] = {}
_probe_lock = threading.Lock()


def probe_nvdec(
    gpu: int, *, timeout: float = 180.0, runner: Runner | None = None, force: bool = False
) -> dict[str, Any]:
    """Decode one 256x256 HEVC frame on ``gpu`` in a subprocess that sees only that GPU; raise if that fails.

    Runs once per GPU and process (later calls return the first report). A CUDA fault inside
    PyNvVideoCodec ends the process that meets it, so the probe runs in a child process and turns
    a crash into an error the caller can read. The child also reads NVDEC's capability table of
    the GPU (see :func:`decoder_caps`), so no capability question touches another GPU.

    Args:
        gpu: GPU ordinal.
        timeout: Seconds to wait for the child.
        runner: Runs ``(command, timeout, env)`` and returns a ``CompletedProcess`` (tests inject one).
        force: Probe again even if this GPU passed before.

    Returns:
        The child's report: PyNvVideoCodec and driver versions, the capability table, whether
        the decoded pixels were checked.

    Raises:
        DecoderCapabilityError: The child failed, crashed or timed out; the message holds its output.

    Example::

        >>> probe_nvdec(0)["pixels"]  # doctest: +SKIP
        'checked'
    """
    with _probe_lock:
        if not force and gpu in _probed:
            return _probed[gpu]
    cmd = [sys.executable, "-m", "lightning_vstream.decode.nvdec.probe_child"]
    report = _run_child(gpu, cmd, timeout, runner, "decoding one HEVC frame with NVDEC")
    _store_caps(gpu, report)
    with _probe_lock:
        _probed[gpu] = report
    return report
