"""Map-style access to explicit clip samples: :class:`VideoClipDataset` and its collate function.

Each item is a :class:`~lightning_vstream.clips.selection.ClipRequest` (frame indices or times of one
clip, all its cameras or a subset). The dataset works with any ``Sampler`` and ``DataLoader``:
the sampler yields positions in the dataset's request list (or requests themselves, which
``__getitem__`` also accepts).

Cost model: for each camera the needed frames are decoded in ascending order, starting from
the nearest keyframe at or before each one, and every GOP is decoded at most once per request
(:meth:`PyAVDecoder.get_many <lightning_vstream.decode.cpu.PyAVDecoder.get_many>`). Keyframe
positions and timestamps come from the index metadata (written by ``vstream index``), so no
file is scanned; without metadata each file is probed once per worker. Open decoders are kept
in a bounded LRU per worker (:class:`DecoderCache`), so repeated requests to a file do not
reopen it.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_vstream.clips.planner import (
    FRAME_POLICIES,
    FramePolicy,
    snap_to_keyframes,
)
from lightning_vstream.clips.selection import ClipRequest, frame_table, resolve_times
from lightning_vstream.decode.base import FrameDecoder, Layout, VideoInfo
from lightning_vstream.errors import ConfigurationError
from lightning_vstream.index import CameraStream, Clip, VideoIndex, load_index

if TYPE_CHECKING:
    import torch

from torch.utils.data import Dataset

__all__ = ["DecoderCache", "VideoClipDataset", "collate_clips", "index_from_files"]


class DecoderCache:
    """A bounded LRU of open decoders, one per file (each worker holds its own).

    Args:
        capacity: Most decoders kept open; the least recently used is closed beyond that.
        layout: Tensor layout of the decoders it creates.
        decoder_threads: FFmpeg threads per video decoder (0 lets FFmpeg choose; use 1 with many
            DataLoader workers).

    Example::

        >>> cache = DecoderCache(capacity=4)
        >>> dec = cache.get("clip/CAM_FRONT.mp4")  # doctest: +SKIP
    """

    def __init__(self, *, capacity: int = 8, layout: Layout = "chw", decoder_threads: int = 0) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity={capacity!r} must be a positive integer number of open decoders.")
        self.capacity = capacity
        self.layout = layout
        self.decoder_threads = decoder_threads
        self._open: OrderedDict[Path, FrameDecoder] = OrderedDict()
        self._closed_decoded = 0
        self.opened = 0

    def get(self, path: Path | str, *, info: VideoInfo | None = None, label: str = "") -> FrameDecoder:
        """The decoder for ``path``, reused if open, else created (lazily opened) and cached."""
        from lightning_vstream.decode import make_decoder

        path = Path(path)
        decoder = self._open.get(path)
        if decoder is not None:
            self._open.move_to_end(path)
            return decoder
        decoder = make_decoder(path, info=info, layout=self.layout, threads=self.decoder_threads, label=label)
        self._open[path] = decoder
        self.opened += 1
        while len(self._open) > self.capacity:
            _, old = self._open.popitem(last=False)
            self._retire(old)
        return decoder

    def _retire(self, decoder: FrameDecoder) -> None:
        self._closed_decoded += decoder.frames_decoded
        decoder.close()

    @property
    def frames_decoded(self) -> int:
        """Frames decoded by every decoder this cache created, open or closed."""
        return self._closed_decoded + sum(d.frames_decoded for d in self._open.values())

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, path: object) -> bool:
        return Path(path) in self._open if isinstance(path, (str, Path)) else False  # type: ignore[arg-type]

    def close(self) -> None:
        """Close every open decoder."""
        while self._open:
            _, decoder = self._open.popitem(last=False)
            self._retire(decoder)


class VideoClipDataset(Dataset[dict[str, Any]]):
    """Map-style dataset of explicit clip samples, for any ``Sampler`` and ``DataLoader``.

    ``dataset[i]`` returns the sample for ``requests[i]``; ``dataset[request]`` serves any
    :class:`~lightning_vstream.clips.selection.ClipRequest` directly, so a custom sampler may yield
    requests. Decoders are created lazily in the process that reads (each DataLoader worker),
    never in ``__init__``, and the dataset pickles without them (spawn-safe).

    A sample is a dict:

    - ``frames``: uint8 tensor ``[T, cameras, 3, H, W]`` (RGB);
    - ``clip_id``: str;
    - ``frame_index``: int64 tensor ``[T]``, the frames returned;
    - ``timestamp``: float64 tensor ``[T]``, their real presentation times in seconds (of the
      first returned camera);
    - ``camera_names``: list of str, the order of the ``cameras`` dimension.

    Batch samples with :func:`collate_clips` (``DataLoader(..., collate_fn=collate_clips)``).

    Args:
        index: The video index, or the path of an index file (loaded here; no video is opened).
        requests: The samples of the dataset, in order.
        cameras: Cameras of every request that names none, in this order; all the index's
            cameras when None.
        max_open_decoders: Decoders each worker keeps open (LRU).
        decoder_threads: FFmpeg threads per video decoder (0 lets FFmpeg choose).
        decode_device: ``"cpu"``, or a CUDA device (``"cuda"``, ``"cuda:1"``) to decode videos with
            NVDEC and image folders with nvJPEG; frames then arrive on that GPU. GPU decoding runs
            in the reading process (use ``num_workers=0``): the batch's GOPs are spread over
            ``gop_threads`` threads, each with its own decoders and CUDA stream. Reading a batch at
            once needs the DataLoader's batched fetch (``__getitems__``, any torch >= 2.0).
        frame_policy: ``"exact"`` (default) returns the requested frames. ``"nearest_keyframe"`` is
            APPROXIMATE: each requested frame is replaced by the first camera's keyframe nearest to
            it, which decodes without its GOP's other frames (much faster for random access on
            long GOPs). Returned ``frame_index`` and ``timestamp`` are always the real ones of the
            frames returned; cameras whose keyframes sit elsewhere decode those same frames exactly.
        gop_threads: Threads decoding the GOPs of a batch in parallel. None: twice the GPU's NVDEC
            engines on the GPU; 0 (one sample at a time, in order) on the CPU. On the CPU a
            positive value reads whole batches GOP-planned on that many threads.

    Raises:
        ValueError: A request names a clip or camera that is not in the index.
        IndexError: A request asks for a frame index outside its clip.

    Example::

        >>> from torch.utils.data import DataLoader
        >>> index = load_index("data/index.json")  # doctest: +SKIP
        >>> requests = random_clips(index, TimeWindow.at_rate(1.0, 8), count=1000)  # doctest: +SKIP
        >>> dataset = VideoClipDataset(index=index, requests=requests)  # doctest: +SKIP
        >>> loader = DataLoader(dataset, batch_size=4, shuffle=True, num_workers=4,
        ...                     collate_fn=collate_clips)  # doctest: +SKIP
        >>> next(iter(loader))["frames"].shape  # doctest: +SKIP
        torch.Size([4, 8, 6, 3, 900, 1600])
    """

    def __init__(
        self,
        *,
        index: VideoIndex | Path | str,
        requests: Sequence[ClipRequest] = (),
        cameras: Sequence[str] | None = None,
        max_open_decoders: int = 8,
        decoder_threads: int = 0,
        decode_device: str = "cpu",
        frame_policy: FramePolicy = "exact",
        gop_threads: int | None = None,
    ) -> None:
        if frame_policy not in FRAME_POLICIES:
            raise ConfigurationError(
                f"frame_policy={frame_policy!r} is not supported; use 'exact' or 'nearest_keyframe' (approximate: "
                "the keyframe nearest each requested frame)."
            )
        if gop_threads is not None and (isinstance(gop_threads, bool) or not isinstance(gop_threads, int)
                                        or gop_threads < 0):
            raise ConfigurationError(f"gop_threads={gop_threads!r} must be an integer >= 0, or None for the default.")
        if not isinstance(decode_device, str) or not (decode_device == "cpu" or decode_device.startswith("cuda")):
            raise ConfigurationError(
                f"decode_device={decode_device!r} is not supported; use 'cpu', 'cuda' or 'cuda:<index>' "
                "(the DataModule also takes 'auto')."
            )
        self.decode_device = decode_device
        self.frame_policy: FramePolicy = frame_policy
        self.gop_threads = gop_threads
        if isinstance(max_open_decoders, bool) or not isinstance(max_open_decoders, int) or max_open_decoders < 1:
            raise ValueError(f"max_open_decoders={max_open_decoders!r} must be a positive integer.")
        if isinstance(decoder_threads, bool) or not isinstance(decoder_threads, int) or decoder_threads < 0:
            raise ValueError(f"decoder_threads={decoder_threads!r} must be >= 0 (0 lets FFmpeg choose).")
        self.index = index if isinstance(index, VideoIndex) else load_index(index)
        self._clips: dict[str, Clip] = {c.clip_id: c for c in self.index.clips}
        self.cameras = tuple(self.index.camera_names if cameras is None else cameras)
        self.max_open_decoders = max_open_decoders
        self.decoder_threads = decoder_threads
        self.requests: list[ClipRequest] = list(requests)
        for pos, request in enumerate(self.requests):
            if not isinstance(request, ClipRequest):
                raise TypeError(
                    f"requests[{pos}] is a {type(request).__name__}; build requests with at_indices(), "
                    "at_times(), multi_rate(), random_clips() or regular_clips()."
                )
            self._check(request, f"requests[{pos}]")
        unknown = [n for n in self.cameras if n not in self.index.camera_names]
        if unknown or not self.cameras:
            raise ValueError(
                f"cameras={list(self.cameras)!r}: {unknown or 'no cameras'} not in the index {self._where()}, "
                f"whose cameras are {list(self.index.camera_names)}."
            )
        self._infos: dict[Path, VideoInfo] = {}
        self._cache: DecoderCache | None = None
        self._reader: Any = None

    # -- validation ---------------------------------------------------------------------------
    def _where(self) -> str:
        return repr(self.index.source.name)

    def _clip(self, request: ClipRequest, origin: str) -> Clip:
        clip = self._clips.get(request.clip_id)
        if clip is None:
            known = ", ".join(repr(c) for c in list(self._clips)[:5])
            raise ValueError(
                f"{origin}: clip {request.clip_id!r} is not in the index {self._where()} (clips include {known}); "
                "check the clip id, or rebuild the index with `vstream index`."
            )
        return clip

    def _streams(self, request: ClipRequest, clip: Clip, origin: str) -> list[CameraStream]:
        by_name = {cam.name: cam for cam in clip.cameras}
        names = request.cameras if request.cameras is not None else self.cameras
        missing = [n for n in names if n not in by_name]
        if missing:
            raise ValueError(
                f"{origin}: clip {request.clip_id!r} has no camera(s) {missing} (it has {list(by_name)}); "
                "request cameras that the index lists, or load the index with those cameras."
            )
        return [by_name[n] for n in names]

    def _check(self, request: ClipRequest, origin: str) -> tuple[Clip, list[CameraStream]]:
        clip = self._clip(request, origin)
        streams = self._streams(request, clip, origin)
        for f in request.frames:
            if not 0 <= f < clip.frame_count:
                raise IndexError(
                    f"{origin}: frame {f} is out of range for clip {request.clip_id!r}, which has "
                    f"{clip.frame_count} frames (valid: 0..{clip.frame_count - 1}) in {self._where()}."
                )
        return clip, streams

    # -- reading ------------------------------------------------------------------------------
    @property
    def decoders(self) -> DecoderCache:
        """This process's decoder cache (created on first use).

        A forked worker inherits the parent's cache; PyAVDecoder drops FFmpeg state inherited
        through fork and reopens its file lazily, so the inherited decoders stay usable.
        """
        if self._cache is None:
            self._cache = DecoderCache(capacity=self.max_open_decoders, decoder_threads=self.decoder_threads)
        return self._cache

    def _info(self, cam: CameraStream) -> VideoInfo:
        info = self._infos.get(cam.path)
        if info is None:
            info = self._infos[cam.path] = frame_table(cam)
        return info

    def __len__(self) -> int:
        return len(self.requests)

    def _resolve(self, item: int | ClipRequest) -> tuple[Clip, list[CameraStream], list[VideoInfo], list[int]]:
        """The clip, camera streams, their frame tables and the frame indices ``item`` returns."""
        if isinstance(item, ClipRequest):
            request, origin = item, "request"
        else:
            if not -len(self.requests) <= item < len(self.requests):
                raise IndexError(f"request {item} is out of range: the dataset holds {len(self.requests)} requests.")
            request, origin = self.requests[item], f"requests[{item}]"
        clip, streams = self._check(request, origin)
        reference = self._info(streams[0])
        if request.times:
            label = f"clip {clip.clip_id!r}, camera {streams[0].name!r}"
            indices = resolve_times(
                reference, request.times, policy=request.policy, frame_count=clip.frame_count, where=label
            )
        else:
            indices = list(request.frames)
        if self.frame_policy == "nearest_keyframe":
            indices = snap_to_keyframes(indices, reference)
        infos = [self._info(cam) for cam in streams]
        sizes = {cam.name: (info.width, info.height) for cam, info in zip(streams, infos)}
        if len(set(sizes.values())) > 1:
            listed = ", ".join(f"{n}={w}x{h}" for n, (w, h) in sizes.items())
            raise ValueError(
                f"{origin}: clip {clip.clip_id!r} has cameras of different frame sizes ({listed}); samples stack "
                "cameras, so request them separately (cameras=[...]) or resize the files to one size."
            )
        return clip, streams, infos, indices

    def __getitem__(self, item: int | ClipRequest) -> dict[str, Any]:
        import torch

        if self._batched():
            return self.__getitems__([item])[0]
        clip, streams, infos, indices = self._resolve(item)
        reference = infos[0]
        # Decoders write each frame straight into its slot of the sample: no stacking copies.
        frames = torch.empty((len(indices), len(streams), 3, reference.height, reference.width), dtype=torch.uint8)
        for c, (cam, info) in enumerate(zip(streams, infos)):
            decoder = self.decoders.get(cam.path, info=info, label=f"clip {clip.clip_id!r}, camera {cam.name!r}")
            _decode_into(decoder, indices, frames[:, c])
        return {
            "frames": frames,
            "clip_id": clip.clip_id,
            "frame_index": torch.tensor(indices, dtype=torch.int64),
            "timestamp": torch.tensor([reference.timestamp(i) for i in indices], dtype=torch.float64),
            "camera_names": [cam.name for cam in streams],
        }

    def _batched(self) -> bool:
        return self.decode_device != "cpu" or bool(self.gop_threads)

    def __getitems__(self, items: Sequence[int | ClipRequest]) -> list[dict[str, Any]]:
        """The samples of ``items`` read together: GOP-planned and decoded on parallel threads.

        The DataLoader calls this for a whole batch. On the CPU without ``gop_threads`` it reads
        the samples one by one, as ``__getitem__`` does.
        """
        if not self._batched():
            return [self[item] for item in items]
        from lightning_vstream.clips.batched import PlannedSample

        planned = []
        for item in items:
            clip, streams, infos, indices = self._resolve(item)
            planned.append(
                PlannedSample(
                    clip_id=clip.clip_id,
                    camera_names=tuple(cam.name for cam in streams),
                    paths=tuple(cam.path for cam in streams),
                    infos=tuple(infos),
                    labels=tuple(f"clip {clip.clip_id!r}, camera {cam.name!r}" for cam in streams),
                    indices=tuple(indices),
                )
            )
        return self.reader.read(planned)

    @property
    def reader(self) -> Any:
        """This process's :class:`~lightning_vstream.clips.batched.BatchReader` (created on first use)."""
        if self._reader is None:
            from lightning_vstream.clips.batched import make_reader

            self._reader = make_reader(self.decode_device, self.gop_threads, self.max_open_decoders,
                                       self.decoder_threads)
        return self._reader

    def close(self) -> None:
        """Close this process's open decoders (they reopen lazily)."""
        if self._cache is not None:
            self._cache.close()
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = None  # open files stay in the process that opened them
        state["_reader"] = None  # so do decoding threads
        return state

    def __repr__(self) -> str:
        return (
            f"VideoClipDataset({len(self.requests)} requests, {len(self._clips)} clips, "
            f"cameras={list(self.cameras)}, index={str(self.index.source)!r})"
        )


def _decode_into(decoder: FrameDecoder, indices: Sequence[int], out: torch.Tensor) -> None:
    """Decode ``indices`` into ``out[t]`` (``[T, 3, H, W]``), in ascending frame order.

    Ascending order is what keeps each GOP decoded at most once (see the module docs); a frame
    requested twice is decoded once and copied.
    """
    first_slot: dict[int, int] = {}
    takes_out = _accepts_out(decoder)
    for t, index in sorted(enumerate(indices), key=lambda pair: pair[1]):
        slot = out[t].numpy()  # numpy copies stay off torch's thread pool, which FFmpeg is using
        if index in first_slot:
            slot[:] = out[first_slot[index]].numpy()
            continue
        first_slot[index] = t
        if takes_out:
            decoder.get(index, out=out[t])  # type: ignore[call-arg]
        else:
            slot[:] = decoder.get(index).numpy()


def _accepts_out(decoder: FrameDecoder) -> bool:
    import inspect

    try:
        return "out" in inspect.signature(decoder.get).parameters
    except (TypeError, ValueError):
        return False


def collate_clips(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Stack clip samples into a batch (use as ``DataLoader(..., collate_fn=collate_clips)``).

    Returns ``frames`` uint8 ``[B, T, cameras, 3, H, W]``, ``frame_index`` int64 ``[B, T]``,
    ``timestamp`` float64 ``[B, T]``, ``clip_id`` list of str and ``camera_names`` list of str.

    Raises:
        ValueError: Samples differ in cameras, frame count ``T`` or frame size.

    Example::

        >>> loader = DataLoader(dataset, batch_size=8, collate_fn=collate_clips)  # doctest: +SKIP
    """
    import torch

    if not samples:
        raise ValueError("collate_clips got an empty list of samples.")
    first = samples[0]
    for s in samples[1:]:
        if list(s["camera_names"]) != list(first["camera_names"]):
            raise ValueError(
                f"cannot batch clip {first['clip_id']!r} (cameras {list(first['camera_names'])}) with clip "
                f"{s['clip_id']!r} (cameras {list(s['camera_names'])}); requests in one batch must name the same cameras."
            )
        if s["frames"].shape != first["frames"].shape:
            raise ValueError(
                f"cannot batch clip {first['clip_id']!r} (frames {tuple(first['frames'].shape)}) with clip "
                f"{s['clip_id']!r} (frames {tuple(s['frames'].shape)}); requests in one batch must have the same "
                "number of frames and the same frame size."
            )
    return {
        "frames": torch.stack([s["frames"] for s in samples]),
        "clip_id": [s["clip_id"] for s in samples],
        "frame_index": torch.stack([s["frame_index"] for s in samples]),
        "timestamp": torch.stack([s["timestamp"] for s in samples]),
        "camera_names": list(first["camera_names"]),
    }


def _load_table_cache(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(
            f"frame-table cache {str(path)!r} is not valid JSON ({err.msg} at line {err.lineno}); delete it."
        ) from None
    return data if isinstance(data, dict) else {}


def index_from_files(
    paths: Iterable[Path | str],
    *,
    ids: Sequence[str] | None = None,
    camera: str = "video",
    cache_file: Path | str | None = None,
) -> VideoIndex:
    """An in-memory index of single-camera clips, one per video file or image folder.

    Every file is probed here (its packets demuxed once, no frame decoded). With
    ``cache_file`` the frame tables are stored there (keyed by absolute path, size and
    modification time) and reused by later calls, so a long video is scanned once.

    Args:
        paths: Video files or image folders.
        ids: Clip ids, one per path; the file names without extension when None.
        camera: Camera name of every clip.
        cache_file: JSON file caching the frame tables across runs.

    Returns:
        A :class:`~lightning_vstream.VideoIndex` (its ``source`` is ``cache_file`` or the
        current folder).

    Raises:
        FileNotFoundError: A path does not exist.
        ValueError: Ids repeat (pass ``ids=``), or ``ids`` has the wrong length.

    Example::

        >>> index = index_from_files(sorted(Path("videos").glob("*.mp4")), cache_file="tables.json")  # doctest: +SKIP
    """
    from lightning_vstream.index import probe

    files = [Path(p).resolve() for p in paths]
    if not files:
        raise ValueError("index_from_files needs at least one path.")
    names = [p.stem if p.is_file() else p.name for p in files] if ids is None else list(ids)
    if len(names) != len(files):
        raise ValueError(f"ids has {len(names)} entries but {len(files)} paths were given; pass one id per path.")
    seen: dict[str, Path] = {}
    for name, path in zip(names, files):
        if name in seen:
            raise ValueError(
                f"clip id {name!r} is used by both {str(seen[name])!r} and {str(path)!r}; pass ids=[...] "
                "with one distinct id per path."
            )
        seen[name] = path
    cache_path = None if cache_file is None else Path(cache_file)
    cache = {} if cache_path is None else _load_table_cache(cache_path)
    changed = False
    clips = []
    for name, path in zip(names, files):
        if not path.exists():
            raise FileNotFoundError(f"{str(path)!r} (clip {name!r}) does not exist.")
        stat = path.stat()
        key = [stat.st_size if path.is_file() else None, stat.st_mtime_ns]
        entry = cache.get(str(path))
        info = None
        if isinstance(entry, dict) and entry.get("key") == key:
            try:
                info = VideoInfo.from_dict(entry["info"])
            except (KeyError, TypeError, ValueError):
                info = None
        if info is None:
            info = probe(path)
            cache[str(path)] = {"key": key, "info": info.to_dict()}
            changed = True
        clips.append(Clip(name, path.parent, info.frame_count, (CameraStream(camera, path, info),)))
    if cache_path is not None and changed:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_path.with_name(cache_path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, separators=(",", ":")), encoding="utf-8")
        tmp.replace(cache_path)
    source = cache_path.resolve() if cache_path is not None else Path.cwd()
    return VideoIndex(source, tuple(clips), (camera,))
