"""nightshift's engine: the public API the app uses (and nothing else from engine/)."""

# First, before anything imports MLX: route its float matmuls to the system BLAS where there is one.
from nightshift.engine.cpu_blas import BLAS_IN_USE  # noqa: I001

from nightshift.engine.errors import (
    ModelFormatError,
    ModelNotFoundError,
    NightshiftError,
    NoSpaceError,
    UnsupportedModelError,
)
from nightshift.engine.bench.fio import FioError, compare_with_fio
from nightshift.engine.bench.probe import QUEUE_DEPTHS, READ_SIZES, probe_drive
from nightshift.engine.bench.rig import (
    RigError,
    RigSpec,
    RigState,
    inside_rig,
    rig_command,
    rig_down,
    rig_limit,
    rig_status,
    rig_up,
)
from nightshift.engine.instruments.monitor import DriveMonitor
from nightshift.engine.io.ceilings import CEILINGS_FILE, Ceilings
from nightshift.engine.io.counters import DriveReadCounters
from nightshift.engine.io.devices import DeviceNotFoundError, resolve_device
from nightshift.engine.io.drives import Drive, DrivesFileError, load_drives
from nightshift.engine.runtime import Chunk, GenerationStats, Model, open_model
from nightshift.engine.speculative import DraftError, DraftStats, record_best_depth
from nightshift.engine.store.drafter import make_drafter
from nightshift.engine.prefill import DEFAULT_CHUNK
from nightshift.engine.moe.settings import (
    CACHE_POLICIES,
    DISPATCH_POLICIES,
    FIRST_REPLICA,
    FREQUENCY,
    LEAST_COMPLETION,
    LRU,
    StreamSettings,
)
from nightshift.engine.moe.reader import ExpertReadError
from nightshift.engine.bench.layout import replicate_everywhere
from nightshift.engine.bench.draft import best_depth, draft_sweep
from nightshift.engine.bench.prefill import prefill_bench
from nightshift.engine.bench.decode import decode_bench, first_difference, greedy_of_record, ladder as decode_ladder
from nightshift.engine.instruments.assertions import AssertionFailed, Proof, require as require_proofs
from nightshift.engine.instruments.catalogue import Catalogue, CatalogueError, Run, compare as compare_runs
from nightshift.engine.store.gguf_import import convert_gguf, is_converted_from, require_free_space, sha256_of
from nightshift.engine.store.importer import ImportOptions, Progress, import_checkpoint
from nightshift.engine.store.moefy import DEFAULT_EXPERTS, DEFAULT_K, moefy
from nightshift.engine.store.manifest import Manifest, is_store, read_manifest
from nightshift.engine.store.synth import FAMILIES as SYNTH_FAMILIES, synthesize
from nightshift.engine.store.upkeep import BadFile, calibration_prompts, measure_routing, place_store, verify_store

__all__ = [
    "BLAS_IN_USE",
    "CACHE_POLICIES",
    "CEILINGS_FILE",
    "DEFAULT_CHUNK",
    "DEFAULT_EXPERTS",
    "DEFAULT_K",
    "DISPATCH_POLICIES",
    "FIRST_REPLICA",
    "FREQUENCY",
    "LEAST_COMPLETION",
    "LRU",
    "QUEUE_DEPTHS",
    "READ_SIZES",
    "SYNTH_FAMILIES",
    "AssertionFailed",
    "BadFile",
    "Catalogue",
    "CatalogueError",
    "Ceilings",
    "Chunk",
    "DeviceNotFoundError",
    "DraftError",
    "DraftStats",
    "Drive",
    "DriveMonitor",
    "DriveReadCounters",
    "DrivesFileError",
    "ExpertReadError",
    "FioError",
    "GenerationStats",
    "ImportOptions",
    "Manifest",
    "Model",
    "ModelFormatError",
    "ModelNotFoundError",
    "NightshiftError",
    "NoSpaceError",
    "Progress",
    "Proof",
    "RigError",
    "RigSpec",
    "RigState",
    "Run",
    "StreamSettings",
    "UnsupportedModelError",
    "best_depth",
    "calibration_prompts",
    "compare_runs",
    "compare_with_fio",
    "convert_gguf",
    "decode_bench",
    "decode_ladder",
    "draft_sweep",
    "first_difference",
    "greedy_of_record",
    "import_checkpoint",
    "inside_rig",
    "is_converted_from",
    "is_store",
    "load_drives",
    "make_drafter",
    "measure_routing",
    "moefy",
    "open_model",
    "place_store",
    "prefill_bench",
    "probe_drive",
    "read_manifest",
    "record_best_depth",
    "replicate_everywhere",
    "require_free_space",
    "require_proofs",
    "resolve_device",
    "rig_command",
    "rig_down",
    "rig_limit",
    "rig_status",
    "rig_up",
    "sha256_of",
    "synthesize",
    "verify_store",
]
