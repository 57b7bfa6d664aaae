"""Where a process runs: the device and precision (:mod:`.device`), the launch environment of torchrun and SLURM
(:mod:`.launch`), DDP's collectives (:mod:`.distributed`), and handing the pages of freed volumes back to the system
(:mod:`.host_memory`)."""
