"""A picture of what the model receives: a few batches drawn as one image, with Pillow.

One row per slot and step (per sample and step of a clip batch), one tile per camera: the frame as
delivered, after augmentation and ``transform``, under a label with the step, slot, clip, frame
index, time and camera. A slot that starts a clip (``is_first``) is framed in orange and labelled
``FIRST``; padding (``valid=False``) is greyed out. Where the batch carries annotations with
``boxes``, ``intrinsics`` and ``extrinsics``, every box is drawn projected into every camera through
the delivered intrinsics, which already include the augmentation's ``img_aug_matrix``: a wrong
calibration or augmentation puts the boxes visibly off. The result keeps where each tile is and
what its label says (:class:`PreviewTile`), so tools and tests can check the picture.

Used by ``vstream preview``, :func:`preview_batches` in notebooks and the
:class:`~lightning_vstream.callbacks.BatchPreview` callback. Pillow is the only drawing package
(``pip install 'lightning_vstream[images]'``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_vstream.errors import ConfigurationError, MissingDependencyError
from lightning_vstream.storage.atomic import open_atomic

if TYPE_CHECKING:
    import torch
    from PIL import Image

__all__ = ["MAX_PREVIEW_PIXELS", "Preview", "PreviewTile", "draw_batches", "preview_batches", "project"]

#: The largest picture a preview draws, in pixels (about 200 MB of RGB): a larger one is refused before drawing.
MAX_PREVIEW_PIXELS = 64 * 1024 * 1024

#: Tiles narrower than this are enlarged by a whole factor (nearest neighbour: the pixels stay the frame's).
_MIN_TILE_WIDTH = 200
_LABEL_HEIGHT = 28
_PAD = 4
_BACKGROUND = (24, 24, 24)
_TEXT = (235, 235, 235)
_FIRST = (255, 150, 0)
_BOX = (0, 230, 120)
#: The 12 edges of a box between its corners (numbered by their signs: x, y, z as bits 2, 1, 0).
_EDGES = ((0, 1), (2, 3), (4, 5), (6, 7), (0, 2), (1, 3), (4, 6), (5, 7), (0, 4), (1, 5), (2, 6), (3, 7))


@dataclass(frozen=True)
class PreviewTile:
    """One camera frame of a :class:`Preview`: where it is drawn and what its label says.

    ``box`` is ``(left, top, width, height)`` of the frame's pixels in the image; ``label`` the two
    lines drawn above it (shortened to the tile's width where they do not fit); ``scale`` the whole
    factor the frame was enlarged by. ``points`` are the projected box centres in frame pixels
    (before ``scale``) that were drawn on it.
    """

    box: tuple[int, int, int, int]
    scale: int
    step: int
    slot: int
    camera: str
    camera_index: int
    clip_id: str
    frame_index: int
    timestamp: float | None
    is_first: bool
    valid: bool
    label: str
    points: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class Preview:
    """The drawing of a few batches: the image and its tiles.

    In a notebook the object shows as the image. ``save(path)`` writes it (PNG by the file name).

    Example::

        >>> picture = preview_batches(dm, steps=2)  # doctest: +SKIP
        >>> picture.save("preview.png"); picture.tiles[0].label  # doctest: +SKIP
        'scene-0003  frame 0  0.000 s\nstep 0  slot 0  CAM_FRONT  FIRST'
    """

    image: Image.Image
    tiles: tuple[PreviewTile, ...]

    def save(self, path: Path | str) -> Path:
        """Write the image to ``path`` (its format from the suffix, PNG for ``.png``), whole or not at all.

        Returns:
            The path.

        Raises:
            ConfigurationError: The suffix names no image format Pillow writes.
            FileWriteError: The file could not be written (a full disk); an earlier file there is kept.
        """
        from PIL import Image

        path = Path(path)
        image_format = Image.registered_extensions().get(path.suffix.lower())
        if image_format is None or image_format not in Image.SAVE:
            raise ConfigurationError(
                f"preview path {str(path)!r}: {path.suffix or 'no suffix'!r} names no image format that can be "
                "written; end it in .png (or .jpg)."
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        with open_atomic(path) as f:
            self.image.save(f, format=image_format)
        return path

    def _repr_png_(self) -> bytes:
        import io

        buffer = io.BytesIO()
        self.image.save(buffer, format="PNG")
        return buffer.getvalue()


@dataclass
class _Row:
    """One slot at one step (or one sample at one time step): what a row of tiles shows."""

    step: int
    slot: int
    clip_id: str
    frame_index: int
    timestamp: float | None
    is_first: bool
    valid: bool
    frames: list[torch.Tensor]  # per camera [3, H, W]
    cameras: list[str]
    intrinsics: torch.Tensor | None  # [C, 3, 3], delivered (augmentation included)
    extrinsics: torch.Tensor | None  # [C, 4, 4], sensor to ego
    boxes: torch.Tensor | None  # [N, >= 7] in ego coordinates


def _pil() -> Any:
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError:
        raise MissingDependencyError(
            "drawing a preview needs Pillow; install it with `pip install 'lightning_vstream[images]'`."
        ) from None
    return Image, ImageDraw, ImageFont


def _camera_frames(frames: Any, slot: int, step: int | None) -> list[torch.Tensor]:
    """The slot's frame of every camera, ``[3, H, W]`` each, from a stacked tensor or a per-camera list."""
    if isinstance(frames, (list, tuple)):
        return [f[slot] if step is None else f[slot, step] for f in frames]
    sample = frames[slot] if step is None else frames[slot, step]
    return list(sample.unbind(0))


def _field(annotations: Mapping[str, Any], name: str, slot: int, step: int | None, per_frame: bool) -> Any:
    """An annotation field of one slot (and, for a clip batch's frame fields, one time step)."""
    value = annotations.get(name)
    if value is None:
        return None
    item = value[slot]
    if per_frame and step is not None:
        item = item[step]
    return item


def _rows(batch: Mapping[str, Any], number: int, max_slots: int | None) -> list[_Row]:
    """The rows of one batch: a streaming batch ``[B, cameras, ...]`` or a clip batch ``[B, T, cameras, ...]``."""
    import torch

    frames = batch.get("frames")
    if frames is None:
        raise ConfigurationError(
            f"batch {number} has no 'frames'; preview draws the batches of this package's loaders."
        )
    index = batch["frame_index"]
    clip_batch = isinstance(index, torch.Tensor) and index.dim() == 2
    slots = len(batch["clip_id"]) if max_slots is None else min(max_slots, len(batch["clip_id"]))
    times = batch.get("timestamp")
    found = batch.get("annotations")
    annotations: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    cameras = list(batch.get("camera_names") or [])
    rows = []
    for slot in range(slots):
        steps = range(index.shape[1]) if clip_batch else [None]
        for t in steps:
            frame_list = _camera_frames(frames, slot, t)
            names = cameras or [f"camera {c}" for c in range(len(frame_list))]
            valid = bool(batch["valid"][slot]) if "valid" in batch else True
            time = None
            if isinstance(times, torch.Tensor):
                value = float(times[slot] if t is None else times[slot, t])
                time = None if math.isnan(value) else value
            is_first = bool(batch["is_first"][slot]) if "is_first" in batch else False
            boxes = _field(annotations, "boxes", slot, t, per_frame=True)
            has = batch.get("has_annotations")
            if has is not None and not bool(has[slot] if t is None else has[slot, t]):
                boxes = None
            rows.append(
                _Row(
                    step=int(batch.get("step", number)) if t is None else t,
                    slot=slot,
                    clip_id=str(batch["clip_id"][slot]),
                    frame_index=int(index[slot] if t is None else index[slot, t]),
                    timestamp=time,
                    is_first=is_first,
                    valid=valid,
                    frames=frame_list,
                    cameras=names,
                    intrinsics=_field(annotations, "intrinsics", slot, t, per_frame=False),
                    extrinsics=_field(annotations, "extrinsics", slot, t, per_frame=False),
                    boxes=boxes if isinstance(boxes, torch.Tensor) and boxes.numel() else None,
                )
            )
    return rows


def _to_rgb(frame: torch.Tensor) -> Any:
    """``[3, H, W]`` (uint8, or float after a normalising transform) as an ``H x W x 3`` uint8 array."""
    import torch

    image = frame.detach().to("cpu")
    if image.dtype != torch.uint8:
        image = image.float()
        low, high = float(image.min()), float(image.max())
        if low >= 0.0 and high <= 1.0:  # a [0, 1] float frame
            image = image * 255.0
        elif high > low:  # normalised: stretch what is there to the full range
            image = (image - low) * (255.0 / (high - low))
        image = image.round().clamp(0, 255).to(torch.uint8)
    return image.permute(1, 2, 0).contiguous().numpy()


def _box_corners(box: torch.Tensor) -> torch.Tensor:
    """The 8 corners ``[8, 3]`` of a box ``(x, y, z, w, l, h, yaw, ...)`` in ego coordinates (l along the heading)."""
    import torch

    x, y, z, w, length, h, yaw = (float(v) for v in box[:7])
    signs = torch.tensor([[(i >> 2) & 1, (i >> 1) & 1, i & 1] for i in range(8)], dtype=torch.float64) * 2 - 1
    local = signs * torch.tensor([length / 2, w / 2, h / 2], dtype=torch.float64)
    c, s = math.cos(yaw), math.sin(yaw)
    rotation = torch.tensor([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    return local @ rotation.T + torch.tensor([x, y, z], dtype=torch.float64)


def project(points: torch.Tensor, intrinsics: torch.Tensor, extrinsics: torch.Tensor) -> torch.Tensor:
    """Ego-frame points ``[N, 3]`` in pixels of a delivered frame: ``[N, 3]`` of ``(u, v, depth)``.

    ``intrinsics`` are the delivered ones (the augmentation's ``img_aug_matrix`` times the file's),
    ``extrinsics`` the camera's sensor-to-ego transform. Points behind the camera have depth <= 0.

    Example::

        >>> import torch
        >>> k = torch.tensor([[50.0, 0, 40], [0, 50, 30], [0, 0, 1]])
        >>> to_ego = torch.tensor([[0.0, 0, 1, 0], [-1, 0, 0, 0], [0, -1, 0, 0], [0, 0, 0, 1]])  # looks along ego x
        >>> project(torch.tensor([[10.0, 0.0, 0.0]]), k, to_ego).tolist()
        [[40.0, 30.0, 10.0]]
    """
    import torch

    ego_to_camera = torch.linalg.inv(extrinsics.to(torch.float64))
    homogeneous = torch.cat([points.to(torch.float64), torch.ones(len(points), 1, dtype=torch.float64)], dim=1)
    camera = (homogeneous @ ego_to_camera.T)[:, :3]
    pixels = camera @ intrinsics.to(torch.float64).T
    depth = pixels[:, 2:3]
    safe = torch.where(depth.abs() < 1e-9, torch.full_like(depth, 1e-9), depth)
    return torch.cat([pixels[:, :2] / safe, depth], dim=1)


def _label(row: _Row, camera: str) -> tuple[str, str]:
    """The two lines above a tile: what the frame is, then where it sits in the batch."""
    time = "" if row.timestamp is None else f"  {row.timestamp:.3f} s"
    marks = ("  FIRST" if row.is_first else "") + ("" if row.valid else "  invalid")
    return f"{row.clip_id}  frame {row.frame_index}{time}", f"step {row.step}  slot {row.slot}  {camera}{marks}"


def _fit(draw: Any, text: str, font: Any, width: int) -> str:
    """``text``, shortened with an ellipsis to ``width`` pixels."""
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "...", font=font) > width:
        text = text[:-1]
    return text + "..."


def draw_batches(
    batches: Iterable[Mapping[str, Any]], *, max_slots: int | None = None, scale: int | None = None
) -> Preview:
    """Draw batches of either DataModule (or loader) as one image, a row per slot and step.

    Args:
        batches: Batches as the loaders deliver them (streaming ``[B, cameras, 3, H, W]`` or clip
            ``[B, T, cameras, 3, H, W]``; stacked or ``camera_frames="per_camera"``), on any device.
        max_slots: Draw at most this many slots (samples) of each batch; all when None.
        scale: Enlarge every frame by this whole factor; None: enough to make a tile at least 200
            pixels wide (1 for larger frames).

    Returns:
        The :class:`Preview`.

    Raises:
        ConfigurationError: No batch, a batch without frames, ``max_slots`` / ``scale`` below 1, or a
            picture larger than :data:`MAX_PREVIEW_PIXELS` (checked before anything is drawn).
        MissingDependencyError: Pillow is not installed.

    Example::

        >>> loader = dm.train_dataloader()  # doctest: +SKIP
        >>> draw_batches([b for _, b in zip(range(3), loader)], max_slots=2).save("preview.png")  # doctest: +SKIP
    """
    image_module, draw_module, font_module = _pil()
    for name, value in (("max_slots", max_slots), ("scale", scale)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigurationError(f"{name}={value!r} must be None or an integer >= 1.")
    rows = [row for number, batch in enumerate(batches) for row in _rows(batch, number, max_slots)]
    if not rows:
        raise ConfigurationError("preview: there is no batch to draw (the loader delivered none).")
    widest = max(f.shape[-1] for row in rows for f in row.frames)
    factor = scale or max(1, math.ceil(_MIN_TILE_WIDTH / widest))
    columns = max(len(row.frames) for row in rows)
    column_w = [max(row.frames[c].shape[-1] for row in rows if c < len(row.frames)) for c in range(columns)]
    rows_h = [max(f.shape[-2] for f in row.frames) for row in rows]

    def canvas_pixels(f: int) -> int:
        return sum(w * f + 2 * _PAD for w in column_w) * sum(h * f + _LABEL_HEIGHT + 2 * _PAD for h in rows_h)

    cell_w = [w * factor for w in column_w]
    row_h = [h * factor + _LABEL_HEIGHT + 2 * _PAD for h in rows_h]
    width = sum(w + 2 * _PAD for w in cell_w)
    height = sum(row_h)
    if width * height > MAX_PREVIEW_PIXELS:  # checked before any pixel is allocated
        largest = factor
        while largest > 1 and canvas_pixels(largest) > MAX_PREVIEW_PIXELS:
            largest = largest * 3 // 4 if canvas_pixels(largest * 3 // 4) > MAX_PREVIEW_PIXELS else largest - 1
        raise ConfigurationError(
            f"preview: the picture would be {width}x{height} pixels ({width * height:,}), more than the "
            f"{MAX_PREVIEW_PIXELS:,} a preview draws (MAX_PREVIEW_PIXELS) at scale {factor}; use a smaller "
            f"--scale (at most about {largest}), fewer --steps or --slots."
        )
    canvas = image_module.new("RGB", (width, height), _BACKGROUND)
    draw = draw_module.Draw(canvas)
    font = font_module.load_default()
    tiles: list[PreviewTile] = []
    top = 0
    for row, h in zip(rows, row_h):
        left = 0
        for c, frame in enumerate(row.frames):
            pixels = _to_rgb(frame)
            tile = image_module.fromarray(pixels)
            frame_h, frame_w = pixels.shape[:2]
            if factor > 1:
                tile = tile.resize((frame_w * factor, frame_h * factor), image_module.NEAREST)
            if not row.valid:
                tile = image_module.blend(tile, image_module.new("RGB", tile.size, (90, 90, 90)), 0.7)
            # Boxes are drawn on the tile, so lines leaving the frame end at its edge.
            points = _draw_boxes(draw_module.Draw(tile), row, c, factor) if row.valid else ()
            x, y = left + _PAD, top + _PAD + _LABEL_HEIGHT
            canvas.paste(tile, (x, y))
            lines = _label(row, row.cameras[c])
            colour = _FIRST if row.is_first else _TEXT
            for n, line in enumerate(lines):
                draw.text((x, top + _PAD + 13 * n), _fit(draw, line, font, cell_w[c]), fill=colour, font=font)
            if row.is_first:
                draw.rectangle((x - 3, y - 3, x + tile.width + 2, y + tile.height + 2), outline=_FIRST, width=3)
            tiles.append(
                PreviewTile(
                    box=(x, y, tile.width, tile.height),
                    scale=factor,
                    step=row.step,
                    slot=row.slot,
                    camera=row.cameras[c],
                    camera_index=c,
                    clip_id=row.clip_id,
                    frame_index=row.frame_index,
                    timestamp=row.timestamp,
                    is_first=row.is_first,
                    valid=row.valid,
                    label="\n".join(lines),
                    points=points,
                )
            )
            left += cell_w[c] + 2 * _PAD
        top += h
    return Preview(image=canvas, tiles=tuple(tiles))


def _draw_boxes(draw: Any, row: _Row, camera: int, factor: int) -> tuple[tuple[float, float], ...]:
    """Draw the row's boxes projected into one camera's tile; returns their centres (frame pixels) drawn."""
    if row.boxes is None or row.intrinsics is None or row.extrinsics is None:
        return ()
    k, e = row.intrinsics[camera].cpu(), row.extrinsics[camera].cpu()
    x0 = y0 = 0
    height, width = row.frames[camera].shape[-2:]
    centres = []
    for box in row.boxes.detach().cpu():
        if len(box) < 7:
            continue
        corners = project(_box_corners(box), k, e)
        centre = project(box[None, :3], k, e)[0]
        for a, b in _EDGES:
            if corners[a, 2] > 0.1 and corners[b, 2] > 0.1:  # both corners in front of the camera
                draw.line(
                    [
                        (x0 + float(corners[a, 0]) * factor, y0 + float(corners[a, 1]) * factor),
                        (x0 + float(corners[b, 0]) * factor, y0 + float(corners[b, 1]) * factor),
                    ],
                    fill=_BOX,
                    width=2 if factor > 1 else 1,
                )
        u, v, depth = (float(value) for value in centre)
        if depth > 0.1 and 0 <= u < width and 0 <= v < height:
            cx, cy = x0 + u * factor, y0 + v * factor
            draw.ellipse((cx - 3, cy - 3, cx + 3, cy + 3), fill=_BOX)
            centres.append((u, v))
    return tuple(centres)


def preview_batches(
    source: Any,
    *,
    steps: int = 4,
    split: str = "train",
    max_slots: int | None = None,
    scale: int | None = None,
) -> Preview:
    """Draw the first ``steps`` batches a DataModule (or any loader) delivers: for notebooks.

    Args:
        source: A :class:`~lightning_vstream.StreamVideoDataModule` or
            :class:`~lightning_vstream.ClipVideoDataModule` (set up for ``fit`` here if needed), or an
            iterable of batches (a loader).
        steps: Batches to draw.
        split: Which loader of a DataModule: ``"train"``, ``"val"``, ``"test"`` or ``"predict"``.
        max_slots: Slots (samples) of each batch to draw; all when None.
        scale: See :func:`draw_batches`.

    Returns:
        The :class:`Preview`; a notebook cell shows it as the image.

    Example::

        >>> dm = StreamVideoDataModule(index_file="data/index.json", batch_size=2)  # doctest: +SKIP
        >>> preview_batches(dm, steps=3)  # doctest: +SKIP
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigurationError(f"steps={steps!r} must be an integer >= 1.")
    loader: Iterable[Mapping[str, Any]] = source
    hook = getattr(source, f"{split}_dataloader", None)
    if hasattr(source, "setup") and hook is not None:
        stage = {"train": "fit", "val": "validate"}.get(split, split)
        source.setup(stage)
        loader = hook()
    elif hasattr(source, "setup"):
        raise ConfigurationError(f"preview: the DataModule has no {split} loader (split={split!r}); pass its index.")
    batches: list[Mapping[str, Any]] = []
    iterator = iter(loader)
    try:
        for batch in iterator:
            batches.append(batch)
            if len(batches) == steps:
                break
    finally:
        close = getattr(iterator, "close", None)
        if callable(close):  # end the loader's workers now, not when the garbage collector finds them
            close()
    return draw_batches(batches, max_slots=max_slots, scale=scale)
