"""Which device decodes, and which errors are the GPU's own.

- :func:`import_pynvvideocodec` / :func:`nvdec_available`: PyNvVideoCodec is imported only when
  asked for (on machines without an NVIDIA driver its import fails, and the CPU path never touches
  it), and only a version that exports every frame layout correctly is accepted.
- :func:`resolve_decode_device`: the per-rank choice of GPU.
- :func:`gpu_failure`: whether an error is the GPU's own (a CUDA error, GPU memory exhausted, a
  Triton failure), which stops a run whatever its error policy says, rather than a file's.

How decoded frames reach torch, and the device operations GPU threads need, are
:mod:`lightning_vstream.decode.nvdec.surfaces`' (:class:`FrameMemory`, :func:`frame_memory`; importable
from here too).
"""

from __future__ import annotations

import re
import warnings
from types import ModuleType
from typing import TYPE_CHECKING, Literal

from lightning_vstream.decode.nvdec.surfaces import (
    HOST_MEMORY_ENV,
    CudaMemory,
    FrameMemory,
    HostMemory,
    frame_memory,
    host_view,
)
from lightning_vstream.errors import (
    ConfigurationError,
    DecoderCapabilityError,
    GpuError,
    GpuMemoryError,
    MissingDependencyError,
    VStreamWarning,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "GPU_INSTALL_HINT",
    "HOST_MEMORY_ENV",
    "MIN_PYNVVIDEOCODEC",
    "CudaMemory",
    "DecodeDevice",
    "FrameMemory",
    "HostMemory",
    "frame_memory",
    "gpu_failure",
    "host_view",
    "import_pynvvideocodec",
    "nvdec_available",
    "pynvvideocodec_version",
    "resolve_decode_device",
]

DecodeDevice = Literal["cpu", "cuda", "auto"]

GPU_INSTALL_HINT = (
    "GPU decoding needs PyNvVideoCodec and an NVIDIA driver with NVDEC: run "
    "`pip install lightning_vstream[gpu]` on a machine with an NVIDIA GPU and driver, or use "
    "decode.device='cpu'."
)
#: Oldest PyNvVideoCodec accepted: 2.0.0 to 2.2.3 export 10-bit (P016) frames with the strides of
#: an 8-bit surface, a wrong view of the buffer that decodes silently into wrong pixels.
MIN_PYNVVIDEOCODEC = (2, 2, 4)


# -- availability and device choice ------------------------------------------------------------
def import_pynvvideocodec() -> ModuleType:
    """Import and return the ``PyNvVideoCodec`` module.

    Raises:
        ImportError: It is not installed, or its import failed (it fails on machines without an
            NVIDIA driver); the message says how to fix it.
    """
    try:
        import PyNvVideoCodec
    except Exception as err:
        raise MissingDependencyError(
            f"PyNvVideoCodec could not be imported ({type(err).__name__}: {err}). {GPU_INSTALL_HINT}"
        ) from err
    version = getattr(PyNvVideoCodec, "__version__", "unknown")
    if pynvvideocodec_version(version) < MIN_PYNVVIDEOCODEC:
        raise MissingDependencyError(
            f"PyNvVideoCodec {version} is too old: versions before 2.2.4 export 10-bit frames with wrong "
            "strides (wrong pixels, no error). Run `pip install -U 'pynvvideocodec>=2.2.4'`."
        )
    return PyNvVideoCodec


def pynvvideocodec_version(version: str) -> tuple[int, int, int]:
    """``(major, minor, patch)`` of a PyNvVideoCodec version string; ``(0, 0, 0)`` when unreadable.

    Example::

        >>> pynvvideocodec_version("2.2.4"), pynvvideocodec_version("2.1")
        ((2, 2, 4), (2, 1, 0))
    """
    match = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(version))
    if match is None:
        return (0, 0, 0)
    major, minor, patch = (int(g) if g else 0 for g in match.groups())
    return (major, minor, patch)


def nvdec_available() -> bool:
    """True when PyNvVideoCodec imports (which needs an NVIDIA driver); never raises."""
    try:
        import_pynvvideocodec()
    except ImportError:
        return False
    return True


def resolve_decode_device(
    decode_device: DecodeDevice,
    local_rank: int = 0,
    *,
    root_device: torch.device | str | None = None,
    cuda_available: bool | None = None,
    device_count: int | None = None,
    nvdec: bool | None = None,
) -> torch.device:
    """Choose the device frames are decoded on.

    ``"cpu"`` always decodes with PyAV. ``"cuda"`` decodes with NVDEC on this process's GPU and
    fails loudly when that is impossible. ``"auto"`` picks ``"cuda"`` when torch sees a GPU and
    PyNvVideoCodec imports, and ``"cpu"`` otherwise (with a warning when only PyNvVideoCodec is
    missing).

    The GPU is ``root_device`` when it is a CUDA device: pass ``trainer.strategy.root_device``,
    which Lightning sets per rank (with ``devices=[2, 3]``, local rank 0 trains on ``cuda:2``).
    Without it, local rank ``r`` decodes on ``cuda:r``.

    Args:
        decode_device: ``"cpu"``, ``"cuda"`` or ``"auto"``.
        local_rank: This process's rank on its node.
        root_device: The device this rank trains on, when known.
        cuda_available: Whether CUDA is usable; probed with ``torch.cuda.is_available()`` if None.
        device_count: Number of visible GPUs; probed with ``torch.cuda.device_count()`` if None.
        nvdec: Whether PyNvVideoCodec imports; probed if None.

    Returns:
        ``torch.device("cpu")`` or ``torch.device("cuda", index)``.

    Raises:
        ValueError: ``decode_device`` is not one of the three choices, ``local_rank`` is negative,
            or the local rank has no GPU of its own.
        RuntimeError: ``decode_device="cuda"`` but CUDA is not available.
        ImportError: ``decode_device="cuda"`` but PyNvVideoCodec cannot be imported.

    Example::

        >>> resolve_decode_device("auto", 0, cuda_available=False)
        device(type='cpu')
        >>> resolve_decode_device("cuda", 1, cuda_available=True, device_count=2, nvdec=True)
        device(type='cuda', index=1)
    """
    import torch

    if decode_device not in ("cpu", "cuda", "auto"):
        raise ConfigurationError(f"decode_device={decode_device!r} is not supported; use 'cpu', 'cuda' or 'auto'.")
    if not isinstance(local_rank, int) or local_rank < 0:
        raise ConfigurationError(f"local_rank={local_rank!r} must be a non-negative integer.")
    if decode_device == "cpu":
        return torch.device("cpu")
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if not cuda_available:
        if decode_device == "cuda":
            raise DecoderCapabilityError(
                "decode.device='cuda' needs a CUDA GPU, but torch.cuda.is_available() is False (no "
                "NVIDIA driver, a CPU-only torch build, or CUDA_VISIBLE_DEVICES hides every GPU). Use "
                "decode.device='cpu', or 'auto' to fall back to the CPU automatically."
            )
        return torch.device("cpu")
    if nvdec is None:
        nvdec = nvdec_available()
    if not nvdec:
        if decode_device == "cuda":
            import_pynvvideocodec()  # raises the ImportError that explains the fix
            raise MissingDependencyError(f"PyNvVideoCodec is not usable. {GPU_INSTALL_HINT}")
        warnings.warn(
            "decode.device='auto' decodes on the CPU: CUDA is available but PyNvVideoCodec is not. "
            "Run `pip install lightning_vstream[gpu]` to decode on the GPU.",
            VStreamWarning,
            stacklevel=2,
        )
        return torch.device("cpu")
    if root_device is not None:
        root = torch.device(root_device)
        if root.type == "cuda" and root.index is not None:
            return root
    if device_count is None:
        device_count = torch.cuda.device_count()
    if local_rank >= device_count:
        raise ConfigurationError(
            f"local_rank={local_rank} has no GPU of its own: this process sees {device_count} CUDA "
            f"device(s). Pass root_device=trainer.strategy.root_device, or check CUDA_VISIBLE_DEVICES."
        )
    return torch.device("cuda", local_rank)


# -- errors of the GPU itself -----------------------------------------------------------------
#: CUresult codes after which a context cannot be trusted (or memory ran out), as NVIDIA's decoder reports
#: them ("cuvidDecodePicture(...) returned error 700"): out of memory, no or a lost device, a destroyed or
#: invalid context, uncorrectable ECC, and the launch faults 700-719; 999 is CUDA_ERROR_UNKNOWN. Other codes
#: (an invalid value, an invalid bitstream) belong to the data.
_FATAL_CUDA_CODES = frozenset({2, 3, 4, 46, 100, 101, 201, 202, 214, 215, 999, *range(700, 720)})
_MEMORY_CUDA_CODES = frozenset({2})
_GPU_MESSAGE = re.compile(
    r"CUDA_ERROR_(?P<name>\w+)|CUDA driver API error|CUDA error|cudaError\w*|illegal memory access|"
    r"Triton Error|out of memory|returned error (?P<code>\d+)",
    re.IGNORECASE,
)


def gpu_failure(err: BaseException, where: str = "") -> GpuError | None:
    """The :class:`~lightning_vstream.errors.GpuError` that ``err`` stands for, or None when it is not the GPU's.

    The GPU's own errors: torch's CUDA errors (``torch.cuda.OutOfMemoryError``,
    ``torch.AcceleratorError``), Triton's, and messages of PyNvVideoCodec, torch or Triton that name
    a CUDA error (``CUDA_ERROR_...``, ``CUDA error: ...``, a CUresult such as 700 that leaves the
    context unusable, ``out of memory``). They stop a run whatever ``on_error`` says: skipping would
    skip every clip after them. Out of memory gives a
    :class:`~lightning_vstream.errors.GpuMemoryError`. ``where`` (file and frame) starts the message.

    Example::

        >>> type(gpu_failure(RuntimeError("CUDA driver API error CUDA_ERROR_ILLEGAL_ADDRESS"))).__name__
        'GpuError'
        >>> gpu_failure(ValueError("moov atom not found")) is None
        True
    """
    if isinstance(err, GpuError):
        return err
    kind = type(err)
    names = {cls.__name__ for cls in kind.__mro__}
    module = kind.__module__ or ""
    text = str(err)
    found = _GPU_MESSAGE.search(text)
    memory = "OutOfMemoryError" in names
    if found is not None and found["code"] is not None:
        code = int(found["code"])
        if code not in _FATAL_CUDA_CODES:
            found = None
        memory = memory or code in _MEMORY_CUDA_CODES
    gpu = memory or "AcceleratorError" in names or module.startswith("triton") or found is not None
    if not gpu:
        return None
    memory = memory or re.search(r"out[ _]of[ _]memory", text, re.IGNORECASE) is not None
    place = f"{where}: " if where else ""
    first = (text.strip().splitlines() or [""])[0][:500]
    if memory:
        return GpuMemoryError(
            f"{place}the GPU ran out of memory ({kind.__name__}: {first}). This is not a problem of the file: lower "
            "the batch size, cameras per step, engine_threads / gop_threads or prefetch_factor, or free GPU memory "
            "before fitting; the run stops (a skip would skip every later clip)."
        )
    return GpuError(
        f"{place}the GPU failed ({kind.__name__}: {first}). This is not a problem of the file and the CUDA context may "
        "be unusable, so the run stops (a skip would skip every later clip). Check the GPU (`nvidia-smi`, "
        "`vstream doctor`); set CUDA_LAUNCH_BLOCKING=1 to find the call that failed."
    )
