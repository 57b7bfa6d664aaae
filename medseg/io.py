"""Crash-safe file writes: write to a temporary file beside the target, fsync, then rename atomically.

One mechanism (:func:`atomic_save`) serves bytes (:func:`atomic_write`), text, JSON and NIfTI images;
:func:`replaced_folder` does the same for a whole folder of outputs; :func:`json_safe` makes results strict JSON.

A process killed at any moment leaves either the old file or the new one, never a torn file; the temporaries it
leaves are removed by the next writer of the folder (:func:`remove_temporaries`, and :func:`replaced_folder` itself).
A full disk or quota is one :class:`~medseg.errors.NoSpaceError` naming the file, whose previous version is intact.
:func:`check_writable` lets a command find a folder it cannot write into before it does any work.
:func:`read_json_setting` reads the JSON file a setting names (a splits file, a plans file), refusing a Python pickle
(nnU-Net v1's format) with what to give instead.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import nibabel as nib
import numpy as np

from medseg.errors import ConfigError, NoSpaceError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync(path: Path) -> None:
    """Flush a file's or a folder's (a rename's) data to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


TEMP_NAME = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp")
"""The name of :func:`atomic_save`'s temp files: ``.<name>.<mkstemp's 8 characters>.tmp<ending>``."""


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
"""The errnos of a full disk and of a full quota."""


def _out_of_space(err: BaseException) -> bool:
    """Whether ``err``, or an error it was raised from or while handling, is a full disk or quota: an ``OSError``
    of :data:`NO_SPACE` (or the :class:`~medseg.errors.NoSpaceError` made of one), or the ``RuntimeError`` of torch's
    zip writer that names one (``torch.save`` to a path)."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, NoSpaceError) or isinstance(current, OSError) and current.errno in NO_SPACE:
            return True
        if isinstance(current, RuntimeError) and any(
                text in str(current) for text in ("No space left", "Disk quota exceeded", "errno 28")):
            return True
        current = current.__cause__ or current.__context__
    return False


def _no_space_error(path: Path, existed: bool) -> NoSpaceError:
    """The one error of a write into ``path`` that ran out of space (``existed``: a previous version was there)."""
    kept = "its previous version is intact" if existed else "nothing was written"
    return NoSpaceError(f"no space left writing {path}; {kept}")


def atomic_save(path: str | Path, save: Callable[[Path], Any], ending: str = "") -> Path:
    """Call ``save(temp_path)`` on a temp file in ``path``'s folder, fsync it, then rename it to ``path``.

    ``ending`` ends the temp file's name, for writers that choose the format by it (nibabel: ``.nii.gz``).

    Raises:
        NoSpaceError: the disk or quota is full (:func:`_out_of_space`); ``path`` is as it was, the temp file gone.
    """
    path = Path(path)
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{ending}", dir=path.parent)
        tmp = Path(name)
        try:
            try:
                os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes the file owner-only; give it normal permissions
            finally:
                os.close(fd)
            save(tmp)
            _fsync(tmp)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync(path.parent)
    except Exception as err:
        if _out_of_space(err):
            raise _no_space_error(path, existed) from None
        raise
    return path


def remove_temporaries(folder: Path) -> list[Path]:
    """Delete the temp files that :func:`atomic_save` left under ``folder`` when a process was killed mid-write, and
    return them. Only for a folder this process writes alone (a locked run folder, an evaluation's output): no other
    writer is mid-write there."""
    stale = [path for path in folder.rglob(".*.tmp*") if path.is_file() and TEMP_NAME.match(path.name)]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def check_writable(folder: str | Path, key: str) -> None:
    """Refuse a ``folder`` (config key ``key``) this process cannot write into, before any work: a file is created
    and removed (unnamed) in it, or in its nearest existing parent when it does not exist yet (it would be made
    there). Nothing stays behind.

    Raises:
        ConfigError: a part of the path is a file, or the folder is read-only (permissions, a read-only mount).
    """
    folder = Path(folder).expanduser()
    existing = next(path for path in (folder, *folder.parents) if path.exists())
    if not existing.is_dir():
        raise ConfigError(f"{key}: {existing} is a file, not a folder; give a folder to write into")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise ConfigError(f"{key}: cannot write into {existing} ({err.strerror or err}); give a folder you can "
                          f"write to") from None


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], Any]) -> Path:
    """Call ``write(fileobj)`` on a temp file in ``path``'s folder, fsync it, then rename it to ``path``."""

    def save(tmp: Path) -> None:
        with tmp.open("wb") as handle:
            write(handle)

    return atomic_save(path, save)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Atomically replace ``path`` with ``text`` (UTF-8)."""
    return atomic_write(path, lambda handle: handle.write(text.encode()))


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    """Atomically replace ``path`` with ``obj`` as indented JSON."""
    return atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


PICKLE_START = b"\x80"
"""The first byte of a Python pickle (protocol 2 and later), the format of nnU-Net v1's plans and splits files."""


def read_json_setting(path: str | Path, where: str, missing: str, pickled: str) -> Any:
    """The JSON content of the file at ``path``, which a setting names (``where``: ``data.splits=PATH``, ...).

    Raises:
        ConfigError: one line naming ``where``: no such file (``missing`` says what to do), a Python pickle
            (``pickled`` says which JSON file to give instead: nnU-Net v1 wrote its plans and splits as pickles, v2
            writes JSON), or a file that is not readable as JSON.
    """
    try:
        content = Path(path).expanduser().read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file{missing}") from None
    except OSError as err:
        raise ConfigError(f"{where}: not readable as JSON ({err})") from None
    if content.startswith(PICKLE_START):
        raise ConfigError(f"{where}: a Python pickle, as nnU-Net v1 wrote its files, not JSON; {pickled}")
    try:
        return json.loads(content)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{where}: not readable as JSON ({err})") from None


def json_safe(value: Any) -> Any:
    """NaN and inf become null (strict JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


def write_nifti(path: str | Path, array: np.ndarray, affine: np.ndarray,
                header: nib.Nifti1Header | None = None) -> Path:
    """Atomically write ``array`` (X, Y, Z[, ...]) as NIfTI, gzipped when ``path`` ends in ``.nii.gz``.

    Args:
        affine: ``(4, 4)`` voxel-to-world (RAS mm).
        header: a NIfTI-1 or -2 header to copy, e.g. the source image's, so the file lies exactly on its grid;
            its data type becomes ``array``'s, its scaling and display range are reset. Without one, the
            qform and sform are both ``affine`` (code 1, scanner).
    """
    if header is None:
        image = nib.Nifti1Image(array, affine)
        image.set_qform(affine, code=1)
        image.set_sform(affine, code=1)
    else:
        header = header.copy()
        header.set_data_dtype(array.dtype)
        header["cal_min"], header["cal_max"] = 0, 0  # the source's display range (nibabel resets its scaling)
        image_class = nib.Nifti2Image if isinstance(header, nib.Nifti2Header) else nib.Nifti1Image
        image = image_class(array, affine, header=header)
    ending = "".join(Path(path).suffixes[-2:])  # nibabel picks the format, and gzip, by the name's ending
    return atomic_save(path, lambda tmp: nib.save(image, tmp), ending)


def _recover_replacement(target: Path) -> None:
    """Finish or clear what a killed :func:`replaced_folder` left beside ``target``: its ``.<name>.<8>.tmp`` folder
    and, between its two renames, the old ``target`` moved aside as ``.<name>.<8>.old``. When ``target`` is
    missing, the folder that was to replace it is complete (the renames follow the block) and takes its place; the
    rest is removed."""
    if not target.parent.is_dir():
        return
    name = re.compile(rf"^\.{re.escape(target.name)}\.[a-z0-9_]{{8}}\.(tmp|old)$")
    leftovers = sorted(path for path in target.parent.iterdir() if path.is_dir() and name.match(path.name))
    for old in (path for path in leftovers if path.suffix == ".old" and not target.exists()):
        replacement = old.with_suffix(".tmp")
        (replacement if replacement.is_dir() else old).rename(target)
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def replaced_folder(target: str | Path) -> Iterator[Path]:
    """A temporary folder beside ``target`` that replaces it (two renames) when the block ends without an error;
    removed otherwise, leaving ``target`` as it was. The folder gets normal permissions (the umask's).

    What an earlier, killed call for the same ``target`` left beside it is recovered first
    (:func:`_recover_replacement`). A full disk in the block is a :class:`~medseg.errors.NoSpaceError`.
    """
    target = Path(target)
    _recover_replacement(target)
    existed = target.exists()
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    temp.chmod(0o777 & ~_umask())  # mkdtemp makes the folder owner-only
    try:
        yield temp
        old = temp.with_suffix(".old")
        if target.exists():
            target.rename(old)
        temp.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException as err:
        shutil.rmtree(temp, ignore_errors=True)
        if isinstance(err, Exception) and _out_of_space(err):  # named by the folder: a file in it is temporary
            raise _no_space_error(target, existed) from None
        raise
