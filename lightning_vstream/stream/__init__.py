"""The streaming way to read: each batch slot follows one clip frame by frame.

Modules in the order a step's data flows through them:

- :mod:`~lightning_vstream.stream.schedule`: which clip and frame every slot reads at every step, per rank
  (:class:`StreamSchedule`, :class:`Segment`, :class:`SlotRead`).
- :mod:`~lightning_vstream.stream.sampler`: the rank-aware sampler (:class:`StreamSampler`): each step's reads,
  split into parts; it holds the ledger.
- :mod:`~lightning_vstream.stream.ledger`: the one skip and resume ledger of both loaders (:class:`SkipLedger`):
  skipped clips, where each slot reads, the saved position.
- :mod:`~lightning_vstream.stream.parts`: what travels between the sampler and a worker and back
  (:class:`StreamTask`, :class:`StreamPart` with its :class:`PartFrames`), and parts merged into batch rows.
- :mod:`~lightning_vstream.stream.worker`: the DataLoader worker side (:class:`StreamDataset`): decode the camera
  streams one part asks for.
- :mod:`~lightning_vstream.stream.frame_steps`: what follows the decoding of a camera frame, the same in workers
  and engine threads (:class:`FrameSteps`: augment, transform, outputs, annotations).
- :mod:`~lightning_vstream.stream.failures`: what a failed camera read becomes, the same in both loaders.
- :mod:`~lightning_vstream.stream.engine`: the one stream engine (:class:`StreamEngine`): what makes a step's
  decoded frames a batch, and the counters, whichever :class:`Executor` decoded them.
- :mod:`~lightning_vstream.stream.worker_executor`: the executor of DataLoader worker processes
  (:class:`WorkerExecutor`): the parts of each step put into its tensors.
- :mod:`~lightning_vstream.stream.worker_loader`: the worker loader (:class:`StreamDataLoader`), a DataLoader
  running the engine with its workers.
- :mod:`~lightning_vstream.worker_processes`: watching the worker processes: a death or a stall ends as one error.
- :mod:`~lightning_vstream.stream.memory`: batch memory: host batches returned to a pool (:class:`BufferPool`) and
  the engine's batches on its device (:class:`EngineBatches`).
- :mod:`~lightning_vstream.stream.batch`: the streaming batch (:class:`StreamBatch`) and its one builder
  (:class:`~lightning_vstream.stream.batch.StepAssembler`), used by both loaders.
- :mod:`~lightning_vstream.stream.thread_executor`: the executor of decode threads in the training process
  (:class:`ThreadExecutor`): each frame written once into the batches of a step.
- :mod:`~lightning_vstream.stream.engine_reads`: one decode thread's decoders and the writing of a camera frame
  into its rows (:class:`ThreadDecoders`).
- :mod:`~lightning_vstream.stream.engine_device`: where the engine keeps its batches and orders its work (CUDA
  streams and events, or the host).
- :mod:`~lightning_vstream.stream.engine_loader`: the thread loader (:class:`EngineLoader`) and how it is
  built for a device (:func:`build_engine_loader`).
- :mod:`~lightning_vstream.stream.loaders`: the one constructor of a stream loader, its executor a parameter
  (:func:`build_stream_loader`), and the options the chosen executor does not use.
- :mod:`~lightning_vstream.stream.prefetch`: remote GOPs fetched ahead, driven by the schedule
  (:class:`StreamPrefetcher`).
- :mod:`~lightning_vstream.stream.stream_datamodule`: :class:`~lightning_vstream.StreamVideoDataModule`.

This package and :mod:`lightning_vstream.clips` are siblings: neither imports the other.
"""
