"""Where a process runs: the device and precision (:mod:`.device`), the launch environment of torchrun and SLURM
(:mod:`.launch`), and DDP's collectives (:mod:`.distributed`)."""
