"""Evaluation: score a folder with a checkpoint or an ensemble (:mod:`.evaluate`), and cross-validate a multirun of
folds (:mod:`.crossval`)."""
