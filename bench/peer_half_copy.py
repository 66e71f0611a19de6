"""A float16 copy of an HF safetensors checkpoint, for the peers that read HF safetensors (fastllm computes in
float16 by default: from a float32 source it reads twice the bytes per expert and converts each one it reads).

    python -m bench.peer_half_copy SRC_DIR OUT_DIR
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx


def main() -> None:
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    if out.exists():
        raise SystemExit(f"{out} exists; give a new directory")
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for path in sorted(src.iterdir()):
        if path.suffix == ".safetensors":
            tensors = mx.load(str(path))
            half = {k: v.astype(mx.float16) if v.dtype == mx.float32 else v for k, v in tensors.items()}
            mx.save_safetensors(str(staging / path.name), half, metadata={"format": "pt"})
        elif path.name == "config.json":
            config = json.loads(path.read_text())
            (staging / path.name).write_text(json.dumps({**config, "torch_dtype": "float16"}, indent=2))
        elif path.is_file():
            shutil.copy2(path, staging / path.name)
    staging.rename(out)


if __name__ == "__main__":
    main()
