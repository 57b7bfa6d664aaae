"""Where a process runs: the device and precision (:mod:`.device`), the launch environment of torchrun and SLURM
(:mod:`.launch`), DDP's collectives (:mod:`.distributed`), and the allocator policy that gives freed volumes back
to the system (:mod:`.host_memory`)."""
