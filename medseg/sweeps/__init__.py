"""Sweeps: the report of a multirun (:mod:`.report`) and the Hydra callbacks that write it when a multirun ends
(:mod:`.callbacks`)."""
