"""DICOM-SEG output (``output_format=dicom_seg``): a case's masks as one DICOM Segmentation object on its source series.

The masks are on the series' own grid already (evaluation inverts the preprocessing onto the input's voxels, in its
own axis order: :mod:`medseg.data.dicom`'s columns, rows and slices sorted by position), so frame ``k`` of each
segment is slice ``k`` of the series and references that image. highdicom (the ``dicom`` extra) writes a BINARY
segmentation with one segment per output (a foreground class, or a region: they may overlap), labelled with its name
from the dataset's labels or regions, in the study and frame of reference of the source series; a viewer (3D Slicer,
OHIF) opens it on that series. The source's type 2 patient and study attributes that a de-identified series lacks
are written empty (:data:`TYPE_2_SOURCE_ATTRIBUTES`). The object is written atomically.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from medseg.data.dicom import DicomSeries, is_series_folder, series_geometry
from medseg.data.labels import LabelSpec
from medseg.data.reading import source_name
from medseg.errors import DatasetError, PredictionError
from medseg.inference.cases import Case
from medseg.io import atomic_save
from medseg.version import __version__

SEG_ENDING = ".seg.dcm"
SERIES_NUMBER_OFFSET = 1000
"""A SEG's ``SeriesNumber`` is its source series' plus this (1000 for a source without one)."""
TYPE_2_SOURCE_ATTRIBUTES = ("PatientName", "PatientID", "PatientBirthDate", "PatientSex", "StudyDate", "StudyTime",
                            "StudyID", "AccessionNumber", "ReferringPhysicianName")
"""The patient and study attributes a SEG takes from its source series: type 2 (present, possibly empty), which
de-identified series often lack; written empty where the source has none, as the standard allows."""


def seg_path(output: Path, case: str) -> Path:
    """Where a case's DICOM-SEG goes: ``output/<case>.seg.dcm``."""
    return output / f"{case}{SEG_ENDING}"


def check_seg_inputs(cases: Sequence[Case], channel_names: Sequence[str]) -> None:
    """Refuse ``output_format=dicom_seg`` unless the model takes one channel and every case is one DICOM series: a SEG
    references the one series it segments.

    Raises:
        PredictionError: naming the model's channels, or the first case that is no DICOM series.
    """
    if len(channel_names) != 1:
        raise PredictionError(f"output_format=dicom_seg: the model takes {len(channel_names)} input channels "
                              f"({', '.join(channel_names)}); a DICOM-SEG is written onto one source series, for "
                              f"one-channel models only (choose output_format=nifti)")
    for case in cases:
        image = case.image_files[0]
        if len(case.image_files) != 1 or not (isinstance(image, DicomSeries) or (
                isinstance(image, str | Path) and is_series_folder(image))):
            raise PredictionError(f"output_format=dicom_seg: case {case.case} ({source_name(image)}) is not a DICOM "
                                  f"series; a DICOM-SEG is written onto the series it segments (choose "
                                  f"output_format=nifti)")


def write_dicom_seg(output: Path, case: Case, outputs: np.ndarray, labels: LabelSpec, model: str) -> Path:
    """Write a case's predicted ``outputs`` (:attr:`~medseg.inference.inferer.Prediction.outputs` of ``labels`` on
    the case's series grid (columns, rows, slices): ``(X, Y, Z)`` the winning class index, or ``(R, X, Y, Z)`` bool,
    one mask per region) as ``output/<case>.seg.dcm``, one segment per output; ``model`` names the checkpoint(s) in
    the object. Classes go to highdicom as the label map they are (each class index is its output's segment number),
    which makes one segment's mask of one slice at a time, not one mask of the whole scan per class.

    Raises:
        DatasetError: the series cannot be read (:func:`~medseg.data.dicom.series_geometry`), or ``outputs`` are not
            on its grid.
    """
    import highdicom as hd
    from pydicom.sr.codedict import codes

    source = case.image_files[0]
    datasets = series_geometry(source).datasets  # type: ignore[arg-type]  # check_seg_inputs: a series
    for dataset in datasets:  # read for this SEG alone: the source files are not changed
        for keyword in TYPE_2_SOURCE_ATTRIBUTES:
            if keyword not in dataset:
                setattr(dataset, keyword, "")
    grid = (int(datasets[0].Columns), int(datasets[0].Rows), len(datasets))
    shape = tuple(outputs.shape[1:] if labels.region_based else outputs.shape)
    if shape != grid:
        raise DatasetError(f"{source_name(source)}: masks of shape {shape} are not on the series' grid {grid}")
    algorithm = hd.AlgorithmIdentificationSequence(name="medseg", version=__version__,
                                                   family=codes.cid7162.ArtificialIntelligence)
    segments = [hd.seg.SegmentDescription(segment_number=number, segment_label=name[:64],
                                          segmented_property_category=codes.SCT.Tissue,
                                          segmented_property_type=codes.SCT.Tissue,
                                          algorithm_type=hd.seg.SegmentAlgorithmTypeValues.AUTOMATIC,
                                          algorithm_identification=algorithm)
                for number, name in labels.outputs.items()]
    series_number = int(datasets[0].get("SeriesNumber") or 0) + SERIES_NUMBER_OFFSET
    segmentation = hd.seg.Segmentation(
        source_images=datasets, pixel_array=np.transpose(outputs).astype(np.uint8),  # (slices, rows, columns[, R])
        segmentation_type=hd.seg.SegmentationTypeValues.BINARY, segment_descriptions=segments,
        series_instance_uid=hd.UID(), series_number=series_number, sop_instance_uid=hd.UID(), instance_number=1,
        manufacturer="medseg", manufacturer_model_name=model[:64], software_versions=__version__,
        device_serial_number="none", series_description=f"medseg {model}"[:64],
        omit_empty_frames=bool(outputs.any()))  # empty masks keep every frame (highdicom cannot omit them all)
    return atomic_save(seg_path(output, case.case), segmentation.save_as, SEG_ENDING)
