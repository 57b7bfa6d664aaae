"""What a training run leaves on disk, and reading it back: every path of a run or a multirun folder
(:mod:`.layout`), the checkpoint file (:mod:`.checkpoint`), a run's or a multirun's folder read back (:mod:`.folders`:
:class:`~.folders.Run`, :class:`~.folders.Sweep`), and the lock of a run folder (:mod:`.lock`)."""
