"""Whether a case is of the modality its checkpoint was trained on: a warning, never a refusal.

A checkpoint knows its training modality from its channels (``dataset.json``'s modality names: ``CT``; ``MRI``,
``T2``, ``FLAIR``, ...) and its normalisation (``ct``: clipping and statistics in Hounsfield units). A case says its
own where that is clear: a DICOM series by its ``Modality``; any other image by its least value, since a CT in
Hounsfield units holds air (-1000 HU) and an MR image holds no value near it. An MR series given to a CT model is
clipped and standardised with HU statistics, and its prediction means nothing, yet nothing fails; hence one warning
through the ``medseg`` logger, said once per run for each kind of mismatch (the first case named).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from medseg.data.datalist import is_ct_channel
from medseg.data.dicom import DicomSeries, series_modality
from medseg.data.reading import INTENSITY_MIN, ImageSource
from medseg.data.transforms import check_normalization
from medseg.inference.cases import Case
from medseg.inference.model import EvalModel

log = logging.getLogger("medseg")

CT, MR = "CT", "MR"
MR_CHANNEL = re.compile(r"(MRI?|T1\w*|T2\w*|FLAIR|ADC|DWI|PD\w*)", re.IGNORECASE)
"""Channel names of MR sequences (MSD's and nnU-Net's ``dataset.json`` modality names: ``MRI``, ``T2``, ``T1w``,
``t1gd``, ``FLAIR``, ``ADC``)."""
IMAGING_MODALITIES = frozenset({"CT", "MR", "PT", "NM", "US", "CR", "DX", "MG", "XA"})
"""The DICOM ``Modality`` codes compared with a checkpoint's (an ``OT`` secondary capture says nothing)."""
HU_AIR = -500.0
"""A volume whose least value is at most this holds air in Hounsfield units (-1000 HU): a CT."""


def trained_modality(net: EvalModel) -> str | None:
    """``CT`` for a checkpoint trained on CT (every channel named CT, or the ``ct`` normalisation), ``MR`` for one
    whose every channel names an MR sequence (:data:`MR_CHANNEL`), else None (not known: nothing is compared)."""
    if all(map(is_ct_channel, net.channel_names)) or check_normalization(net.data.normalization) == "ct":
        return CT
    return MR if all(MR_CHANNEL.fullmatch(name.strip()) for name in net.channel_names) else None


def _is_series(source: ImageSource) -> bool:
    return isinstance(source, DicomSeries) or (isinstance(source, str | Path) and Path(source).is_dir())


def mismatch(trained: str, case: Case, image_meta: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(kind, how the case shows it)`` where ``case`` is clearly not of the ``trained`` modality (CT or MR): a
    series' ``Modality``, else the least value of a channel (``image_meta[INTENSITY_MIN]``, ``(C,)``, as read); None
    where it is, or where that is not clear."""
    for source in case.image_files:
        code = series_modality(source) if _is_series(source) else None
        if code in IMAGING_MODALITIES and code != trained:
            return code, f"is a series of Modality {code}"
    least = float(np.min(image_meta[INTENSITY_MIN]))
    if trained == CT and least >= 0:
        return "not HU", f"holds no value below 0 (its least is {least:g}; air is -1000 HU): not Hounsfield units"
    if trained == MR and least <= HU_AIR:
        return "HU", f"holds values down to {least:g}, as a CT's air in Hounsfield units"
    return None


class ModalityCheck:
    """Warns once per run for each kind of mismatch between a checkpoint's training modality and a case's."""

    def __init__(self) -> None:
        self.said: set[tuple[str, str]] = set()

    def check(self, net: EvalModel, case: Case, image_meta: Mapping[str, Any]) -> None:
        """Compare ``case`` (its image's meta as :class:`~medseg.data.reading.LoadCased` leaves it) with ``net``'s
        training modality; a warning the first time a kind of mismatch is seen."""
        trained = trained_modality(net)
        found = mismatch(trained, case, image_meta) if trained else None
        if found is None or (trained, found[0]) in self.said:
            return
        self.said.add((trained, found[0]))
        what = "HU clipping and statistics" if trained == CT else "MR intensities"
        log.warning("checkpoint %s was trained on %s (%s), but case %s %s: its segmentation may mean nothing "
                    "(said once; other cases alike are not named)", net.checkpoint or "in memory", trained, what,
                    case.case, found[1])
