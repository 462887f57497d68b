"""The random-access way to read: each sample is an explicit set of frames of one clip.

- :mod:`~lightning_vstream.clips.selection`: which frames a sample holds (indices, times, multi-rate segments)
  and the frame policy (:data:`FRAME_POLICIES`, :func:`snap_to_keyframes`).
- :mod:`~lightning_vstream.clips.windows`: windows over clips, the samples a dataset holds (:class:`FrameWindow`,
  :class:`TimeWindow`, regular or random).
- :mod:`~lightning_vstream.clips.from_files`: an in-memory index of single-camera clips made from a list of files
  (:func:`index_from_files`).
- :mod:`~lightning_vstream.clips.dataset`: :class:`~lightning_vstream.VideoClipDataset`: request checks, the
  per-sample CPU read on the shared runner (:class:`~lightning_vstream.decode.threads.DecodeThreads`).
- :mod:`~lightning_vstream.clips.gpu_reader`: a whole batch of samples read at once on a GPU, GOP-planned, on
  parallel threads (:class:`BatchReader`).
- :mod:`~lightning_vstream.clips.batch`: samples and batches (:class:`ClipSample`, :class:`ClipBatch`), their one
  builder each (:func:`clip_sample`, :func:`collate_clips`), and the outputs' geometry.
- :mod:`~lightning_vstream.clips.epochs`: new clips and augmentations every epoch, and loader counters.
- :mod:`~lightning_vstream.clips.loader`: :class:`ClipDataLoader`, the StatefulDataLoader of the DataModule.
- :mod:`~lightning_vstream.clips.datamodule`: :class:`~lightning_vstream.ClipVideoDataModule`.

This package and :mod:`lightning_vstream.stream` are siblings: neither imports the other.
"""
