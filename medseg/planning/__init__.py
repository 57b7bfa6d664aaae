"""Planning, as nnU-Net plans: the dataset's fingerprint (:mod:`.fingerprint`), the plan of spacing, patch, network and
normalisation made from it (:mod:`.plan`), the plan of a training config (:mod:`.from_config`), its report
(:mod:`.report`), and the training-memory estimate a patch is fitted with (:mod:`.memory`)."""
