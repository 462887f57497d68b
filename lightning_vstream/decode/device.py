"""Which device decodes: availability of PyNvVideoCodec and the per-rank choice of GPU.

PyNvVideoCodec is imported only when asked for: on machines without an NVIDIA driver its import
fails, and the CPU path never touches it.
"""

from __future__ import annotations

import warnings
from types import ModuleType
from typing import TYPE_CHECKING, Literal

from lightning_vstream.errors import ConfigurationError, DecoderCapabilityError, MissingDependencyError, VStreamWarning

if TYPE_CHECKING:
    import torch

__all__ = ["GPU_INSTALL_HINT", "DecodeDevice", "import_pynvvideocodec", "nvdec_available", "resolve_decode_device"]

DecodeDevice = Literal["cpu", "cuda", "auto"]

GPU_INSTALL_HINT = (
    "GPU decoding needs PyNvVideoCodec and an NVIDIA driver with NVDEC: run "
    "`pip install lightning_vstream[gpu]` on a machine with an NVIDIA GPU and driver, or use "
    "decode_device='cpu'."
)


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
    if not hasattr(PyNvVideoCodec, "OutputColorType"):
        version = getattr(PyNvVideoCodec, "__version__", "unknown")
        raise MissingDependencyError(
            f"PyNvVideoCodec {version} has no OutputColorType (RGB output on the GPU); install pynvvideocodec>=2.0."
        )
    return PyNvVideoCodec


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
                "decode_device='cuda' needs a CUDA GPU, but torch.cuda.is_available() is False (no "
                "NVIDIA driver, a CPU-only torch build, or CUDA_VISIBLE_DEVICES hides every GPU). Use "
                "decode_device='cpu', or 'auto' to fall back to the CPU automatically."
            )
        return torch.device("cpu")
    if nvdec is None:
        nvdec = nvdec_available()
    if not nvdec:
        if decode_device == "cuda":
            import_pynvvideocodec()  # raises the ImportError that explains the fix
            raise MissingDependencyError(f"PyNvVideoCodec is not usable. {GPU_INSTALL_HINT}")
        warnings.warn(
            "decode_device='auto' decodes on the CPU: CUDA is available but PyNvVideoCodec is not. "
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
