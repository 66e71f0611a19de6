"""Safetensors read one tensor at a time, and written as a stream.

A checkpoint can be far larger than RAM, so we never hold a whole file: the
index is built from the headers alone (validated against the file sizes, so a
truncated file is named before any work starts) and each tensor is read with
one `pread` when it is needed. Writing goes header first, then each tensor's
bytes as they are produced, into a temporary file renamed when complete.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from nightshift.engine.errors import ModelFormatError

# safetensors dtype name -> (mlx dtype, bytes per element).
DTYPES: dict[str, tuple[mx.Dtype, int]] = {
    "BF16": (mx.bfloat16, 2),
    "F16": (mx.float16, 2),
    "F32": (mx.float32, 4),
    "F64": (mx.float64, 8),
    "U8": (mx.uint8, 1),
    "I8": (mx.int8, 1),
    "U16": (mx.uint16, 2),
    "I16": (mx.int16, 2),
    "U32": (mx.uint32, 4),
    "I32": (mx.int32, 4),
    "U64": (mx.uint64, 8),
    "I64": (mx.int64, 8),
    "BOOL": (mx.bool_, 1),
    # fp8 has no mlx dtype: its bytes come through as uint8 (mx.from_fp8 reads them).
    "F8_E4M3": (mx.uint8, 1),
}
NAME_OF = {dtype: name for name, (dtype, _) in DTYPES.items() if name != "F8_E4M3"}
# Unsigned integer dtype of each width: the view numpy can hold any mlx dtype as.
_RAW = {1: mx.uint8, 2: mx.uint16, 4: mx.uint32, 8: mx.uint64}


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor's bytes lie in one safetensors file."""

    file: Path
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute offset in the file
    nbytes: int


def read_header(path: Path) -> list[TensorEntry]:
    """Entries of one safetensors file, checked against its size; errors name the file."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelFormatError(f"{path}: truncated safetensors file ({size} bytes, no header)")
            (header_len,) = struct.unpack("<Q", head)
            if header_len > size - 8:
                raise ModelFormatError(
                    f"{path}: truncated safetensors file (header of {header_len} bytes, file {size})"
                )
            header = json.loads(f.read(header_len))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFormatError(f"{path}: not a readable safetensors file ({exc})") from exc
    base = 8 + header_len
    entries = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        if dtype not in DTYPES:
            raise ModelFormatError(f"{path}: tensor {name} has dtype {dtype}, which nightshift cannot read")
        nbytes = math.prod(shape) * DTYPES[dtype][1]
        if end - begin != nbytes:
            raise ModelFormatError(f"{path}: tensor {name} claims shape {list(shape)} but holds {end - begin} bytes")
        if base + end > size:
            raise ModelFormatError(
                f"{path}: truncated safetensors file: tensor {name} ends at byte {base + end}, the file has {size}; "
                "download or copy the file again"
            )
        entries.append(TensorEntry(path, name, dtype, shape, base + begin, nbytes))
    return entries


class Checkpoint:
    """The tensors of a directory of safetensors files, from their headers (checked against the file sizes)."""

    def __init__(self, root: Path, pattern: str = "*.safetensors"):
        self.root = Path(root)
        self.files = sorted(self.root.glob(pattern))
        if not self.files:
            raise ModelFormatError(f"no {pattern} files in {self.root}")
        self.entries: dict[str, TensorEntry] = {}
        for file in self.files:
            for entry in read_header(file):
                if entry.name in self.entries:
                    raise ModelFormatError(f"tensor {entry.name} is in both {self.entries[entry.name].file} and {file}")
                self.entries[entry.name] = entry


def read_tensor(entry: TensorEntry) -> mx.array:
    dtype, itemsize = DTYPES[entry.dtype]
    with open(entry.file, "rb") as f:
        data = os.pread(f.fileno(), entry.nbytes, entry.start)
    if len(data) != entry.nbytes:
        raise ModelFormatError(f"{entry.file}: tensor {entry.name} is cut short (file changed while reading?)")
    raw = np.frombuffer(data, dtype=np.dtype(f"<u{itemsize}")).reshape(entry.shape)
    return mx.array(raw).view(dtype)


def to_bytes(array: mx.array) -> memoryview:
    """The bytes of `array` in row-major order (any dtype, bfloat16 included)."""
    array = mx.contiguous(array)
    raw = array.view(_RAW[array.dtype.size]) if array.dtype != mx.bool_ else array.view(mx.uint8)
    return memoryview(np.asarray(raw)).cast("B")


@dataclass(frozen=True)
class OutTensor:
    """A tensor about to be written: its header entry and how to produce its bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    produce: Callable[[], bytes | memoryview]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype][1]


def out_tensor(name: str, array: mx.array) -> OutTensor:
    """An `OutTensor` for an array already in memory."""
    return OutTensor(name, NAME_OF[array.dtype], tuple(array.shape), lambda: to_bytes(array))


def write_safetensors(path: Path, tensors: Iterable[OutTensor], metadata: dict[str, str] | None = None) -> int:
    """Write tensors to `path` (temp file, renamed when complete); returns the size written."""
    tensors = list(tensors)
    header: dict = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded)
        for t in tensors:
            data = t.produce()
            if len(data) != t.nbytes:
                raise ValueError(f"{t.name}: produced {len(data)} bytes, expected {t.nbytes}")
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return 8 + len(encoded) + offset


def copied_tensor(entry: TensorEntry) -> OutTensor:
    """An `OutTensor` whose bytes are copied from another safetensors file when written."""

    def produce() -> bytes:
        with open(entry.file, "rb") as f:
            return os.pread(f.fileno(), entry.nbytes, entry.start)

    return OutTensor(entry.name, entry.dtype, entry.shape, produce)
