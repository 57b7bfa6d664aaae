"""Postprocessing: connected-component steps per class, decided on out-of-fold predictions and applied to new ones
(:mod:`.components`)."""
