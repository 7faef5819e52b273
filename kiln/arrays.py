""".npy and .npz files read as data, with every claim checked before anything is allocated.

An .npy header states a dtype and a shape; NumPy allocates what the header claims and then reads.
A header claiming 2**40 elements in a 1 KB file is a MemoryError (or a machine swapping) before
the short read is noticed. Here the claimed size must equal the bytes the file actually holds,
object dtypes are refused (no pickle), and only regular files are opened (a FIFO or a device is
refused, never read until memory runs out).
"""

from __future__ import annotations

import io
import math
import os
import zipfile
from typing import IO

import numpy as np

from kiln import integrity
from kiln.errors import KilnError

MAX_HEADER = 1 << 16  # bytes of .npy header NumPy itself would accept by default (10,000) and a margin
MAX_MEMBERS = 1 << 16


class ArrayFileError(KilnError):
    """A file that is not an .npy/.npz kiln can read as plain arrays (the message says why)."""


def read_npy(handle: IO[bytes], available: int, what: str) -> np.ndarray:
    """The array in ``handle`` (positioned at an .npy's magic), whose file holds ``available``
    bytes from there. Raises ArrayFileError when the header is not one, asks for objects, or
    claims a size other than the bytes present."""
    start = handle.tell()
    try:
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, _fortran, dtype = np.lib.format.read_array_header_1_0(handle, max_header_size=MAX_HEADER)
        elif version == (2, 0):
            shape, _fortran, dtype = np.lib.format.read_array_header_2_0(handle, max_header_size=MAX_HEADER)
        else:
            raise ArrayFileError(f"{what}: .npy format version {version} (kiln reads 1.0 and 2.0)")
    except ArrayFileError:
        raise
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as err:
        raise ArrayFileError(f"{what}: not an .npy array ({err})") from None
    if dtype.hasobject:
        raise ArrayFileError(f"{what}: holds Python objects (kiln reads only plain arrays, never pickles)")
    if not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ArrayFileError(f"{what}: header shape {shape} is not a shape")
    claimed = math.prod(shape) * dtype.itemsize
    present = available - (handle.tell() - start)
    if claimed != present:
        raise ArrayFileError(
            f"{what}: the header claims {dtype} {list(shape)} ({claimed} bytes) but the file holds {present}"
        )
    handle.seek(start)
    try:
        return np.lib.format.read_array(handle, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise ArrayFileError(f"{what}: not an .npy array ({err})") from None


def load_npy(path: str | os.PathLike) -> np.ndarray:
    """The array of an .npy file (a regular file only). Raises ArrayFileError, or OSError when it
    cannot be opened."""
    try:
        handle = integrity.open_regular(path, ".npy file")
    except integrity.IrregularFile as err:
        raise ArrayFileError(str(err)) from None
    with handle:
        return read_npy(handle, os.fstat(handle.fileno()).st_size, str(path))


def load_npz(source: str | os.PathLike | bytes) -> dict[str, np.ndarray]:
    """Every array of an .npz (a path to a regular file, or its bytes), by member name without
    ``.npy``. Raises ArrayFileError."""
    what = "the .npz data" if isinstance(source, bytes) else str(source)
    try:
        handle: IO[bytes] = (
            io.BytesIO(source) if isinstance(source, bytes) else integrity.open_regular(source, ".npz file")
        )
    except integrity.IrregularFile as err:
        raise ArrayFileError(str(err)) from None
    arrays: dict[str, np.ndarray] = {}
    try:
        with handle, zipfile.ZipFile(handle) as archive:
            infos = archive.infolist()
            if len(infos) > MAX_MEMBERS:
                raise ArrayFileError(f"{what}: {len(infos)} members")
            for info in infos:
                if info.compress_type != zipfile.ZIP_STORED and info.file_size > (1 << 20) + 1000 * info.compress_size:
                    raise ArrayFileError(f"{what}: {info.filename} claims to inflate to {info.file_size} bytes")
                with archive.open(info) as member:
                    data = member.read(info.file_size + 1)
                if len(data) != info.file_size:
                    raise ArrayFileError(f"{what}: {info.filename} is not the size its entry claims")
                arrays[info.filename.removesuffix(".npy")] = read_npy(
                    io.BytesIO(data), len(data), f"{what}: {info.filename}"
                )
    except ArrayFileError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError) as err:
        raise ArrayFileError(f"{what}: not an .npz archive ({err})") from None
    return arrays
