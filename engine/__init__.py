"""nightshift's engine: the public API the app uses (and nothing else from engine/)."""

# First, before anything imports MLX: route its float matmuls to the system BLAS where there is one.
from engine.cpu_blas import BLAS_IN_USE  # noqa: I001

from engine.errors import (
    ModelFormatError,
    ModelNotFoundError,
    NightshiftError,
    NoSpaceError,
    UnsupportedModelError,
)
from engine.bench.fio import FioError, compare_with_fio
from engine.bench.probe import QUEUE_DEPTHS, READ_SIZES, probe_drive
from engine.bench.rig import RigError, RigSpec, RigState, inside_rig, rig_command, rig_down, rig_limit, rig_status, rig_up
from engine.instruments.monitor import DriveMonitor
from engine.io.ceilings import CEILINGS_FILE, Ceilings
from engine.io.counters import DriveReadCounters
from engine.io.devices import DeviceNotFoundError, resolve_device
from engine.io.drives import Drive, DrivesFileError, load_drives
from engine.runtime import Chunk, GenerationStats, Model, open_model
from engine.speculative import DraftError, DraftStats, record_best_depth
from engine.store.drafter import make_drafter
from engine.prefill import DEFAULT_CHUNK
from engine.moe.settings import CACHE_POLICIES, DISPATCH_POLICIES, StreamSettings
from engine.moe.reader import ExpertReadError
from engine.bench.layout import replicate_everywhere
from engine.bench.draft import best_depth, draft_sweep
from engine.bench.prefill import prefill_bench
from engine.bench.decode import decode_bench, first_difference, greedy_of_record, ladder as decode_ladder
from engine.instruments.assertions import AssertionFailed, Proof, require as require_proofs
from engine.instruments.catalogue import Catalogue, CatalogueError, Run, compare as compare_runs
from engine.store.gguf_import import convert_gguf, is_converted_from, require_free_space, sha256_of
from engine.store.importer import ImportOptions, Progress, import_checkpoint
from engine.store.moefy import DEFAULT_EXPERTS, DEFAULT_K, moefy
from engine.store.manifest import Manifest, is_store, read_manifest
from engine.store.synth import FAMILIES as SYNTH_FAMILIES, synthesize
from engine.store.upkeep import BadFile, calibration_prompts, measure_routing, place_store, verify_store

__all__ = [
    "DEFAULT_CHUNK",
    "BLAS_IN_USE",
    "BadFile",
    "ImportOptions",
    "Manifest",
    "Progress",
    "SYNTH_FAMILIES",
    "DEFAULT_EXPERTS",
    "DEFAULT_K",
    "moefy",
    "calibration_prompts",
    "import_checkpoint",
    "is_store",
    "measure_routing",
    "place_store",
    "read_manifest",
    "require_free_space",
    "synthesize",
    "verify_store",
    "CEILINGS_FILE",
    "Ceilings",
    "DeviceNotFoundError",
    "Drive",
    "DriveMonitor",
    "DriveReadCounters",
    "DrivesFileError",
    "FioError",
    "QUEUE_DEPTHS",
    "READ_SIZES",
    "RigError",
    "RigSpec",
    "RigState",
    "compare_with_fio",
    "inside_rig",
    "load_drives",
    "probe_drive",
    "resolve_device",
    "rig_command",
    "rig_down",
    "rig_limit",
    "rig_status",
    "rig_up",
    "CACHE_POLICIES",
    "DISPATCH_POLICIES",
    "ExpertReadError",
    "AssertionFailed",
    "Catalogue",
    "CatalogueError",
    "Proof",
    "require_proofs",
    "Run",
    "compare_runs",
    "decode_bench",
    "prefill_bench",
    "best_depth",
    "draft_sweep",
    "decode_ladder",
    "first_difference",
    "greedy_of_record",
    "replicate_everywhere",
    "StreamSettings",
    "Chunk",
    "DraftError",
    "DraftStats",
    "make_drafter",
    "record_best_depth",
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
