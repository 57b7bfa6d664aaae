"""The clone's tools, each behind its own script: the GPU check (:mod:`tools.gpu_check`, ``scripts/gpu_check.py``)
and the offline install bundle (:mod:`tools.offline_bundle`, ``scripts/offline_bundle.py``). Not in medseg's wheel."""
