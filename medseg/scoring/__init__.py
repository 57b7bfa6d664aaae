"""Scoring a segmentation against its reference: Dice, HD95, surface Dice and volumes (:mod:`.metrics`), and the
per-case rows and summaries that evaluation, cross-validation and the benchmarks write (:mod:`.per_case`)."""
