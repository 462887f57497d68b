"""Map-style access to explicit clip samples: :class:`VideoClipDataset`.

Each item is a :class:`~lightning_vstream.clips.selection.ClipRequest` (frame indices or times of one
clip, all its cameras or a subset). The dataset works with any ``Sampler`` and ``DataLoader``:
the sampler yields positions in the dataset's request list (or requests themselves, which
``__getitem__`` also accepts).

Cost model: a sample's wanted frames are grouped by file and GOP (the one GOP scheduler,
:mod:`lightning_vstream.decode.gops`) and every GOP is decoded once, from its keyframe to its last
wanted frame, each wanted frame straight into its place in the sample; the GOPs of all cameras are
spread over ``gop_threads`` decoding threads (the one runner, :mod:`lightning_vstream.decode.threads`).
Keyframe positions and timestamps come from the index metadata (written by ``vstream index``), so
no file is scanned; without metadata each file is probed once per worker. Each decoding thread keeps
its decoders open between samples (at most ``max_open_decoders`` files per process), so repeated
requests to a file do not reopen it. On a GPU a whole batch is read at once
(:mod:`lightning_vstream.clips.gpu_reader`). Every sample is built by
:func:`~lightning_vstream.clips.batch.clip_sample`; samples batch with
:func:`~lightning_vstream.clips.batch.collate_clips`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, cast

import torch
from torch.utils.data import Dataset

from lightning_vstream.annotations.source import resolve_annotations
from lightning_vstream.clips.batch import (
    ClipSample,
    clip_sample,
    make_output,
    output_matrices,
    resize_matrix,
    unreadable_sample,
)
from lightning_vstream.clips.selection import (
    FRAME_POLICIES,
    ClipRequest,
    FramePolicy,
    camera_names,
    frame_table,
    resolve_times,
    snap_to_keyframes,
)
from lightning_vstream.decode.base import VideoDecodeError, VideoInfo
from lightning_vstream.decode.cpu.colour import check_size
from lightning_vstream.decode.device import gpu_failure
from lightning_vstream.decode.factory import make_decoder
from lightning_vstream.decode.gops import GopPlanner, GopTask
from lightning_vstream.decode.threads import GopExecutor, TaskDecoder, frames_decoder_tasks
from lightning_vstream.errors import ConfigurationError, ConfigurationTypeError, MissingFileError, frame_out_of_range
from lightning_vstream.index import CameraStream, Clip, VideoIndex
from lightning_vstream.index.listing import leave_out_hint
from lightning_vstream.index.records import ClipSequence
from lightning_vstream.indexing import load_index
from lightning_vstream.options import (
    DECODE_MOVES,
    STORAGE_MOVES,
    DecodeOptions,
    ErrorOptions,
    OutputOptions,
    check_arguments,
    is_count,
    moved_keywords,
    option_group,
)
from lightning_vstream.outputs import changes_geometry
from lightning_vstream.storage.config import StorageConfig
from lightning_vstream.storage.urls import basename

__all__ = ["DEFAULT_GOP_THREADS", "VideoClipDataset"]

#: GOPs a :class:`VideoClipDataset` decodes at once per sample by default.
DEFAULT_GOP_THREADS = 2
#: Files each process keeps open when ``max_open_decoders`` is None.
DEFAULT_OPEN_DECODERS = 8
#: The flat keywords the option groups replaced, and where each went.
DATASET_MOVES: dict[str, tuple[type, dict[str, str]]] = {
    "decode": (DecodeOptions, DECODE_MOVES),
    "output": (OutputOptions, {name: name for name in ("transform", "outputs", "annotations", "augment")}),
    "errors": (ErrorOptions, {"on_error": "on_error"}),
    "storage": (StorageConfig, STORAGE_MOVES),
}

log = logging.getLogger("lightning_vstream")


class _Resolved(NamedTuple):
    """What one request reads: its clip, camera streams and their frame tables (empty when the sample is
    skipped), the frames it returns, the request and where it came from (``requests[3]``, for errors)."""

    clip: Clip
    streams: list[CameraStream]
    infos: list[VideoInfo]
    indices: list[int]
    request: ClipRequest
    origin: str


class VideoClipDataset(Dataset[ClipSample]):
    """Map-style dataset of explicit clip samples, for any ``Sampler`` and ``DataLoader``.

    ``dataset[i]`` returns the sample for ``requests[i]``; ``dataset[request]`` serves any
    :class:`~lightning_vstream.clips.selection.ClipRequest` directly, so a custom sampler may yield
    requests. Decoders are created lazily in the process that reads (each DataLoader worker),
    never in ``__init__``, and the dataset pickles without them (spawn-safe).

    A sample is a :class:`~lightning_vstream.ClipSample` (a dict; its keys are documented in
    ``docs/concepts.md``, "The batch"): ``frames`` ``[T, cameras, 3, H, W]``, ``clip_id``,
    ``frame_index``, ``timestamp``, ``camera_names`` and ``valid`` (False for a sample that could not be
    decoded under ``on_error="skip"``: its frames are zeros and its timestamps NaN, so batches keep
    their size and DDP ranks their step count), with ``annotations``, ``outputs`` and
    ``img_aug_matrix`` where they apply.

    Batch samples with :func:`~lightning_vstream.collate_clips` (``DataLoader(..., collate_fn=collate_clips)``).

    Args:
        index: The video index, or the path or URL of an index file (loaded here, with
            ``storage_options``, ``cache_dir`` and ``cache_limit``; no video is opened).
        requests: The samples of the dataset, in order.
        cameras: Cameras of every request that names none, in this order; all the index's
            cameras when None.
        decode: Where and how frames are decoded (:class:`~lightning_vstream.DecodeOptions`):
            ``device`` ``"cpu"`` (PyAV), or a CUDA device (``"cuda"``, ``"cuda:1"``) to decode videos
            with NVDEC and image folders with nvJPEG; frames then arrive on that GPU. GPU decoding
            runs in the reading process (use ``num_workers=0``): the batch's GOPs are spread over
            ``gop_threads`` threads, each with its own decoders and CUDA stream (the DataLoader's
            batched fetch, ``__getitems__``). It delivers frames, labels and ``transform`` only:
            annotations, augmentation, ``size`` and per-camera frames need the CPU.
            ``max_open_decoders``: files each worker keeps open (LRU; None: 8), each holding up to
            ``gop_threads`` decoders; ``camera_frames="per_camera"``: a list of ``[T, 3, H_c, W_c]``
            tensors, one per camera, so cameras may differ in size.
        output: What each sample carries (:class:`~lightning_vstream.OutputOptions`): ``transform``
            (any callable on frame tensors ``[n, 3, H, W]``, applied to each sample's ``T x cameras``
            frames where they are decoded), named ``outputs`` (each makes
            ``sample["outputs"][name]["frames"]`` from the frames decoded and augmented once, with its
            own geometry), ``annotations`` (a folder of ``<clip_id>.npz`` files or an
            :class:`~lightning_vstream.annotations.AnnotationSource`) and ``augment`` (one draw per
            sample from ``(seed, epoch, clip, first frame)``; cameras of different sizes all come out
            at its ``output_size``). ``pad_annotations`` is :func:`collate_clips`' to apply.
        errors: ``on_error="raise"``: an unreadable frame raises a :class:`VideoDecodeError` naming
            file, clip, camera and frame, and a frame without annotation an
            :class:`~lightning_vstream.errors.AnnotationError`. ``"skip"``: an unreadable sample
            comes back with ``valid=False`` (zeros), each bad file is logged once per process, and
            :attr:`skipped` counts the samples; a frame without annotation is delivered with
            ``has_annotations=False`` and counted in :attr:`missing_annotations`
            (:class:`~lightning_vstream.ErrorOptions`; its ``timeout`` is the DataLoader's).
        size: Output ``(height, width)`` of every frame: video decoders resize while converting
            to RGB (uint8, FFmpeg's swscale), image folders are resized after decoding. Cameras
            of different sizes can then share a sample. None keeps the files' size.
        gop_threads: GOPs decoded at once. On the CPU, per sample: a request's frames are grouped
            by GOP and the groups of all its cameras spread over this many threads, each file read
            by up to this many decoders (None: 2; 1 decodes them in turn, in the reading thread). With more than
            one, each CPU decoder uses one FFmpeg thread unless ``decode.decoder_threads`` asks for more
            (:attr:`ffmpeg_threads`). On the GPU, per batch (None: twice the GPU's NVDEC engines).
        seed: Seed of the augmentation draws.
        epoch: Epoch of the augmentation draws (the DataModule sets it when it builds a loader).
        frame_policy: ``"exact"`` (default) returns the requested frames. ``"nearest_keyframe"`` is
            APPROXIMATE: each requested frame is replaced by the first camera's keyframe nearest to
            it, which decodes without its GOP's other frames (much faster for random access on
            long GOPs). Returned ``frame_index`` and ``timestamp`` are always the real ones of the
            frames returned; cameras whose keyframes sit elsewhere decode those same frames exactly.
        storage: How to reach an index given as a URL, and where to cache it
            (:class:`~lightning_vstream.StorageConfig`; see ``docs/remote.md``).

    Raises:
        ValueError: A request names a clip or camera that is not in the index.
        DecoderCapabilityError: ``decode.device`` is a CUDA device but torch sees no GPU (the DataModules' error).
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

    @moved_keywords("VideoClipDataset", DATASET_MOVES)
    def __init__(
        self,
        *,
        index: VideoIndex | Path | str,
        requests: Sequence[ClipRequest] = (),
        cameras: Sequence[str] | None = None,
        decode: DecodeOptions = DecodeOptions(),
        output: OutputOptions = OutputOptions(),
        errors: ErrorOptions = ErrorOptions(),
        storage: StorageConfig = StorageConfig(),
        size: tuple[int, int] | None = None,
        gop_threads: int | None = None,
        frame_policy: FramePolicy = "exact",
        seed: int = 0,
        epoch: int = 0,
    ) -> None:
        owner = "VideoClipDataset"
        decode = option_group(owner, "decode", DecodeOptions, decode)
        output = option_group(owner, "output", OutputOptions, output)
        errors = option_group(owner, "errors", ErrorOptions, errors)
        storage = option_group(owner, "storage", StorageConfig, storage)
        device = decode.device
        check_arguments(
            owner,
            {
                "decode.device": (
                    device,
                    device != "auto",
                    "'cpu', 'cuda' or 'cuda:<index>' (the DataModules also take 'auto')",
                ),
                "frame_policy": (
                    frame_policy,
                    frame_policy in FRAME_POLICIES,
                    "'exact' or 'nearest_keyframe' (approximate: the keyframe nearest each requested frame)",
                ),
                "gop_threads": (gop_threads, gop_threads is None or is_count(gop_threads), "None or an integer >= 1"),
            },
        )
        annotations, augment = output.annotations, output.augment
        if device != "cpu" and (
            annotations is not None or augment is not None or size is not None or decode.camera_frames != "stacked"
        ):
            raise ConfigurationError(
                f"{owner}: decode.device={device!r} delivers frames and labels only; annotations, augment, "
                "size and camera_frames='per_camera' need decode.device='cpu'."
            )
        self.index = self._load(index, storage, device)
        names = camera_names(cameras)
        self.cameras = tuple(self.index.camera_names) if names is None else names
        #: The option groups, as given (``output.annotations`` is resolved into :attr:`annotations`).
        self.decode = decode
        self.output = output
        self.errors = errors
        #: Files each process keeps open (``decode.max_open_decoders``, or 8).
        self.max_open_decoders = DEFAULT_OPEN_DECODERS if decode.max_open_decoders is None else decode.max_open_decoders
        self.frame_policy: FramePolicy = frame_policy
        self.gop_threads = gop_threads
        self.size = check_size(size)
        #: Samples this process delivered as ``valid=False`` (``on_error="skip"``).
        self.skipped = 0
        self._bad_files: set[str] = set()
        self.requests: list[ClipRequest] = list(requests)
        self._check_requests()
        self._infos: dict[Path | str, VideoInfo] = {}
        self._executor: GopExecutor | None = None
        self._labels: dict[Hashable, str] = {}  # file -> clip and camera, for the errors of its decoder
        self.annotations = resolve_annotations(annotations)
        self.seed = seed
        self.epoch = epoch
        #: Frames this process delivered with ``has_annotations=False`` (``on_error="skip"``).
        self.missing_annotations = 0
        self._reader: Any = None
        self._clock = 0  # samples read by this process: the order in which remote GOPs are fetched

    @property
    def decode_device(self) -> str:
        """Where frames are decoded (``decode.device``): ``"cpu"`` or a CUDA device."""
        return self.decode.device

    @staticmethod
    def _load(index: VideoIndex | Path | str, storage: StorageConfig, decode_device: str) -> VideoIndex:
        """The index given, or loaded from its path or URL (a remote one decodes on the CPU only)."""
        if not isinstance(index, VideoIndex):
            index = load_index(
                index,
                storage_options=dict(storage.options),
                cache_dir=storage.cache_dir,
                cache_limit=storage.cache_limit,
            )
        if decode_device != "cpu" and index.storage is not None:
            raise ConfigurationError(
                f"index {index.source!r} is remote: decoding remote files on {decode_device!r} is not supported "
                "yet; use decode=DecodeOptions(device='cpu')."
            )
        return index

    def _check_requests(self) -> None:
        """Every request names a clip, cameras and frames of the index; the dataset's cameras are the index's."""
        for pos, request in enumerate(self.requests):
            if not isinstance(request, ClipRequest):
                raise ConfigurationTypeError(
                    f"requests[{pos}] is a {type(request).__name__}; build requests with at_indices(), "
                    "at_times(), multi_rate(), random_clips() or regular_clips()."
                )
            self._check_request(request, f"requests[{pos}]")
        unknown = [n for n in self.cameras if n not in self.index.camera_names]
        if unknown or not self.cameras:
            raise ConfigurationError(
                f"cameras={list(self.cameras)!r}: {unknown or 'no cameras'} not in the index {self._where()}, "
                f"whose cameras are {list(self.index.camera_names)}."
            )

    @property
    def bad_files(self) -> int:
        """Distinct files this process could not read (``on_error="skip"``)."""
        return len(self._bad_files)

    # -- requests: checking and resolving -------------------------------------------------------
    def _where(self) -> str:
        source = self.index.source
        return repr(basename(source) if isinstance(source, str) else source.name)

    def _position(self, request: ClipRequest, origin: str) -> int:
        try:
            return self.index.position(request.clip_id)
        except KeyError:
            known = ", ".join(repr(self.index.clip_id(i)) for i in range(min(5, len(self.index))))
            raise ConfigurationError(
                f"{origin}: clip {request.clip_id!r} is not in the index {self._where()} (clips include {known}); "
                "check the clip id, or rebuild the index with `vstream index`."
            ) from None

    def _check_names(self, request: ClipRequest, has: Sequence[str], origin: str) -> list[str]:
        names = list(request.cameras if request.cameras is not None else self.cameras)
        missing = [n for n in names if n not in has]
        if missing:
            raise ConfigurationError(
                f"{origin}: clip {request.clip_id!r} has no camera(s) {missing} (it has {list(has)}); "
                "request cameras that the index lists, or load the index with those cameras."
            )
        return names

    def _check_frames(self, request: ClipRequest, frame_count: int, origin: str) -> None:
        for f in request.frames:
            if not 0 <= f < frame_count:
                where = f"clip {request.clip_id!r} in {self._where()}"
                raise IndexError(f"{origin}: {frame_out_of_range(f, frame_count, where)}")

    def _check_request(self, request: ClipRequest, origin: str) -> None:
        """:meth:`_check` without building the clip where the index holds its clips as arrays."""
        clips = self.index.clips
        if not isinstance(clips, ClipSequence):
            self._check(request, origin)
            return
        position = self._position(request, origin)
        self._check_names(request, clips.camera_names, origin)
        self._check_frames(request, int(clips.frame_counts[position]), origin)

    def _check(self, request: ClipRequest, origin: str) -> tuple[Clip, list[CameraStream]]:
        clip = self.index.clips[self._position(request, origin)]
        by_name = {cam.name: cam for cam in clip.cameras}
        names = self._check_names(request, list(by_name), origin)
        self._check_frames(request, clip.frame_count, origin)
        return clip, [by_name[n] for n in names]

    def _info(self, cam: CameraStream) -> VideoInfo:
        info = self._infos.get(cam.path)
        if info is None:
            info = cam.info
        if info is None:
            # Only probed tables are kept here: the index's frame tables keep the recently used
            # ones, so reading every file of a large index does not keep every table in memory.
            info = self._infos[cam.path] = frame_table(cam, self.index.storage)
        return info

    def _resolve(self, item: int | ClipRequest, *, ahead: bool = False) -> _Resolved:
        """What ``item`` reads. Frame tables are empty when the first camera cannot be probed, or a file
        does not hold the frames asked for, under ``on_error="skip"`` (``ahead``: raise, a sample announced
        ahead is skipped when it is read)."""
        if isinstance(item, ClipRequest):
            request, origin = item, "request"
        else:
            if isinstance(item, bool) or not hasattr(item, "__index__"):
                hint = (
                    f"; to read clip {item!r}, pass a request such as dataset[at_indices({item!r}, [0, 1, 2])]"
                    if isinstance(item, str)
                    else ""
                )
                raise ConfigurationTypeError(
                    f"VideoClipDataset is indexed by request position (an int in 0..{len(self.requests) - 1}) or "
                    f"by a ClipRequest, not by a {type(item).__name__} ({item!r}){hint}."
                )
            item = item.__index__()
            if not -len(self.requests) <= item < len(self.requests):
                raise IndexError(f"request {item} is out of range: the dataset holds {len(self.requests)} requests.")
            request, origin = self.requests[item], f"requests[{item}]"
        clip, streams = self._check(request, origin)
        try:
            reference = self._info(streams[0])
        except (VideoDecodeError, OSError) as err:  # the file cannot even be probed
            if self.errors.on_error == "raise":
                raise
            label = f"clip {clip.clip_id!r}, camera {streams[0].name!r}"
            self._skip(streams[0].path, label, err)
            return _Resolved(clip, streams, [], [], request, origin)
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
        for cam, info in zip(streams, infos):
            if indices and max(indices) >= info.frame_count:  # a data fault (skippable), not a request out of range
                label = f"clip {clip.clip_id!r}, camera {cam.name!r}"
                fault = VideoDecodeError(
                    f"{label} ({str(cam.path)!r}): the index lists {clip.frame_count} frames, but the file holds "
                    f"{info.frame_count}, so frame {max(indices)} cannot be read. Re-run `vstream index` to rebuild "
                    "the index."
                )
                if self.errors.on_error == "raise" or ahead:
                    raise fault
                self._skip(cam.path, label, fault)
                return _Resolved(clip, streams, [], [], request, origin)
        return _Resolved(clip, streams, infos, indices, request, origin)

    def _announce(self, streams: Sequence[CameraStream], infos: Sequence[VideoInfo], indices: Sequence[int]) -> None:
        """Have the I/O threads fetch every GOP the sample's remote files need, at once (merged where adjacent).

        The decoders then find each GOP fetched or on its way, so a sample waits for one round trip,
        not one per GOP.
        """
        if self.index.storage is None:
            return
        from lightning_vstream.decode.ranged.gop_reads import gop_runs
        from lightning_vstream.storage.fetcher import fetcher_for

        fetcher = fetcher_for(self.index.storage)
        for cam, info in zip(streams, infos):
            if info.layout is not None and isinstance(cam.path, str):
                fetcher.prefetch(gop_runs(cam.path, info).units_for(info, indices), due=self._clock)
        self._clock += 1

    def prefetch(self, items: Sequence[int | ClipRequest]) -> None:
        """Start fetching the GOPs of remote files that ``items`` will need (the samples asked for next).

        Nothing is decoded and no decoder is opened; the bytes wait in this process's bounded
        prefetch memory (or the node cache) for the decoders. Local files are left alone. Samples
        that cannot be resolved are skipped here (they raise, or are skipped, when read).
        """
        if self.index.storage is None or self.decode_device != "cpu":
            return
        from lightning_vstream.decode.ranged.gop_reads import gop_runs
        from lightning_vstream.storage.fetcher import fetcher_for

        fetcher = fetcher_for(self.index.storage)
        for ahead, item in enumerate(items, start=1):
            try:
                resolved = self._resolve(item, ahead=True)
            except (VideoDecodeError, ConfigurationError, IndexError, OSError):
                continue
            streams, infos, indices = resolved.streams, resolved.infos, resolved.indices
            for cam, info in zip(streams, infos):
                if info.layout is not None and isinstance(cam.path, str):
                    fetcher.prefetch(gop_runs(cam.path, info).units_for(info, indices), due=self._clock + ahead)

    def _skip(self, path: Path | str, label: str, err: Exception, *, count: bool = True) -> None:
        self.skipped += count
        if self._executor is not None:
            self._executor.drop(path)
        if str(path) not in self._bad_files:
            self._bad_files.add(str(path))
            log.warning("skipping samples of %s (%s): %s", label, str(path), err)

    # -- reading ------------------------------------------------------------------------------
    @property
    def decoders(self) -> GopExecutor:
        """This process's GOP decoding: its threads and the decoders they keep open (created on first use).

        ``gop_threads`` threads (1: the calling thread), each keeping up to ``max_open_decoders`` decoders;
        after each sample at most ``max_open_decoders`` files stay open. A forked worker starts threads of
        its own; PyAVDecoder drops FFmpeg state inherited through fork and reopens its file lazily, so the
        inherited decoders stay usable.
        """
        if self._executor is None:
            threads = self._gop_thread_count
            self._executor = GopExecutor(
                self._open,
                workers=0 if threads == 1 else threads,
                max_open_per_worker=self.max_open_decoders,
                max_open_sources=self.max_open_decoders,
            )
        return self._executor

    @property
    def _gop_thread_count(self) -> int:
        return self.gop_threads if self.gop_threads is not None else DEFAULT_GOP_THREADS

    @property
    def ffmpeg_threads(self) -> int:
        """FFmpeg threads each CPU decoder of this dataset uses: ``decode.decoder_threads``, or with 0 (the default)
        1 when GOPs decode on several threads (``gop_threads`` > 1: those threads are the parallelism; frame
        threads on top oversubscribe the cores and, after every seek, refill and decode frames past the last
        one wanted) and FFmpeg's own choice when they decode one after another."""
        if self.decode.decoder_threads == 0 and self._gop_thread_count > 1:
            return 1
        return self.decode.decoder_threads

    def _open(self, task: GopTask) -> TaskDecoder:
        """A decoder of ``task``'s file, for the thread that decodes it."""
        decoder = make_decoder(
            task.source,  # type: ignore[arg-type]
            info=task.info,
            threads=self.ffmpeg_threads,
            label=self._labels.get(task.source, ""),
            size=self.size,
            storage=self.index.storage,
        )
        return frames_decoder_tasks(decoder)

    def decode_counts(self) -> tuple[int, int, int]:
        """Frames decoded, files opened and packets left out by this process so far (sample by sample, and in GPU
        batches)."""
        decoded = opened = skipped = 0
        if self._executor is not None:
            counts = self._executor.pool.counts()
            decoded, opened, skipped = counts.frames_decoded, counts.files_opened, counts.packets_skipped
        if self._reader is not None:
            opened += self._reader.executor.opened
            skipped += self._reader.packets_skipped
        return decoded, opened, skipped

    def __len__(self) -> int:
        return len(self.requests)

    def __getitem__(self, item: int | ClipRequest) -> ClipSample:
        if self._batched():
            return self.__getitems__([item])[0]
        clip, streams, infos, indices, request, origin = self._resolve(item)
        if not infos:
            count = len(request.times or request.frames)
            return unreadable_sample(clip.clip_id, [cam.name for cam in streams], count, self.output.outputs)
        self._check_frame_sizes(origin, clip, streams, infos)
        frames, targets = self._sample_memory(streams, infos, len(indices))
        valid = self._read_sample(clip, streams, infos, indices, targets)
        # Geometry from the file's pixels to those of the decoded (and augmented) frames, per camera.
        decoded = [self.size or (info.height, info.width) for info in infos]
        before = [resize_matrix(info.height, info.width, *size) for info, size in zip(infos, decoded)]
        if self.output.augment is not None:
            frames = self._augmented(clip.clip_id, indices, targets, before)
            decoded = [self.output.augment.output_size] * len(streams)
        per_camera = self.decode.camera_frames == "per_camera"
        base: torch.Tensor | list[torch.Tensor] = (
            frames if not per_camera else (targets if self.output.augment is None else list(frames.unbind(1)))
        )
        return self._sample(clip.clip_id, streams, indices, infos[0], base, valid, decoded, before)

    def _check_frame_sizes(
        self, origin: str, clip: Clip, streams: Sequence[CameraStream], infos: Sequence[VideoInfo]
    ) -> None:
        """Cameras of different sizes stack only when something brings them to one size."""
        sizes = {cam.name: (info.width, info.height) for cam, info in zip(streams, infos)}
        per_camera = self.decode.camera_frames == "per_camera"
        if self.size is None and len(set(sizes.values())) > 1 and self.output.augment is None and not per_camera:
            listed = ", ".join(f"{n}={w}x{h}" for n, (w, h) in sizes.items())
            raise ConfigurationError(
                f"{origin}: clip {clip.clip_id!r} has cameras of different frame sizes ({listed}); samples stack "
                "cameras, so request them separately (cameras=[...]), pass size=(height, width) to resize "
                "them while decoding, augment=GeometryAugment(output_size=...) to resize every camera with its "
                "intrinsics, camera_frames='per_camera' for one tensor per camera, or resize the files to one size."
            )

    def _sample_memory(
        self, streams: Sequence[CameraStream], infos: Sequence[VideoInfo], steps: int
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Where a sample's frames are decoded: one ``[T, 3, H, W]`` target per camera, views of one stacked
        tensor when nothing follows decoding (decoders write each frame straight into its place)."""
        if self.decode.camera_frames != "per_camera" and self.output.augment is None:
            height, width = self.size if self.size is not None else (infos[0].height, infos[0].width)
            frames = torch.empty((steps, len(streams), 3, height, width), dtype=torch.uint8, device=self.decode_device)
            return frames, [frames[:, c] for c in range(len(streams))]
        targets = [
            torch.empty(
                (steps, 3, *(self.size or (info.height, info.width))), dtype=torch.uint8, device=self.decode_device
            )
            for info in infos
        ]
        return targets[0], targets

    def _read_sample(
        self,
        clip: Clip,
        streams: Sequence[CameraStream],
        infos: Sequence[VideoInfo],
        indices: Sequence[int],
        targets: list[torch.Tensor],
    ) -> bool:
        """Decode every camera's frames into ``targets``, the GOPs of all cameras spread over the decoding threads.

        Returns whether the sample could be read; under ``on_error="skip"`` a failure is counted, the
        files it names are skipped, and the targets hold zeros.
        """
        planner = GopPlanner()
        for c, (cam, info) in enumerate(zip(streams, infos)):
            self._labels[cam.path] = f"clip {clip.clip_id!r}, camera {cam.name!r}"
            planner.add_many(cam.path, info, indices, [(c, t) for t in range(len(indices))])

        def into(task: GopTask, index: int) -> torch.Tensor:
            c, t = cast("tuple[int, int]", task.targets[task.frames.index(index)][0])
            return targets[c][t]

        def deliver(task: GopTask, index: int, frame: torch.Tensor, target: Any) -> None:
            c, t = target
            slot = targets[c][t]
            if frame.data_ptr() == slot.data_ptr():
                return  # decoded in place
            if frame.shape != slot.shape:  # an image folder at its own size, in a resized sample
                from lightning_vstream.transforms import FrameTransform

                frame = FrameTransform(resize=(slot.shape[-2], slot.shape[-1]))(frame[None])[0]
            slot.numpy()[:] = frame.numpy()  # numpy copies stay off torch's thread pool, which FFmpeg uses

        try:
            self._announce(streams, infos, indices)
            # Every GOP of the sample is read, also after one failed: what a sample opens and decodes
            # (its counters) does not depend on which thread failed first.
            self.decoders.run(planner.tasks(), deliver, into=into, cancel_on_error=False)
        except (VideoDecodeError, OSError, RuntimeError) as err:
            self._read_failed(clip, streams, indices, err)
            for target in targets:
                target.zero_()
            return False
        return True

    def _read_failed(self, clip: Clip, streams: Sequence[CameraStream], indices: Sequence[int], err: Exception) -> None:
        """A sample could not be read: raise its named error, or (``on_error="skip"``) skip the files it names."""
        fatal = gpu_failure(err, f"clip {clip.clip_id!r}, frames {list(indices)}")
        if fatal is err:
            raise err
        if fatal is not None:  # the GPU's own error: never skipped as a bad file
            raise fatal from err
        if isinstance(err, FileNotFoundError):  # a camera file gone since indexing: say how to go on without it
            first = str(err).split("\n", 1)[0]
            err = MissingFileError(
                f"clip {clip.clip_id!r}, frames {list(indices)}: {first} {leave_out_hint(clip.clip_id)}"
            )
        if self.errors.on_error == "raise":
            if isinstance(err, (VideoDecodeError, MissingFileError)):
                raise err
            raise VideoDecodeError(f"clip {clip.clip_id!r}, frames {list(indices)}: {err}") from err
        # The files the error names are the bad ones (the other cameras of the sample are fine).
        failed = [cam for cam in streams if str(cam.path) in str(err)] or list(streams)
        for cam in failed:
            self._skip(cam.path, f"clip {clip.clip_id!r}, camera {cam.name!r}", err, count=cam is failed[0])

    def _augmented(
        self, clip_id: str, indices: Sequence[int], targets: list[torch.Tensor], before: list[torch.Tensor]
    ) -> torch.Tensor:
        """The sample's frames augmented (one draw per sample), ``before`` updated with the augmentation."""
        assert self.output.augment is not None
        params = self.output.augment.draw(seed=self.seed, epoch=self.epoch, key=f"{clip_id}:{indices[0]}")
        frames = torch.empty(
            (len(indices), len(targets), 3, *self.output.augment.output_size),
            dtype=torch.uint8,
            device=self.decode_device,
        )
        for c, native in enumerate(targets):
            frames[:, c], matrix = self.output.augment.apply(native, params)
            before[c] = matrix.double() @ before[c]
        return frames

    @property
    def has_geometry(self) -> bool:
        """Whether samples carry ``img_aug_matrix``: something between the file and a delivered output crops or resizes."""
        return (
            self.output.augment is not None
            or self.size is not None
            or changes_geometry(self.output.transform)
            or any(changes_geometry(t) for t in self.output.outputs.values())
        )

    def _sample(
        self,
        clip_id: str,
        streams: Sequence[CameraStream],
        indices: Sequence[int],
        reference: VideoInfo,
        base: torch.Tensor | list[torch.Tensor],
        valid: bool,
        sizes: Sequence[tuple[int, int]],
        before: Sequence[torch.Tensor],
    ) -> ClipSample:
        """The sample of ``base`` (the frames decoded and augmented): every output, the annotations and the geometry.

        ``reference`` is the first camera's frame table (the sample's timestamps), ``sizes`` each camera's
        ``(height, width)`` in ``base`` and ``before`` the matrix from the file's pixels to them.
        """
        timestamps = [reference.timestamp(i) if valid else math.nan for i in indices]
        camera_names = [cam.name for cam in streams]
        annotations = None
        if self.annotations is not None:
            from lightning_vstream.annotations.batch import sample_annotations

            fields, has, missing = sample_annotations(
                self.annotations, clip_id, indices, timestamps, camera_names, on_error=self.errors.on_error
            )
            self.missing_annotations += missing
            annotations = (fields, has)
        geometry = None
        if self.has_geometry:
            named = {name: output_matrices(t, sizes, before) for name, t in self.output.outputs.items()}
            geometry = (output_matrices(self.output.transform, sizes, before), named)
        return clip_sample(
            clip_id=clip_id,
            camera_names=camera_names,
            frame_index=indices,
            timestamps=timestamps,
            valid=valid,
            frames=make_output(self.output.transform, base, valid),
            outputs={name: make_output(transform, base, valid) for name, transform in self.output.outputs.items()},
            annotations=annotations,
            geometry=geometry,
        )

    def _batched(self) -> bool:
        return self.decode_device != "cpu"

    def __getitems__(self, items: Sequence[int | ClipRequest]) -> list[ClipSample]:
        """The samples of ``items``; on a GPU read together, GOP-planned and decoded on parallel threads.

        The DataLoader calls this for a whole batch. On the CPU it reads the samples one by one, as
        ``__getitem__`` does.
        """
        if not self._batched():
            return [self[item] for item in items]
        from lightning_vstream.clips.gpu_reader import PlannedSample

        planned, resolved = [], []
        for item in items:
            clip, streams, infos, indices, _, _ = self._resolve(item)
            resolved.append((clip, streams, infos))
            planned.append(
                PlannedSample(
                    clip_id=clip.clip_id,
                    camera_names=tuple(cam.name for cam in streams),
                    paths=tuple(Path(cam.path) for cam in streams),  # GPU decoding: local files only
                    infos=tuple(infos),
                    labels=tuple(f"clip {clip.clip_id!r}, camera {cam.name!r}" for cam in streams),
                    indices=tuple(indices),
                )
            )
        frames = self.reader.read(planned)
        eye = torch.eye(3, dtype=torch.float64)
        samples = []
        for base, plan, (clip, streams, infos) in zip(frames, planned, resolved):
            sizes = [(info.height, info.width) for info in infos]
            samples.append(
                self._sample(clip.clip_id, streams, plan.indices, infos[0], base, True, sizes, [eye] * len(sizes))
            )
        return samples

    @property
    def reader(self) -> Any:
        """This process's :class:`~lightning_vstream.clips.gpu_reader.BatchReader` (created on first use)."""
        if self._reader is None:
            from lightning_vstream.clips.gpu_reader import make_reader
            from lightning_vstream.decode.nvdec.memory import one_file_per_format

            formats = one_file_per_format(self.index)
            self._reader = make_reader(self.decode_device, self.gop_threads, self.max_open_decoders, formats=formats)
        return self._reader

    def close(self) -> None:
        """Close this process's open decoders (they reopen lazily) and stop its GOP threads."""
        if self._executor is not None:
            self._executor.close()
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_executor"] = None  # open files and threads stay in the process that opened them
        state["_reader"] = None  # so do decoding threads
        return state

    def __repr__(self) -> str:
        return (
            f"VideoClipDataset({len(self.requests)} requests, {len(self.index)} clips, "
            f"cameras={list(self.cameras)}, index={str(self.index.source)!r})"
        )
