"""Stamped image-folder cameras: one JPEG per frame plus ``timestamps.txt`` (``vstream synth --images``)."""

from __future__ import annotations

from pathlib import Path

from lightning_vstream.demos.synth import Stamp, frame_image
from lightning_vstream.errors import MissingDependencyError
from lightning_vstream.storage.atomic import open_atomic

__all__ = ["write_stamped_images"]


def write_stamped_images(
    folder: Path | str,
    *,
    clip: int,
    camera: int,
    frames: int,
    size: tuple[int, int] = (64, 48),
    fps: float = 12.0,
    quality: int = 95,
) -> Path:
    """Write one camera as a folder of stamped JPEG images, ``000000.jpg`` ..., with ``timestamps.txt``.

    Frame ``i`` is at ``i / fps`` seconds. The stamps survive JPEG at the default quality.
    Needs Pillow (``pip install 'lightning_vstream[images]'``).

    Returns:
        The written folder.
    """
    try:
        from PIL import Image
    except ImportError:
        raise MissingDependencyError(
            "writing image folders needs Pillow; install it with `pip install 'lightning_vstream[images]'`."
        ) from None
    from lightning_vstream.decode.images import write_timestamps

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    width, height = size
    for i in range(frames):
        image = frame_image(width, height, Stamp(clip, camera, i))
        with open_atomic(folder / f"{i:06d}.jpg") as f:
            Image.fromarray(image).save(f, format="JPEG", quality=quality)
    write_timestamps(folder, [i / fps for i in range(frames)])
    return folder
