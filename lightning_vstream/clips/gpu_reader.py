"""Reading a whole batch of clip samples at once on a GPU: GOP-planned, decoded on parallel threads.

:class:`BatchReader` is what :class:`~lightning_vstream.clips.dataset.VideoClipDataset` uses when it
decodes on a GPU (the DataLoader's batched fetch, ``__getitems__``): the frames every sample of a
batch needs are planned by GOP (:class:`~lightning_vstream.decode.gops.GopPlanner`), the GOP tasks
spread over decoding threads (:class:`~lightning_vstream.decode.threads.GopExecutor`), and each
wanted frame is written once, straight into its slot of one preallocated batch tensor. The threads
decode with NVDEC (:class:`~lightning_vstream.decode.nvdec.decoder.NvGopDecoder`), image-folder cameras decode with nvJPEG in
one batched call, and the caller's CUDA stream waits once for each decoding stream that wrote into
the batch (no host synchronisation, no event per frame). No decoding stream ever waits for the
caller's: the batch is allocated on a stream of the reader's own that runs no work, so no earlier
work can still use its memory, and it is marked as used by the caller's stream
(``record_stream``), so its memory is not handed out again before the caller's work on it is done.
NVDEC is fed only what each GOP's wanted frames need: non-reference pictures no wanted frame needs
are never fed (:attr:`BatchReader.packets_skipped` counts them). A batch that does not finish within
``timeout`` seconds raises :class:`~lightning_vstream.errors.WorkerError` (a hung decoder never hangs
training), as the stream engine does.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_vstream.decode.base import VideoInfo
from lightning_vstream.decode.gops import GopPlanner, GopTask
from lightning_vstream.decode.threads import GopExecutor, TaskDecoder

if TYPE_CHECKING:
    import torch

    from lightning_vstream.decode.nvdec.decoder import DecoderPool

__all__ = ["BatchReader", "PlannedSample", "make_reader"]


@dataclass(frozen=True)
class PlannedSample:
    """One sample's resolved frames: the clip, its camera streams (path, frame table, label) and frame indices."""

    clip_id: str
    camera_names: tuple[str, ...]
    paths: tuple[Path, ...]
    infos: tuple[VideoInfo, ...]
    labels: tuple[str, ...]
    indices: tuple[int, ...]


class BatchReader:
    """Decodes batches of :class:`PlannedSample` s into their frames (see the module docs).

    Args:
        gpu: GPU ordinal to decode videos on with NVDEC.
        device: Where the frames tensor is allocated (``cuda:<gpu>``; the CPU under a test driver's
            host memory).
        threads: Decoding threads (0 decodes in the calling thread).
        max_open_per_thread: Open decoders each thread keeps (LRU per file).
        pool: NVDEC decoder pool (the process-wide one when None).
        timeout: Seconds a batch may take before :class:`~lightning_vstream.errors.WorkerError`
            is raised (0: no limit); the stream engine's default.

    Example::

        >>> reader = BatchReader(gpu=0, device="cuda:0", threads=2)  # doctest: +SKIP
        >>> samples = reader.read(planned)  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        gpu: int,
        device: torch.device | str,
        threads: int,
        max_open_per_thread: int = 4,
        pool: DecoderPool | None = None,
        timeout: float = 300.0,
    ) -> None:
        self.gpu = gpu
        self.device = device
        self.pool = pool
        self.timeout = timeout
        self._labels: dict[Hashable, str] = {}
        self._lock = threading.Lock()
        self._memory: Any = None  # FrameMemory of the GPU path (set on first use)
        self._alloc_stream: Any = None  # the stream batches are allocated on (runs no work)
        self._events: dict[int, Any] = {}  # decoding stream -> the event the caller's stream waits for
        self.executor = GopExecutor(self._open, workers=threads, max_open_per_worker=max_open_per_thread)

    def _open(self, task: GopTask) -> TaskDecoder:
        from lightning_vstream.decode.nvdec.decoder import NvGopDecoder

        label = self._labels.get(task.source, "")
        return NvGopDecoder(Path(str(task.source)), info=task.info, gpu=self.gpu, pool=self.pool, label=label)

    def read(self, samples: Sequence[PlannedSample]) -> list[torch.Tensor]:
        """Decode every sample's frames, ``[T, cameras, 3, H, W]`` each: views of one batch tensor when the samples
        have one shape (the dataset makes its samples of them, :func:`~lightning_vstream.clips.batch.clip_sample`)."""
        import torch

        if not samples:
            return []
        first = samples[0]
        height, width = first.infos[0].height, first.infos[0].width
        steps, cameras = len(first.indices), len(first.paths)
        uniform = all(
            len(s.indices) == steps
            and len(s.paths) == cameras
            and all((i.height, i.width) == (height, width) for i in s.infos)
            for s in samples
        )
        with self._allocating():
            if uniform:
                batch = torch.empty(
                    (len(samples), steps, cameras, 3, height, width), dtype=torch.uint8, device=self.device
                )
                tensors, outs = [batch], list(batch.unbind(0))
            else:  # samples of different shapes: one tensor each (collate_clips will say why they cannot stack)
                outs = tensors = [
                    torch.empty(
                        (len(s.indices), len(s.paths), 3, s.infos[0].height, s.infos[0].width),
                        dtype=torch.uint8,
                        device=self.device,
                    )
                    for s in samples
                ]
        planner = GopPlanner()
        images: list[tuple[Path, VideoInfo, int, tuple[int, int, int]]] = []
        for b, sample in enumerate(samples):
            for c, (path, info, label) in enumerate(zip(sample.paths, sample.infos, sample.labels)):
                self._labels.setdefault(str(path), label)
                for t, index in enumerate(sample.indices):
                    if path.is_dir():  # image folders: decoded with nvJPEG in one batched call
                        images.append((path, info, index, (b, t, c)))
                    else:
                        planner.add(str(path), info, index, (b, t, c))
        self._decode(planner.tasks(), images, outs, tensors)
        return outs

    def _allocating(self) -> Any:
        """The block in which batches are allocated: on the reader's own stream on a GPU (see the module docs)."""
        import contextlib

        import torch

        if torch.device(self.device).type != "cuda":
            return contextlib.nullcontext()
        if self._alloc_stream is None:
            self._alloc_stream = torch.cuda.Stream(device=self.device)
        return torch.cuda.stream(self._alloc_stream)

    def _decode(
        self,
        tasks: list[GopTask],
        images: list[tuple[Path, VideoInfo, int, tuple[int, int, int]]],
        outs: list[torch.Tensor],
        tensors: list[torch.Tensor],
    ) -> None:
        from lightning_vstream.decode.nvdec.decoder import Nv12Frame

        # The decoding streams that wrote into the batch; the caller's stream waits for each once, after every
        # conversion has been queued (also when a task failed: nothing may write into memory handed out again).
        streams: dict[int, Any] = {}

        def deliver(task: GopTask, index: int, frame: Nv12Frame, target: Any) -> None:
            b, t, c = target
            streams.setdefault(id(frame.stream), frame.stream)  # a stream is used by one thread at a time
            frame.write_into(outs[b][t, c])

        if images:
            self._decode_images(images, outs)
        try:
            self.executor.run(tasks, deliver, timeout=self.timeout or None)
        finally:
            self._wait_for(streams, tensors)

    def _wait_for(self, streams: dict[int, Any], tensors: list[torch.Tensor]) -> None:
        """Make the caller's stream wait for each decoding stream, and mark the batch as used by the caller's stream."""
        if self._memory is None:
            from lightning_vstream.decode.device import frame_memory

            self._memory = frame_memory()
        memory = self._memory
        consumer = memory.current_stream(self.gpu)
        for key, stream in streams.items():
            event = self._events.get(key)
            if event is None:
                event = self._events[key] = memory.new_event()
            memory.record(event, stream)
            memory.wait(consumer, event)
        if tensors[0].is_cuda:
            for tensor in tensors:
                tensor.record_stream(consumer)

    def _decode_images(self, images: list[tuple[Path, VideoInfo, int, tuple[int, int, int]]], outs: list[Any]) -> None:
        from lightning_vstream.decode.images import decode_images, image_files

        listed: dict[Path, list[Path]] = {}
        files = []
        for path, info, index, _ in images:
            if path not in listed:
                listed[path] = image_files(path)
                if len(listed[path]) != info.frame_count:
                    from lightning_vstream.decode.base import VideoDecodeError

                    raise VideoDecodeError(
                        f"{str(path)!r} holds {len(listed[path])} images but its frame table lists {info.frame_count};"
                        " rebuild the index with `vstream index`."
                    )
            files.append(listed[path][index])
        decoded = decode_images(files, device=outs[0].device)
        for (path, info, index, (b, t, c)), image in zip(images, decoded):
            if tuple(image.shape) != (3, info.height, info.width):
                from lightning_vstream.decode.base import VideoDecodeError

                raise VideoDecodeError(
                    f"{str(path)!r} frame {index} is {tuple(image.shape)}, but the camera's frames are "
                    f"(3, {info.height}, {info.width}); every image of a camera must have one size."
                )
            outs[b][t, c].copy_(image)

    @property
    def packets_skipped(self) -> int:
        """Packets its NVDEC decoders were never fed because no wanted frame needs their picture (open and closed
        decoders; :attr:`NvGopDecoder.packets_skipped <lightning_vstream.decode.nvdec.decoder.NvGopDecoder.packets_skipped>`)."""
        return self.executor.pool.counts().packets_skipped

    def close(self) -> None:
        """Stop the decoding threads and close their decoders."""
        self.executor.close()


def make_reader(
    decode_device: str,
    gop_threads: int | None,
    max_open: int,
    *,
    timeout: float = 300.0,
    formats: Sequence[tuple[Path, VideoInfo]] = (),
) -> BatchReader:
    """The reader for a dataset that decodes on ``decode_device``, a CUDA device: NVDEC threads.

    ``gop_threads=None`` means twice the GPU's NVDEC engines; ``"cuda"`` without an index
    is the calling thread's current GPU (the rank's, once Lightning or the user set it). Before the
    reader exists, the decoders it may hold at once (``gop_threads x max_open`` open, and the pool's
    idle ones for each of ``formats``) are checked against the GPU's free memory
    (:func:`~lightning_vstream.decode.nvdec.memory.check_nvdec_memory`) and the colour kernel is
    compiled and checked (:func:`~lightning_vstream.decode.nvdec.nv12.prepare_conversion`), on the calling
    thread.
    """
    import torch

    from lightning_vstream.decode.device import frame_memory
    from lightning_vstream.decode.nvdec.decoder import resolve_decode_device
    from lightning_vstream.decode.nvdec.memory import DEFAULT_HEADROOM, check_nvdec_memory
    from lightning_vstream.decode.nvdec.nv12 import prepare_conversion
    from lightning_vstream.decode.nvdec.pool import shared_decoder_pool

    device = torch.device(decode_device)
    if device.index is None:  # the rank's GPU, as the caller's thread has it
        if not torch.cuda.is_available():  # the DataModules' DecoderCapabilityError, not torch's AssertionError
            resolve_decode_device("cuda", 0, cuda_available=False)
        device = resolve_decode_device("cuda", 0, root_device=torch.device("cuda", torch.cuda.current_device()))
    gpu = device.index or 0
    if gop_threads is None:
        from lightning_vstream.decode.nvdec.session import num_decoder_engines

        gop_threads = 2 * num_decoder_engines(gpu, "hevc")
    infos = [info for _, info in formats if info is not None]
    if infos:
        largest = max(infos, key=lambda i: i.width * i.height)
        idle = shared_decoder_pool().max_idle_per_key
        memory = frame_memory()
        check_nvdec_memory(
            gpu,
            [(largest, max(1, gop_threads) * max_open), *((info, idle) for info in infos)],
            memory=memory,
            lower="gop_threads (engine.threads of ClipVideoDataModule) or decode.max_open_decoders",
            headroom=0 if memory.host else DEFAULT_HEADROOM,
        )
    prepare_conversion(device)
    return BatchReader(gpu=gpu, device=device, threads=gop_threads, max_open_per_thread=max_open, timeout=timeout)
