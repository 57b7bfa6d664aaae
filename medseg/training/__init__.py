"""Training: the run (:mod:`.run`: check, read, plan, prepare, build, fit), the loop (:mod:`.trainer`), its plan
(:mod:`.planning`) and data (:mod:`.prepare`), losses, optimisers, time budget, validation, logging, and the checks of
a training config (:mod:`.checks`)."""
