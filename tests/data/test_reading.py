"""The one image reader: raw files, RAS reading and back, cases, and the chain's loader against MONAI's own.

Expected values come from the generators of :mod:`tests.helpers.realistic`, which build every volume in RAS voxel
order and store it in another orientation, and from MONAI's ``LoadImaged`` + ``EnsureChannelFirstd`` +
``Orientationd(axcodes="RAS")`` + ``Spacingd`` chain, which the training chain used before the reader did.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from monai import transforms as mt

from medseg.data import reading
from medseg.data.datalist import load_dataset
from medseg.data.reading import (
    IMAGE,
    LABEL,
    ImageReadError,
    LoadCased,
    from_ras,
    read_case,
    read_file,
    read_ras,
)
from medseg.data.transforms import preprocessing
from medseg.errors import DatasetError
from tests.helpers.realistic import (
    mri_case,
    save_image,
    save_nifti,
    write_ct_dataset,
    write_dataset,
    write_sagittal_dataset,
    write_two_channel_dataset,
)

TARGET_SPACING = [1.0, 1.1, 1.5]
"""Resampling target of the chain comparison: unlike every stored spacing, so ``Spacingd`` really resamples."""


def monai_chain(spacing: list[float]) -> mt.Compose:
    """MONAI's own loading, channel-first, RAS reorientation and resampling of an (image, label) entry."""
    keys = [IMAGE, LABEL]
    return mt.Compose([
        mt.LoadImaged(keys=keys, image_only=False),
        mt.EnsureChannelFirstd(keys=keys),
        mt.Orientationd(keys=keys, axcodes="RAS"),
        mt.Spacingd(keys=keys, pixdim=spacing, mode=["bilinear", "nearest"], dtype=np.float32),  # as medseg resamples
    ])


DATASETS: dict[str, Callable[[Path], tuple[Path, str]]] = {
    "ct-lps-msd": lambda root: (write_ct_dataset(root, "msd", num_cases=1, shape=(40, 36, 12)), "msd"),
    "ct-pir-nnunet": lambda root: (write_ct_dataset(root, "nnunet", num_cases=1, shape=(40, 36, 12),
                                                    orientation="PIR"), "nnunet"),
    "sagittal-lps-msd": lambda root: (write_sagittal_dataset(root, "msd", num_cases=1), "msd"),
    "two-channel-asl-msd-4d": lambda root: (write_two_channel_dataset(root, "msd", num_cases=1,
                                                                      orientation="ASL"), "msd"),
    "two-channel-pir-nnunet": lambda root: (write_two_channel_dataset(root, "nnunet", num_cases=1,
                                                                      orientation="PIR"), "nnunet"),
}


@pytest.mark.parametrize("name", DATASETS)
def test_chain_loading_equals_monai_loading(name: str, tmp_path: Path) -> None:
    root, fmt = DATASETS[name](tmp_path / name)
    entry = load_dataset(root, fmt).training[0]
    expected = monai_chain(TARGET_SPACING)(dict(entry))
    ours = mt.Compose(preprocessing(TARGET_SPACING, "none"))(dict(entry))
    assert ours[IMAGE].dtype == expected[IMAGE].dtype == torch.float32
    assert not ours[LABEL].dtype.is_floating_point  # cached compactly (CompactLabeld)
    _assert_same_volumes(ours, expected)


def _assert_same_volumes(ours: dict, expected: dict) -> None:
    """Image and label equal to the last bit (the label's values, whatever its integer type), same affines."""
    for key in (IMAGE, LABEL):
        assert ours[key].shape == expected[key].shape
        assert torch.equal(ours[key].as_tensor().to(expected[key].dtype), expected[key].as_tensor()), key
        torch.testing.assert_close(ours[key].affine, expected[key].affine)


def test_chain_loading_equals_monai_loading_on_the_demo(tiny_demo_root: Path) -> None:
    entry = load_dataset(tiny_demo_root, "msd").training[0]
    assert nib.aff2axcodes(nib.load(entry[IMAGE]).affine) == ("L", "P", "S")
    expected = monai_chain(TARGET_SPACING)(dict(entry))
    _assert_same_volumes(mt.Compose(preprocessing(TARGET_SPACING, "none"))(dict(entry)), expected)


@pytest.mark.parametrize("orientation", ["RAS", "LPS", "PIR", "ASL", "SLP"])
def test_ras_reading_recovers_the_generated_voxels_and_goes_back(orientation: str, tmp_path: Path) -> None:
    ras = np.random.default_rng(0).integers(-1000, 3000, size=(7, 5, 3)).astype(np.int16)
    spacing = (0.7, 0.9, 4.0)
    path = save_nifti(tmp_path / "case.nii.gz", ras, spacing, orientation, origin=(10.0, -20.0, 5.0))
    image = read_ras(path)
    assert image.array.dtype == np.int16 and np.array_equal(image.array, ras)
    np.testing.assert_allclose(nib.affines.voxel_sizes(image.affine), spacing, rtol=1e-6)
    assert "".join(nib.aff2axcodes(image.affine)) == "RAS"
    assert "".join(nib.aff2axcodes(image.file_affine)) == orientation
    stored, affine = read_file(path)
    np.testing.assert_array_equal(affine, image.file_affine)
    assert np.array_equal(from_ras(image.array, image.file_affine), stored), "back to the file's voxel order"


def test_ras_affine_maps_each_voxel_to_the_same_world_point(tmp_path: Path) -> None:
    ras = np.arange(4 * 3 * 2, dtype=np.float32).reshape(4, 3, 2)
    path = save_nifti(tmp_path / "pir.nii.gz", ras, (0.5, 2.0, 3.0), "PIR", origin=(1.0, 2.0, 3.0))
    image = read_ras(path)
    stored, affine = read_file(path)
    for value in (0, 7, 23):
        (ras_index,), (file_index,) = np.argwhere(image.array == value), np.argwhere(stored == value)
        np.testing.assert_allclose(image.affine @ [*ras_index, 1], affine @ [*file_index, 1], atol=1e-5)


def test_read_case_gives_the_generated_case_from_msd_4d_and_nnunet_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    case = mri_case("mc_000", rng, (12, 10, 6), (0.6, 0.8, 3.0), contrasts=((0.5, 0.85), (0.7, 0.3)))
    for fmt in ("msd", "nnunet"):
        root = write_dataset(tmp_path / fmt, [case], ["T2", "ADC"], ["background", "structure"], fmt, "LIP")
        volume = read_case(load_dataset(root, fmt).training[0])
        assert volume.image.shape == (2, 12, 10, 6) and np.array_equal(volume.image, case.image)
        assert volume.label is not None and np.array_equal(volume.label, case.label)
        assert volume.spacing == pytest.approx(case.spacing) and volume.orientation == "LIP"


def test_size_one_axes_after_the_third_are_dropped_as_verification_does(tmp_path: Path) -> None:
    volume = np.arange(6 * 5 * 4, dtype=np.float32).reshape(6, 5, 4)
    image = save_nifti(tmp_path / "image.nii.gz", volume[..., None, None], (1.0, 1.0, 2.0), "LPS")
    label = save_nifti(tmp_path / "label.nii.gz", (volume > 50).astype(np.uint8)[..., None], (1.0, 1.0, 2.0), "LPS")
    case = read_case({"case": "c", IMAGE: str(image), LABEL: str(label)})
    assert case.image.shape == (1, 6, 5, 4) and np.array_equal(case.image[0], volume)
    assert case.label is not None and np.array_equal(case.label, volume > 50)


def test_read_file_keeps_the_dtype_and_other_formats_read_the_same(tmp_path: Path) -> None:
    label = np.zeros((6, 5, 4), np.uint8)
    label[1:3, 2:4, 1:3] = 2
    nifti = save_image(tmp_path / "label.nii.gz", label, (0.8, 0.8, 2.0), "LPS", origin=(3.0, 4.0, 5.0))
    array, affine = read_file(nifti)
    assert array.dtype == np.uint8 and array.shape == (6, 5, 4)
    np.testing.assert_array_equal(array, label[::-1, ::-1, :]), "stored LPS: R and A flipped"
    pytest.importorskip("nrrd", reason=".nrrd needs the formats extra: pip install 'medseg[formats]'")
    other, other_affine = read_file(save_image(tmp_path / "label.nrrd", label, (0.8, 0.8, 2.0), "LPS",
                                               origin=(3.0, 4.0, 5.0)))
    assert np.array_equal(other, array)
    np.testing.assert_allclose(other_affine, affine, atol=1e-6)


def test_unreadable_files_are_dataset_errors_naming_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ImageReadError, match=r"missing\.nii\.gz: file not found") as missing:
        read_file(tmp_path / "missing.nii.gz")
    assert isinstance(missing.value, DatasetError) and missing.value.reason == "file not found"
    copy = pickle.loads(pickle.dumps(missing.value))  # DataLoader workers send errors pickled
    assert (type(copy), str(copy), copy.reason) == (ImageReadError, str(missing.value), "file not found")
    save_nifti(tmp_path / "good.nii.gz", np.zeros((4, 4, 4), np.float32), (1.0, 1.0, 1.0))
    data = (tmp_path / "good.nii.gz").read_bytes()
    (tmp_path / "truncated.nii.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageReadError, match=r"truncated\.nii\.gz: cannot read file \(") as truncated:
        read_file(tmp_path / "truncated.nii.gz")
    assert truncated.value.__cause__ is not None, "the reader's own error is kept as the cause"
    (tmp_path / "case.mha").write_bytes(b"not an image")
    monkeypatch.setattr(reading.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImageReadError, match=r"case\.mha: cannot read file \(.*\); reading \.mha needs itk-io: "
                                             r"pip install 'medseg\[formats\]'"):
        read_file(tmp_path / "case.mha")


def test_corrupt_streams_and_unusable_voxels_are_refused_by_the_one_reader(tmp_path: Path) -> None:
    voxels = np.arange(20**3, dtype=np.float32).reshape(20, 20, 20)
    good = save_nifti(tmp_path / "good.nii.gz", voxels, (1.0, 1.0, 1.0))
    data = bytearray(good.read_bytes())
    data[-6] ^= 0xFF  # a byte of the gzip trailer's CRC: the voxels decompress intact
    (tmp_path / "crc.nii.gz").write_bytes(bytes(data))
    assert np.array_equal(np.asarray(nib.load(tmp_path / "crc.nii.gz").dataobj), voxels), "nibabel alone reads it"
    with pytest.raises(ImageReadError, match=r"crc\.nii\.gz: cannot read file \(BadGzipFile: CRC check failed"):
        read_file(tmp_path / "crc.nii.gz")
    np.testing.assert_array_equal(read_file(good)[0], voxels)
    voxels[0, 0, :3] = [np.nan, np.inf, -np.inf]
    nan = save_nifti(tmp_path / "nan.nii", voxels, (1.0, 1.0, 1.0))
    with pytest.raises(ImageReadError, match=r"nan\.nii: contains 1 NaN and 2 Inf voxels \(of 8000\)"):
        read_case({"case": "c", IMAGE: str(nan)})  # training, planning, evaluation and predict() read this way
    singular = np.diag([1.0, 0.0, 1.0, 1.0])
    for array, affine, reason in [
        (np.zeros((0, 4, 4), np.float32), np.eye(4), r"no voxels \(shape \(0, 4, 4\)\)"),
        (np.zeros((4, 4, 4), np.complex64), np.eye(4), "voxels of type complex64; expected numbers"),
        (np.zeros((4, 4, 4), np.float32), np.full((4, 4), np.nan), "affine is not finite"),
        (np.zeros((4, 4, 4), np.float32), singular, "affine is singular"),
    ]:
        with pytest.raises(ImageReadError, match=f"^the image in memory: .*{reason}"):
            read_file(nib.spatialimages.SpatialImage(array, affine))


def test_labels_that_are_not_whole_declared_values_are_refused(tmp_path: Path) -> None:
    image = save_nifti(tmp_path / "image.nii.gz", np.zeros((6, 5, 4), np.float32), (1.0, 1.0, 1.0))
    fractional = np.zeros((6, 5, 4), np.float32)
    fractional[0, 0, :2] = [0.5, 2.7]
    label = save_nifti(tmp_path / "label.nii.gz", fractional, (1.0, 1.0, 1.0))
    with pytest.raises(DatasetError, match=r"label\.nii\.gz: non-integer label values \(0\.5, 2\.7\); labels must"):
        read_case({"case": "c", IMAGE: str(image), LABEL: str(label)})  # rounded to 0 and 3 before
    whole = np.array([[[0.0, 1.0, 7.0]]])
    np.testing.assert_array_equal(reading.check_label_values(whole, "l.nii.gz"), [[[0, 1, 7]]])
    with pytest.raises(ImageReadError, match=r"^l\.nii\.gz: label values \(7\) are not in dataset\.json's labels "
                                             r"\(0 background, 1 organ\)$"):
        reading.check_label_values(whole, "l.nii.gz", {0: "background", 1: "organ"})


def test_bad_cases_are_dataset_errors_naming_the_file(tmp_path: Path) -> None:
    save_nifti(tmp_path / "flat.nii.gz", np.zeros((4, 4, 4, 2, 2), np.float32), (1.0, 1.0, 1.0))
    with pytest.raises(DatasetError, match=r"flat\.nii\.gz: expected a 3D image .* shape \(4, 4, 4, 2, 2\)"):
        read_ras(tmp_path / "flat.nii.gz")
    image = save_nifti(tmp_path / "image.nii.gz", np.zeros((6, 5, 4), np.float32), (1.0, 1.0, 1.0))
    short = save_nifti(tmp_path / "short.nii.gz", np.zeros((6, 5, 3), np.uint8), (1.0, 1.0, 1.0))
    with pytest.raises(DatasetError, match=r"short\.nii\.gz: label shape \(6, 5, 3\) \(RAS\) differs"):
        read_case({"case": "c", IMAGE: str(image), LABEL: str(short)})
    negative = save_nifti(tmp_path / "negative.nii.gz", -np.ones((6, 5, 4), np.int16), (1.0, 1.0, 1.0))
    with pytest.raises(DatasetError, match=r"negative\.nii\.gz: negative label values"):
        read_case({"case": "c", IMAGE: str(image), LABEL: str(negative)})
    with pytest.raises(DatasetError, match="case c: no label file"):
        LoadCased()({"case": "c", IMAGE: str(image)})


def test_loader_is_picklable_and_keeps_what_going_back_needs(tmp_path: Path) -> None:
    root = write_ct_dataset(tmp_path / "ct", "nnunet", num_cases=1, shape=(20, 16, 6), orientation="PIR")
    entry = load_dataset(root, "nnunet").training[0]
    loader = pickle.loads(pickle.dumps(LoadCased()))  # PersistentDataset and spawned workers pickle it
    data = loader(dict(entry))
    assert data[IMAGE].shape == (1, 20, 16, 6) and data[LABEL].shape == (1, 20, 16, 6)
    stored, affine = read_file(entry[IMAGE])
    np.testing.assert_array_equal(data[IMAGE].meta["original_affine"], affine)
    back = from_ras(data[IMAGE][0].numpy(), data[IMAGE].meta["original_affine"])
    np.testing.assert_array_equal(back, stored.astype(np.float32))
    image_only = LoadCased(with_label=False)(dict(entry))
    assert image_only[LABEL] == entry[LABEL], "without with_label the label path is left alone"


def _affine(spacing: tuple[float, float, float]) -> np.ndarray:
    """An LPS-flipped affine of ``spacing`` mm voxels at origin (10, -20, 5)."""
    affine = np.diag([-spacing[0], -spacing[1], spacing[2], 1.0])
    affine[:3, 3] = (10.0, -20.0, 5.0)
    return affine


def test_affine_tolerance_is_relative_to_voxel_size() -> None:
    fine, coarse = _affine((0.5, 0.5, 0.5)), _affine((5.0, 5.0, 5.0))
    shifted = np.array(coarse)
    shifted[0, 3] += 0.002  # 0.0004 voxels of 5 mm: within tolerance
    assert reading.affine_difference(coarse, shifted) is None
    shifted = np.array(fine)
    shifted[0, 3] += 0.002  # 0.004 voxels of 0.5 mm: beyond
    assert "origin" in reading.affine_difference(fine, shifted)
    assert "spacing" in reading.affine_difference(fine, _affine((0.5, 0.5, 0.6)))
    flipped = np.array(fine)
    flipped[0, 0] *= -1
    assert reading.affine_difference(fine, flipped).startswith("direction")
