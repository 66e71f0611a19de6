"""nightshift's engine: the public API the app uses (and nothing else from engine/).

Names load on first use (PEP 562 `__getattr__`), so `from nightshift.engine import NightshiftError`
costs nothing while `open_model` brings in MLX and mlx-lm only when a command needs them.
"""

import importlib
import sys


class _SystemBlasBeforeMlx:
    """Runs cpu_blas (an OpenBLAS for MLX's float matmuls) just before `mlx` is first imported, by anyone.

    cpu_blas must run before MLX loads. Every MLX import in nightshift sits in a module under this package,
    so this __init__ has run and put this finder first on sys.meta_path, which the import system asks about
    `mlx` before loading it. Commands that never use MLX load no BLAS. (A finder by protocol: subclassing
    importlib.abc.MetaPathFinder would import importlib.abc, ~20 ms.)
    """

    def find_spec(self, name: str, path=None, target=None) -> None:
        if name == "mlx":
            importlib.import_module(f"{__name__}.cpu_blas")
        return None  # the regular finders load the module


sys.meta_path.insert(0, _SystemBlasBeforeMlx())

# public name -> "module under engine/" or "module:attribute" where the public name differs.
_EXPORTS: dict[str, str] = {
    "AUTO_BUDGET": "moe.settings",
    "BLAS_IN_USE": "cpu_blas",
    "CACHE_POLICIES": "moe.settings",
    "CEILINGS_FILE": "io.ceilings",
    "DEFAULT_CHUNK": "prefill",
    "DEFAULT_EXPERTS": "store.moefy_defaults",
    "DEFAULT_K": "store.moefy_defaults",
    "DISPATCH_POLICIES": "moe.settings",
    "FIRST_REPLICA": "moe.settings",
    "FREQUENCY": "moe.settings",
    "LEAST_COMPLETION": "moe.settings",
    "LRU": "moe.settings",
    "QUEUE_DEPTHS": "bench.probe",
    "READ_SIZES": "bench.probe",
    "SLOW_BLAS": "cpu_blas",
    "SYNTH_FAMILIES": "store.synth:FAMILIES",
    "AssertionFailed": "instruments.assertions",
    "BadFile": "store.upkeep",
    "Catalogue": "instruments.catalogue",
    "CatalogueError": "instruments.catalogue",
    "Ceilings": "io.ceilings",
    "Chunk": "runtime",
    "DeviceNotFoundError": "io.devices",
    "DraftError": "speculative",
    "DraftStats": "speculative",
    "Drive": "io.drives",
    "DriveMonitor": "instruments.monitor",
    "DriveReadCounters": "io.counters",
    "DrivesFileError": "io.drives",
    "ExpertReadError": "moe.reader",
    "FioError": "bench.fio",
    "GenerationStats": "runtime",
    "ImportOptions": "store.importer",
    "Manifest": "store.manifest",
    "Model": "runtime",
    "ModelFormatError": "errors",
    "ModelNotFoundError": "errors",
    "NightshiftError": "errors",
    "NoSpaceError": "errors",
    "Progress": "store.importer",
    "Proof": "instruments.assertions",
    "RigError": "bench.rig",
    "RigSpec": "bench.rig",
    "RigState": "bench.rig",
    "Run": "instruments.catalogue",
    "StreamSettings": "moe.settings",
    "describe_budget": "moe.settings",
    "parse_budget": "moe.settings",
    "UnsupportedModelError": "errors",
    "best_depth": "bench.draft",
    "calibration_prompts": "store.upkeep",
    "compare_runs": "instruments.catalogue:compare",
    "compare_with_fio": "bench.fio",
    "convert_gguf": "store.gguf_import",
    "decode_bench": "bench.decode",
    "decode_ladder": "bench.decode:ladder",
    "draft_sweep": "bench.draft",
    "first_difference": "bench.decode",
    "greedy_of_record": "bench.decode",
    "import_checkpoint": "store.importer",
    "inside_rig": "bench.rig",
    "is_converted_from": "store.gguf_import",
    "is_store": "store.manifest",
    "load_drives": "io.drives",
    "make_drafter": "store.drafter",
    "measure_routing": "store.upkeep",
    "moefy": "store.moefy",
    "open_model": "runtime",
    "place_store": "store.upkeep",
    "prefill_bench": "bench.prefill",
    "probe_drive": "bench.probe",
    "read_manifest": "store.manifest",
    "with_drives": "moe.load",
    "record_best_depth": "speculative",
    "replicate_everywhere": "bench.layout",
    "require_free_space": "store.gguf_import",
    "require_proofs": "instruments.assertions:require",
    "resolve_device": "io.devices",
    "rig_command": "bench.rig",
    "rig_down": "bench.rig",
    "rig_limit": "bench.rig",
    "rig_status": "bench.rig",
    "rig_up": "bench.rig",
    "sha256_of": "store.gguf_import",
    "synthesize": "store.synth",
    "verify_store": "store.upkeep",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    """Import the module that defines `name` on first use, and keep the value here for the next."""
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attribute = target.partition(":")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), attribute or name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
