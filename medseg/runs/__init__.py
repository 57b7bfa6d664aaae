"""What a training run leaves on disk, and reading it back: the checkpoint file (:mod:`.checkpoint`), and a run's or a
multirun's folder (:mod:`.folders`: :class:`~.folders.Run`, :class:`~.folders.Sweep`)."""
