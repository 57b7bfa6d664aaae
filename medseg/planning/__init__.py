"""Planning, as nnU-Net plans: the dataset's fingerprint (:mod:`.fingerprint`), the plan of spacing, patch, network and
normalisation made from it (:mod:`.plan`), the plan of a training config (:mod:`.from_config`), its report
(:mod:`.report`), and the two estimates a plan is checked with: the training step's memory a patch is fitted to
(:mod:`.memory`) and the host RAM of training that decides ``data.cache=auto`` (:mod:`.ram`)."""
