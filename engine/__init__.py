"""nightshift's engine: the public API the app uses (and nothing else from engine/)."""

from engine.errors import (
    ModelFormatError,
    ModelNotFoundError,
    NightshiftError,
    NoSpaceError,
    UnsupportedModelError,
)
from engine.runtime import Chunk, GenerationStats, Model, open_model
from engine.store.gguf_import import convert_gguf, is_converted_from, sha256_of

__all__ = [
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
