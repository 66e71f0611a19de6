"""The store's manifest and its expert file format.

An expert file holds one expert's tensors (e.g. gate/up/down weight and scales)
back to back, each starting on a 4 KiB boundary, the file padded to a multiple of
8 KiB: so the whole file, or either half of it, is one direct-I/O read of whole
pages. The manifest (`manifest.json`, written last, atomically) says where every
tensor lies in that file, each file's checksum and which drives hold a replica;
a store without it is not a store (an import still running or interrupted).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nightshift.engine.errors import ModelFormatError, ModelNotFoundError

FORMAT = "nightshift-store"
VERSION = 1
MANIFEST = "manifest.json"
TRUNK = "trunk.safetensors"
IMPORT_STATE = "import-state.json"
ALIGN = 4096
FILE_ALIGN = 2 * ALIGN  # each half of a file is whole pages too


def human_size(n: float) -> str:
    """Bytes as people read them: 340 kB, 1.7 MB, 2.57 GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def align(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


@dataclass(frozen=True)
class TensorSlot:
    """One tensor of an expert: name under the expert module, dtype (safetensors name), shape, bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class MoeLayer:
    """The experts of one layer: where the module is, and the layout every expert file of it shares."""

    layer: int
    module: str
    num_experts: int
    file_bytes: int
    tensors: tuple[TensorSlot, ...]
    quantization: dict = field(default_factory=dict)

    @staticmethod
    def laid_out(
        layer: int, module: str, num_experts: int, tensors: list[tuple[str, str, tuple, int]], quantization: dict
    ) -> MoeLayer:
        """A layer whose expert tensors `(name, dtype, shape, nbytes)` are packed 4 KiB-aligned."""
        slots, offset = [], 0
        for name, dtype, shape, nbytes in tensors:
            slots.append(TensorSlot(name, dtype, tuple(shape), offset, nbytes))
            offset = align(offset + nbytes)
        return MoeLayer(layer, module, num_experts, align(offset, FILE_ALIGN), tuple(slots), quantization)


def expert_relpath(store: str, layer: int, expert: int) -> Path:
    """Where an expert file lies under a drive's root."""
    return Path(store) / f"L{layer:03d}" / f"E{expert:04d}.expert"


@dataclass
class Manifest:
    """Everything the store knows; `experts[layer][expert]` = {"sha256", "replicas": [drive names]}."""

    name: str
    config: dict
    trunk: dict
    drives: dict[str, str]  # drive name -> root
    layers: list[MoeLayer]
    experts: dict[int, list[dict]]
    source: dict = field(default_factory=dict)
    routing: dict = field(default_factory=dict)  # layer -> per-expert counts from calibration

    def layer(self, index: int) -> MoeLayer:
        return next(layer for layer in self.layers if layer.layer == index)

    def replica_paths(self, layer: int, expert: int) -> list[tuple[str, Path]]:
        """(drive, path) of every replica of one expert, in the manifest's order."""
        rel = expert_relpath(self.name, layer, expert)
        return [(d, Path(self.drives[d]) / rel) for d in self.experts[layer][expert]["replicas"]]

    @property
    def expert_bytes(self) -> int:
        """Bytes of one copy of every expert."""
        return sum(layer.file_bytes * layer.num_experts for layer in self.layers)

    def to_json(self) -> dict:
        data = asdict(self)
        data["experts"] = {str(k): v for k, v in self.experts.items()}
        data["routing"] = {str(k): v for k, v in self.routing.items()}
        return {"format": FORMAT, "version": VERSION, **data}

    @staticmethod
    def from_json(data: dict) -> Manifest:
        layers = [
            MoeLayer(
                **{**layer, "tensors": tuple(TensorSlot(**{**t, "shape": tuple(t["shape"])}) for t in layer["tensors"])}
            )
            for layer in data["layers"]
        ]
        return Manifest(
            name=data["name"],
            config=data["config"],
            trunk=data["trunk"],
            drives=data["drives"],
            layers=layers,
            experts={int(k): v for k, v in data["experts"].items()},
            source=data.get("source", {}),
            routing={int(k): v for k, v in data.get("routing", {}).items()},
        )


def write_json_atomic(path: Path, data: dict) -> None:
    """Write JSON to a temporary file, sync it and rename it over `path`. The temporary file is the writer's own
    (process and thread): two runs closing on one store at once (a routing profile) must not write into one file."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}.partial")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def is_store(path: Path) -> bool:
    """A store directory, complete or still being imported."""
    return (Path(path) / MANIFEST).is_file() or (Path(path) / IMPORT_STATE).is_file()


def read_manifest(store: Path) -> Manifest:
    """The manifest of the store at `store`; clear errors for incomplete or damaged stores."""
    store = Path(store)
    path = store / MANIFEST
    if not path.is_file():
        if (store / IMPORT_STATE).is_file():
            raise ModelFormatError(
                f"the import into {store} did not finish; run `nightshift model import` again with the same "
                "source and name to resume it"
            )
        raise ModelNotFoundError(f"no store at {store} ({MANIFEST} missing)")
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise ModelFormatError(f"{path} is not a nightshift store manifest")
        if data.get("version") != VERSION:
            raise ModelFormatError(
                f"{path}: store format version {data.get('version')}, this nightshift reads {VERSION}"
            )
        return Manifest.from_json(data)
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ModelFormatError(f"{path} is damaged ({exc!r}); import the model again") from exc


def write_manifest(store: Path, manifest: Manifest) -> None:
    write_json_atomic(Path(store) / MANIFEST, manifest.to_json())


def sha256_bytes(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()
