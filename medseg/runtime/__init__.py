"""Where a process runs: the device and precision (:mod:`.device`), the launch environment of torchrun and SLURM
(:mod:`.launch`), DDP's collectives (:mod:`.distributed`), and host memory: what is available, the peak a process and
its workers take, and the pages of freed volumes handed back to the system (:mod:`.host_memory`)."""
