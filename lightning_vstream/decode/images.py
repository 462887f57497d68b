"""Image-sequence cameras: a folder of JPEG or PNG frames decoded with Pillow.

A folder camera holds one image per frame. Frames are ordered by *natural sort* of the file
names (``frame_2.png`` before ``frame_10.png``), the same order the index uses. Every frame
is a keyframe, so random access costs exactly one image decode per frame.

Timestamps come from an optional file named ``timestamps.txt`` inside the folder: one
presentation time in seconds per line, in frame order, strictly increasing (blank lines and
lines starting with ``#`` are ignored)::

    # timestamps.txt
    0.000
    0.033
    0.071

Without that file, frame ``i`` is at ``i / fps`` seconds (``fps`` defaults to
:data:`DEFAULT_IMAGE_FPS`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lightning_vstream.decode.base import DecoderBase, Layout, VideoDecodeError, VideoInfo
from lightning_vstream.errors import (
    ConfigurationError,
    MissingDependencyError,
    MissingFileError,
    VStreamWarning,
    frame_out_of_range,
)
from lightning_vstream.index.files import image_files as _list_images
from lightning_vstream.index.identity import open_regular
from lightning_vstream.index.records import CameraStream, Clip, VideoIndex
from lightning_vstream.storage.atomic import write_atomic

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_IMAGE_FPS",
    "TIMESTAMPS_FILE",
    "ImageFolderDecoder",
    "decode_images",
    "image_files",
    "probe_image_folder",
    "with_image_fps",
    "write_timestamps",
]

#: Name of the optional per-folder file that lists each frame's time in seconds.
TIMESTAMPS_FILE = "timestamps.txt"
#: Frame rate assumed for image folders without a timestamps file.
DEFAULT_IMAGE_FPS = 30.0

_TIMESTAMP_UNITS = 1_000_000  # timestamps files are stored at microsecond resolution


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise MissingDependencyError(
            "image-folder cameras need Pillow; install it with `pip install lightning_vstream[images]` "
            "(or `pip install pillow`)."
        ) from None
    return Image


def image_files(folder: Path | str) -> list[Path]:
    """The JPEG/PNG files of an image-folder camera, in frame (natural sort) order."""
    return _list_images(Path(folder))


def _read_timestamps(folder: Path, count: int) -> list[float] | None:
    path = folder / TIMESTAMPS_FILE
    if not path.is_file():
        return None
    values: list[float] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            values.append(float(text))
        except ValueError:
            raise ConfigurationError(
                f"{str(path)!r} line {lineno}: {text!r} is not a time in seconds; the file must hold one "
                "number per line (one line per image, in frame order)."
            ) from None
    if len(values) != count:
        raise ConfigurationError(
            f"{str(path)!r} lists {len(values)} timestamps but {str(folder)!r} holds {count} images; "
            "write one line per image, or delete the file to use a fixed frame rate."
        )
    for i in range(1, len(values)):
        if values[i] <= values[i - 1]:
            raise ConfigurationError(
                f"{str(path)!r}: the timestamps of frames {i - 1} and {i} ({values[i - 1]!r}, {values[i]!r}) "
                "are not strictly increasing; fix the file so every line is later than the one before."
            )
    return values


def probe_image_folder(path: Path | str, *, fps: float = DEFAULT_IMAGE_FPS) -> VideoInfo:
    """Build the frame table of an image-folder camera.

    Reads the file names, the optional ``timestamps.txt`` and the header of the first image
    (for the frame size); no image is decoded.

    Args:
        path: Folder of ``.jpg`` / ``.jpeg`` / ``.png`` files.
        fps: Frame rate used when the folder has no ``timestamps.txt``.

    Returns:
        A :class:`VideoInfo` whose codec is ``"png"`` or ``"mjpeg"`` (from the first file) and
        in which every frame is a keyframe.

    Raises:
        FileNotFoundError: The folder does not exist.
        ValueError: It holds no images, ``fps`` is not positive, or ``timestamps.txt`` is malformed.
        ImportError: Pillow is not installed.

    Example::

        >>> info = probe_image_folder("clip/CAM_FRONT", fps=10.0)  # doctest: +SKIP
        >>> info.codec, info.frame_count, info.timestamp(3)  # doctest: +SKIP
        ('png', 40, 0.3)
    """
    folder = Path(path)
    if not folder.is_dir():
        raise MissingFileError(f"image folder {str(folder)!r} does not exist.")
    if not fps > 0:
        raise ConfigurationError(f"fps={fps!r} must be a positive frame rate (frames per second).")
    files = image_files(folder)
    if not files:
        raise ConfigurationError(f"image folder {str(folder)!r} holds no .jpg, .jpeg or .png files.")
    image_mod = _pil()
    try:
        with open_regular(files[0]) as file, image_mod.open(file) as image:
            width, height = image.size
    except OSError as err:
        raise VideoDecodeError(f"{str(files[0])!r} is not a readable image: {err}") from err
    codec = "png" if files[0].suffix.lower() == ".png" else "mjpeg"
    seconds = _read_timestamps(folder, len(files))
    if seconds is not None:
        time_base = (1, _TIMESTAMP_UNITS)
        pts = tuple(round(t * _TIMESTAMP_UNITS) for t in seconds)
        if len(set(pts)) != len(pts):
            raise ConfigurationError(
                f"{str(folder / TIMESTAMPS_FILE)!r} holds timestamps closer than one microsecond; "
                "frames need distinct times."
            )
        span = seconds[-1] - seconds[0]
        average = (len(seconds) - 1) / span if span > 0 else fps
    else:
        rate = Fraction(fps).limit_denominator(1001)
        time_base = (rate.denominator, rate.numerator)
        pts = tuple(range(len(files)))
        average = float(fps)
    return VideoInfo(
        codec=codec,
        width=int(width),
        height=int(height),
        time_base=time_base,
        pts=pts,
        key_indices=tuple(range(len(files))),
        key_seek=pts,
        average_fps=float(average),
    )


class ImageFolderDecoder(DecoderBase):
    """Frame-exact decoder for an image-folder camera (see the module docs for the layout).

    Implements :class:`~lightning_vstream.decode.FrameDecoder`: the folder is listed lazily on first
    use, every :meth:`read` decodes one image, and :attr:`frames_decoded` counts them.

    Args:
        path: Folder of images.
        info: Frame table, if already known (from an index's metadata); probed otherwise.
        layout: ``"chw"`` (default) or ``"hwc"`` for the returned uint8 RGB tensors.
        fps: Frame rate used when probing a folder without ``timestamps.txt``.
        label: Where the folder comes from (clip and camera), used in error messages.

    Example::

        >>> dec = ImageFolderDecoder("clip/CAM_FRONT")  # doctest: +SKIP
        >>> dec.get(7).shape, dec.frames_decoded  # doctest: +SKIP
        (torch.Size([3, 48, 64]), 1)
    """

    path: Path  # image folders are read from local paths only

    def __init__(
        self,
        path: Path | str,
        *,
        info: VideoInfo | None = None,
        layout: Layout = "chw",
        fps: float = DEFAULT_IMAGE_FPS,
        label: str = "",
    ) -> None:
        if layout not in ("chw", "hwc"):
            raise ConfigurationError(f"layout={layout!r} is not supported; use 'chw' or 'hwc'.")
        self.path = Path(path)
        self.layout = layout
        self.fps = fps
        self.label = label
        self._info = info
        self._files: list[Path] | None = None
        self._target = 0
        self._frames_decoded = 0

    @property
    def info(self) -> VideoInfo:
        if self._info is None:
            self._info = probe_image_folder(self.path, fps=self.fps)
        return self._info

    def _list(self) -> list[Path]:
        if self._files is None:
            if not self.path.is_dir():
                raise MissingFileError(f"image folder {self._where()} does not exist.")
            files = image_files(self.path)
            if len(files) != self.info.frame_count:
                raise VideoDecodeError(
                    f"{self._where()} holds {len(files)} images but its frame table lists "
                    f"{self.info.frame_count}; rebuild the index with `vstream index`."
                )
            self._files = files
        return self._files

    def seek(self, index: int) -> None:
        count = self.info.frame_count
        if not 0 <= index < count:
            raise frame_out_of_range(index, count, self._where())
        self._target = index

    def read(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """Decode the image at :attr:`position` (into ``out`` when given), then advance by one."""
        import numpy as np
        import torch

        index = self._target
        files = self._list()
        if index >= len(files):
            raise IndexError(f"{self._where()} has no frame {index}: it holds {len(files)} frames.")
        image_mod = _pil()
        try:
            with open_regular(files[index]) as file, image_mod.open(file) as image:
                array = np.array(image.convert("RGB"))  # a writable copy, as torch wants
        except OSError as err:
            raise VideoDecodeError(f"{self._where(index)} ({files[index].name}): unreadable image: {err}") from err
        self._frames_decoded += 1
        info = self.info
        if array.shape[1] != info.width or array.shape[0] != info.height:
            raise VideoDecodeError(
                f"{self._where(index)} ({files[index].name}) is {array.shape[1]}x{array.shape[0]}, but the "
                f"camera's frames are {info.width}x{info.height}; every image of a camera must have one size."
            )
        tensor = torch.from_numpy(array)
        if self.layout == "chw":
            tensor = tensor.permute(2, 0, 1)
        self._target = index + 1
        if out is None:
            return tensor
        if tuple(out.shape) != tuple(tensor.shape) or out.dtype != torch.uint8:
            raise ConfigurationError(
                f"{self._where(index)}: out must be a uint8 tensor of shape {tuple(tensor.shape)}, got "
                f"{tuple(out.shape)} {out.dtype}."
            )
        out.numpy()[:] = tensor.numpy()
        return out

    def get(self, index: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Return frame ``index`` (one image decode), written into ``out`` when given."""
        self.seek(index)
        return self.read(out)

    def get_many(self, indices: Sequence[int]) -> list[torch.Tensor]:
        """Return the frames at ``indices`` in that order, decoding each distinct frame once."""
        decoded = {i: self.get(i) for i in sorted(set(indices))}
        return [decoded[i] for i in indices]

    def close(self) -> None:
        self._files = None

    def __enter__(self) -> ImageFolderDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ImageFolderDecoder({str(self.path)!r}, position={self._target})"


def write_timestamps(folder: Path | str, seconds: Sequence[float]) -> Path:
    """Write ``timestamps.txt`` for an image folder (one time in seconds per line)."""
    path = Path(folder) / TIMESTAMPS_FILE
    write_atomic(path, "".join(f"{t!r}\n" for t in seconds))
    return path


_JPEG_SUFFIXES = (".jpg", ".jpeg")
_warned_no_nvjpeg = False


def _torchvision_io() -> Any:
    """``torchvision.io`` if it can decode lists of JPEGs on the GPU (torchvision >= 0.19), else None."""
    try:
        import torchvision.io as tv_io  # type: ignore[import-not-found,unused-ignore]
    except Exception:
        return None
    return tv_io if hasattr(tv_io, "decode_jpeg") and hasattr(tv_io, "ImageReadMode") else None


def _pillow_chw(path: Path) -> torch.Tensor:
    import numpy as np
    import torch

    image_mod = _pil()
    try:
        with open_regular(path) as file, image_mod.open(file) as image:
            array = np.array(image.convert("RGB"))
    except OSError as err:
        raise VideoDecodeError(f"{str(path)!r}: unreadable image: {err}") from err
    return torch.from_numpy(array).permute(2, 0, 1)


def decode_images(
    files: Sequence[Path | str],
    *,
    device: torch.device | str = "cpu",
    jpeg: Literal["auto", "nvjpeg", "pillow"] = "auto",
) -> list[torch.Tensor]:
    """Decode image files into uint8 RGB ``[3, H, W]`` tensors on ``device``.

    On a CUDA device the JPEGs are decoded on the GPU in one batched call (nvJPEG through
    ``torchvision.io.decode_jpeg(list_of_tensors, device=...)``): the compressed bytes are the only
    thing copied to the GPU. PNGs, and JPEGs when torchvision is missing, decode with Pillow and are
    copied over (``jpeg="auto"`` warns once then; ``jpeg="nvjpeg"`` raises instead).

    Args:
        files: Image files (JPEG or PNG).
        device: Where the tensors go.
        jpeg: ``"auto"``, ``"nvjpeg"`` (GPU decoding required on CUDA devices) or ``"pillow"``.

    Returns:
        One tensor per file, in order.

    Raises:
        ImportError: ``jpeg="nvjpeg"`` on a CUDA device without a usable torchvision.
        VideoDecodeError: A file cannot be decoded (the message names it).

    Example::

        >>> frames = decode_images(image_files("clip/CAM_FRONT")[:8], device="cuda")  # doctest: +SKIP
        >>> frames[0].device  # doctest: +SKIP
        device(type='cuda', index=0)
    """
    import torch

    global _warned_no_nvjpeg
    if jpeg not in ("auto", "nvjpeg", "pillow"):
        raise ConfigurationError(f"jpeg={jpeg!r} is not supported; use 'auto', 'nvjpeg' or 'pillow'.")
    target = torch.device(device)
    paths = [Path(f) for f in files]
    out: list[torch.Tensor | None] = [None] * len(paths)
    gpu_jpegs = [i for i, p in enumerate(paths) if p.suffix.lower() in _JPEG_SUFFIXES] if target.type == "cuda" else []
    tv_io = _torchvision_io() if gpu_jpegs and jpeg != "pillow" else None
    if gpu_jpegs and jpeg == "nvjpeg" and tv_io is None:
        raise MissingDependencyError(
            "GPU JPEG decoding needs torchvision >= 0.19 built for this torch (`pip install torchvision`); "
            "or pass jpeg='pillow' to decode on the CPU and copy."
        )
    if gpu_jpegs and jpeg == "auto" and tv_io is None and not _warned_no_nvjpeg:
        _warned_no_nvjpeg = True
        warnings.warn(
            "torchvision is not available: JPEG frames decode on the CPU with Pillow and are copied to the GPU. "
            "Install torchvision (matching this torch) to decode them on the GPU with nvJPEG.",
            VStreamWarning,
            stacklevel=2,
        )
    if tv_io is not None:
        data = []
        for i in gpu_jpegs:
            try:
                data.append(torch.frombuffer(bytearray(paths[i].read_bytes()), dtype=torch.uint8))
            except OSError as err:
                raise VideoDecodeError(f"{str(paths[i])!r}: unreadable image: {err}") from err
        try:
            decoded = tv_io.decode_jpeg(data, mode=tv_io.ImageReadMode.RGB, device=target)
        except RuntimeError:
            decoded = []
            for i, raw in zip(gpu_jpegs, data):  # one by one, to name the file that fails
                try:
                    decoded.append(tv_io.decode_jpeg(raw, mode=tv_io.ImageReadMode.RGB, device=target))
                except RuntimeError as err:
                    raise VideoDecodeError(f"{str(paths[i])!r}: the GPU JPEG decoder failed: {err}") from err
        for i, image in zip(gpu_jpegs, decoded):
            out[i] = image
    for i, path in enumerate(paths):
        if out[i] is None:
            image = _pillow_chw(path)
            out[i] = image.to(target, non_blocking=True) if target.type != "cpu" else image
    return [t for t in out if t is not None]


def with_image_fps(index: VideoIndex, fps: float) -> VideoIndex:
    """A copy of ``index`` whose image-folder cameras without ``timestamps.txt`` run at ``fps``.

    ``vstream index`` records image folders at :data:`DEFAULT_IMAGE_FPS`; use this to give
    them their real rate before selecting frames by time. Video files and folders with a
    timestamps file are unchanged. Each folder is listed once (no image is decoded).

    Example::

        >>> index = with_image_fps(load_index("data/index.json"), 10.0)  # doctest: +SKIP
    """
    clips = []
    for clip in index.clips:
        cams = tuple(
            CameraStream(cam.name, cam.path, probe_image_folder(Path(cam.path), fps=fps))
            if cam.is_image_folder and not (Path(cam.path) / TIMESTAMPS_FILE).is_file()
            else cam
            for cam in clip.cameras
        )
        clips.append(Clip(clip.clip_id, clip.video_dir, clip.frame_count, cams))
    return VideoIndex(index.source, tuple(clips), index.camera_names)
