"""nightshift's engine: open a model and generate (runtime.py; the contract in generation.py), the streaming
layer (moe/), the store (store/), drives and reads (io/), instruments, benchmark scenarios (bench/), the throttled
drive rig (rig/) and several hosts (distributed/).

No facade: callers import each name from the module that defines it, so the type checker and import-linter
see every import, and a light command imports only light modules (`errors`, `moe.settings`, `store.manifest`
and the like import no MLX; `nightshift --help` loads none of it). Which part may import which is the
import-linter contract in pyproject.toml ([tool.importlinter], run in CI).

This package's one job at import: put an OpenBLAS in front of MLX for whoever imports MLX first.
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
