"""Crash-safe writes: NIfTI onto a source image's grid and header, by ending, and nothing torn or left behind; a full
disk as one error with the old file intact; what a killed folder replacement left, recovered; unwritable folders
refused before any work."""

from __future__ import annotations

import errno
import gzip
import os
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from medseg.errors import ConfigError, NoSpaceError
from medseg.io import atomic_save, atomic_write, atomic_write_json, check_writable, replaced_folder, write_nifti
from tests.helpers.read_only import read_only_mount

AFFINE = np.array([[0.0, 0.0, 2.0, -10.0], [-0.7, 0.0, 0.0, 20.0], [0.0, -0.7, 0.0, 5.0], [0.0, 0.0, 0.0, 1.0]])
"""An oblique-free PIR-like affine with a non-zero origin."""


def source_image(path: Path, image_class: type = nib.Nifti1Image) -> nib.Nifti1Image:
    """A float CT-like file whose header carries scaling, a description and non-default form codes."""
    image = image_class(np.arange(60, dtype=np.int16).reshape(3, 4, 5), AFFINE)
    image.header["descrip"] = b"scanner 7"
    image.header.set_slope_inter(2.0, -1024.0)
    image.header["cal_min"], image.header["cal_max"] = -1000, 1000
    image.set_qform(AFFINE, code=2)
    image.set_sform(AFFINE, code=4)
    nib.save(image, path)
    return nib.load(path)


@pytest.mark.parametrize("image_class", [nib.Nifti1Image, nib.Nifti2Image])
def test_label_map_takes_the_source_grid_and_header(image_class: type, tmp_path: Path) -> None:
    source = source_image(tmp_path / "ct.nii.gz", image_class)
    labels = (np.arange(60).reshape(3, 4, 5) % 3).astype(np.uint8)
    written = nib.load(write_nifti(tmp_path / "out" / "ct.nii.gz", labels, source.affine, source.header))
    assert type(written) is image_class
    assert written.get_data_dtype() == np.uint8 and written.shape == source.shape
    np.testing.assert_array_equal(np.asarray(written.dataobj), labels)
    np.testing.assert_array_equal(written.affine, source.affine)
    assert written.header["descrip"] == b"scanner 7"
    assert (int(written.header["qform_code"]), int(written.header["sform_code"])) == (2, 4)
    assert (written.dataobj.slope, written.dataobj.inter) == (1.0, 0.0), "the source's scaling is not kept"
    assert (written.header["cal_min"], written.header["cal_max"]) == (0, 0)


def test_without_header_both_forms_are_the_affine_and_the_ending_picks_gzip(tmp_path: Path) -> None:
    volume = np.random.default_rng(0).random((4, 3, 2)).astype(np.float32)
    for name in ("image.nii.gz", "image.nii"):
        written = nib.load(write_nifti(tmp_path / name, volume, AFFINE))
        np.testing.assert_array_equal(written.get_fdata(dtype=np.float32), volume)
        np.testing.assert_allclose(written.get_qform(), AFFINE, atol=1e-6)
        np.testing.assert_allclose(written.get_sform(), AFFINE, atol=1e-6)
        assert (int(written.header["qform_code"]), int(written.header["sform_code"])) == (1, 1)
    assert (tmp_path / "image.nii.gz").read_bytes()[:2] == b"\x1f\x8b", "gzip magic"
    with gzip.open(tmp_path / "image.nii.gz") as handle:
        assert handle.read() == (tmp_path / "image.nii").read_bytes(), "the same NIfTI, compressed"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["image.nii", "image.nii.gz"], "no temp files left"


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "pred.nii.gz"
    target.write_bytes(b"old")

    def half_then_crash(tmp: Path) -> None:
        assert tmp.name.endswith(".tmp.nii.gz") and tmp.parent == tmp_path
        tmp.write_bytes(b"half a fi")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_save(target, half_then_crash, ".nii.gz")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["pred.nii.gz"]


def _disk_full_after(written: int):
    """A writer for :func:`atomic_write` that writes ``written`` bytes, then finds the disk full."""

    def write(handle) -> None:
        handle.write(b"x" * written)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    return write


def test_a_full_disk_is_one_error_naming_the_file_and_the_previous_version_stays(tmp_path: Path) -> None:
    target = atomic_write_json(tmp_path / "summary.json", {"old": True})
    with pytest.raises(NoSpaceError, match=rf"^no space left writing {target}; its previous version is intact$"):
        atomic_write(target, _disk_full_after(10))
    assert target.read_text() == '{\n  "old": true\n}\n'
    with pytest.raises(NoSpaceError, match=r"new\.json; nothing was written$"):
        atomic_write(tmp_path / "new.json", _disk_full_after(0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"], "no temp file left"


def test_a_full_disk_in_a_replaced_folder_names_the_folder_and_keeps_it(tmp_path: Path) -> None:
    target = tmp_path / "export"
    target.mkdir()
    (target / "model.pt").write_text("old")
    with (pytest.raises(NoSpaceError, match=rf"^no space left writing {target}; its previous version is intact$"),
          replaced_folder(target) as folder):
        atomic_write(folder / "model.pt", _disk_full_after(5))
    assert (target / "model.pt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_a_replacement_killed_midway_is_finished_or_cleared_by_the_next_one(tmp_path: Path) -> None:
    target = tmp_path / "crossval"
    unfinished = tmp_path / ".crossval.k3j_9x2q.tmp"  # killed in the block: incomplete, removed
    (unfinished / "predictions").mkdir(parents=True)
    moved_aside, complete = tmp_path / ".crossval.ab12cd34.old", tmp_path / ".crossval.ab12cd34.tmp"
    for folder, text in ((moved_aside, "old"), (complete, "new")):  # killed between the two renames
        folder.mkdir()
        (folder / "summary.json").write_text(text)
    kept = [tmp_path / ".crossval.old", tmp_path / ".other.ab12cd34.tmp", tmp_path / "job_0"]
    for folder in kept:
        folder.mkdir()
    with replaced_folder(target) as folder:
        assert (target / "summary.json").read_text() == "new", "the complete replacement took its place"
        (folder / "summary.json").write_text("newest")
    assert (target / "summary.json").read_text() == "newest"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["crossval", *(p.name for p in kept)])


def test_check_writable_refuses_a_path_through_a_file_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=rf"^output: {tmp_path / 'notes.txt'} is a file, not a folder"):
        check_writable(tmp_path / "notes.txt" / "out", "output")
    check_writable(tmp_path / "new" / "out", "output")  # made later, in a writable folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_check_writable_refuses_a_read_only_mount_whose_permissions_allow_writing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mount = tmp_path / "mount"
    mount.mkdir()
    read_only_mount(monkeypatch, mount)
    assert os.access(mount, os.W_OK)
    with pytest.raises(ConfigError, match=rf"^output: cannot write into {mount} \(Read-only file system\)"):
        check_writable(mount / "out", "output")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_check_writable_refuses_a_read_only_folder(tmp_path: Path) -> None:
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    try:
        with pytest.raises(ConfigError, match=rf"^output: cannot write into {read_only} \(Permission denied\)"):
            check_writable(read_only / "out", "output")
    finally:
        read_only.chmod(0o755)
