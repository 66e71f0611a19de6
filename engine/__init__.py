"""nightshift's engine: the public API the app uses (and nothing else from engine/)."""

from engine.errors import (
    ModelFormatError,
    ModelNotFoundError,
    NightshiftError,
    NoSpaceError,
    UnsupportedModelError,
)
from engine.runtime import Chunk, GenerationStats, Model, open_model
from engine.io.drives import Drive, load_drives
from engine.store.gguf_import import convert_gguf, is_converted_from, sha256_of
from engine.store.importer import ImportOptions, Progress, import_checkpoint
from engine.store.manifest import Manifest, is_store, read_manifest
from engine.store.synth import FAMILIES as SYNTH_FAMILIES, synthesize
from engine.store.upkeep import BadFile, calibration_prompts, measure_routing, place_store, verify_store

__all__ = [
    "BadFile",
    "Drive",
    "ImportOptions",
    "Manifest",
    "Progress",
    "SYNTH_FAMILIES",
    "calibration_prompts",
    "import_checkpoint",
    "is_store",
    "load_drives",
    "measure_routing",
    "place_store",
    "read_manifest",
    "synthesize",
    "verify_store",
    "Chunk",
    "GenerationStats",
    "Model",
    "ModelFormatError",
    "ModelNotFoundError",
    "NightshiftError",
    "NoSpaceError",
    "UnsupportedModelError",
    "convert_gguf",
    "is_converted_from",
    "open_model",
    "sha256_of",
]
