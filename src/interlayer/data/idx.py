"""The IDX format of MNIST and Fashion-MNIST (LeCun et al.), read strictly; plain or gzip files.

Layout (big-endian throughout): two zero bytes, a type code (0x08 unsigned byte, 0x09 signed byte, 0x0B int16,
0x0C int32, 0x0D float32, 0x0E float64), the number of dimensions ``n``, then ``n`` uint32 sizes, then the data
in C order. Why strict: a truncated download decodes "fine" into fewer images, or shifts every image by a few
bytes, and the damage shows up as an accuracy nobody can explain. So a wrong magic number, an unknown type code,
a short header, missing or trailing data bytes and a broken gzip stream each raise :class:`DataError` naming the
file and the byte offset (in the decompressed stream) where the problem is.
"""
from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path
from typing import Union

import numpy as np

from ..errors import DataError

PathLike = Union[str, Path]
GZIP_MAGIC = b"\x1f\x8b"
# IDX type code -> numpy dtype (big-endian, as stored)
DTYPES: dict[int, np.dtype] = {0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"),
                               0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
CODES: dict[np.dtype, int] = {dtype.newbyteorder("="): code for code, dtype in DTYPES.items()}


def _read_bytes(path: Path) -> bytes:
    """The file's content, decompressed when it starts with the gzip magic (whatever its name)."""
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    data = path.read_bytes()
    if not data.startswith(GZIP_MAGIC):
        return data
    return _gunzip(data, path)


def _gunzip(data: bytes, path: Path) -> bytes:
    """Decompress every gzip member; a cut or corrupt stream names the offsets where it broke."""
    out = bytearray()
    rest = data
    while rest:
        stream = zlib.decompressobj(wbits=31)
        try:
            out += stream.decompress(rest)
        except zlib.error as err:
            raise DataError(f"{path}: corrupt gzip data ({err}) after {len(out)} decompressed bytes; download the "
                            "file again") from None
        if not stream.eof:
            raise DataError(f"{path}: compressed offset {len(data)}: the gzip stream ends early (truncated file) "
                            f"after {len(out)} decompressed bytes; download the file again")
        rest = stream.unused_data
    return bytes(out)


def parse_idx(data: bytes, source: str) -> np.ndarray:
    """Decode IDX bytes into an array of the stored type (native byte order); errors name ``source``."""
    if len(data) < 4:
        raise DataError(f"{source}: {len(data)} bytes, too short for the 4-byte IDX magic number")
    if data[0] != 0 or data[1] != 0:
        raise DataError(f"{source}: offset 0: IDX files start with two zero bytes, found {data[:2].hex()} (magic "
                        f"number 0x{data[:4].hex()}); this is not an IDX file")
    code, ndim = data[2], data[3]
    if code not in DTYPES:
        raise DataError(f"{source}: offset 2: unknown IDX type code 0x{code:02x}; valid codes: "
                        f"{', '.join(f'0x{c:02x}' for c in DTYPES)}")
    if ndim == 0:
        raise DataError(f"{source}: offset 3: the header declares 0 dimensions")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{source}: offset {len(data)}: header truncated; {ndim} dimensions need {header} header "
                        f"bytes, the file has {len(data)}")
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    dtype = DTYPES[code]
    # Python integers: numpy's int64 product of four uint32 sizes can overflow to a negative byte count
    expected = math.prod(shape) * dtype.itemsize
    present = len(data) - header
    if present < expected:
        hint = "" if expected < 2 * max(present, 1) else " (a corrupt header, or not this kind of file)"
        raise DataError(f"{source}: offset {len(data)}: data truncated; shape {shape} of {dtype.name} needs "
                        f"{expected} bytes after the {header}-byte header, the file has {present} "
                        f"({expected - present} missing){hint}")
    if present > expected:
        raise DataError(f"{source}: offset {header + expected}: {present - expected} unexpected trailing bytes "
                        f"after the data of shape {shape}")
    values = np.frombuffer(data, dtype=dtype, count=expected // dtype.itemsize, offset=header)
    return values.reshape(shape).astype(dtype.newbyteorder("="))


def read_idx(path: PathLike) -> np.ndarray:
    """Read one IDX file (gzip detected by its magic bytes, not its name)."""
    path = Path(path)
    return parse_idx(_read_bytes(path), str(path))


def encode_idx(array: np.ndarray) -> bytes:
    """The IDX bytes of ``array`` (one of the six IDX types); the inverse of :func:`parse_idx`."""
    dtype = array.dtype.newbyteorder("=")
    if dtype not in CODES:
        raise ValueError(f"IDX cannot store {array.dtype}; types: {', '.join(d.name for d in CODES)}")
    code = CODES[dtype]
    header = bytes([0, 0, code, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    return header + np.ascontiguousarray(array, dtype=DTYPES[code]).tobytes()


def write_idx(path: PathLike, array: np.ndarray) -> None:
    """Write ``array`` as IDX; gzip-compressed (reproducibly, no timestamp) when the name ends in ``.gz``."""
    path = Path(path)
    data = encode_idx(array)
    path.write_bytes(gzip.compress(data, compresslevel=9, mtime=0) if path.suffix == ".gz" else data)


def read_labelled_images(images_path: PathLike, labels_path: PathLike) -> tuple[np.ndarray, np.ndarray]:
    """An image file ``(N, H, W)`` or ``(N, C, H, W)`` of unsigned bytes and its label file ``(N,)``.

    Returns images as ``(N, C, H, W)`` uint8 and labels as int64; counts, types and label values are checked.
    """
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.dtype != np.uint8 or images.ndim not in (3, 4):
        raise DataError(f"{images_path}: expected unsigned-byte images of shape (N, H, W) or (N, C, H, W), got "
                        f"{images.dtype} of shape {images.shape}")
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise DataError(f"{labels_path}: expected one integer label per image (shape (N,)), got {labels.dtype} of "
                        f"shape {labels.shape}")
    if len(images) != len(labels):
        raise DataError(f"{images_path} holds {len(images)} images but {labels_path} holds {len(labels)} labels; "
                        "they must come in pairs")
    if len(labels) and labels.min() < 0:
        first = int(np.argmin(labels))
        raise DataError(f"{labels_path}: label {int(labels[first])} of example {first} is negative")
    if images.ndim == 3:
        images = images[:, None]
    return images, labels.astype(np.int64)
